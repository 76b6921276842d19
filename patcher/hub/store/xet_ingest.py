"""Files entering the hub's Xet storage, both ways:

- ``register_file``: a file of an uploaded shard. Every term must name a stored xorb the uploader
  may use, its chunk range must exist and unpack to the term's size, its verification hash (when
  given) must match, the chunks' hashes must give the file's Xet hash, and the file rebuilt from
  the chunks must have the sha256 the shard states. It is then the LFS object of that sha256,
  kept only as xorbs: plain HTTP downloads rebuild it (``XetStore.iter_file``), and commits and
  LFS copies see it through ``Store.blob_size``.
- ``xetify_blob``: an LFS blob given a Xet hash: chunked here and recorded as xorbs made from the
  blob itself (an index per xorb, no second copy of the bytes), so that Xet clients can download
  (and deduplicate against) what was uploaded over LFS.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import XetFormatError
from ..xet import hashing
from ..xet.chunking import iter_chunks
from ..xet.shard import FileInfo
from ..xet.xorb import HEADER_SIZE, ChunkRecord, records_hash
from .xet_store import XetStore, dedupe_eligible

# server-built xorbs stay under the protocol's 64 MiB with room for the chunk headers
XORB_RAW_TARGET = 60 * 1024 * 1024
_xetify_lock = threading.Lock()
_xetify_running: set[str] = set()


def _verified_terms(xet: XetStore, info: FileInfo, file_hex: str,
                    usable: Callable[[str], bool]) -> list[list[Any]]:
    terms, pairs = [], []
    for i, term in enumerate(info.terms):
        xorb_hex = hashing.hash_to_hex(term.xorb_hash)
        if not xet.has_xorb(xorb_hex) or not usable(xorb_hex):
            raise XetFormatError(f"file {file_hex}: term {i} names xorb {xorb_hex}, which this "
                                 f"hub does not have")
        records = xet.xorb_chunks(xorb_hex)
        if term.chunk_end > len(records):
            raise XetFormatError(f"file {file_hex}: term {i} names chunks [{term.chunk_start}, "
                                 f"{term.chunk_end}) of a xorb of {len(records)}")
        chunk_range = records[term.chunk_start:term.chunk_end]
        if sum(r.size for r in chunk_range) != term.size:
            raise XetFormatError(f"file {file_hex}: term {i} claims {term.size} bytes, its "
                                 f"chunks hold {sum(r.size for r in chunk_range)}")
        if info.verification is not None and info.verification[i] != \
                hashing.verification_hash(r.hash for r in chunk_range):
            raise XetFormatError(f"file {file_hex}: term {i}'s verification hash is wrong")
        pairs += [(r.hash, r.size) for r in chunk_range]
        terms.append([xorb_hex, term.chunk_start, term.chunk_end, term.size])
    if hashing.file_hash(pairs) != info.file_hash:
        raise XetFormatError(f"file {file_hex}: its chunks hash to "
                             f"{hashing.hash_to_hex(hashing.file_hash(pairs))}")
    return terms


def sha256_matches(claimed: bytes, digest: str) -> bool:
    """The shard's sha256 field holds the digest as a hash in Xet's word order (the string form
    of the field is the usual sha256 hex)."""
    return hashing.hash_to_hex(claimed) == digest


def register_file(store: Any, info: FileInfo, usable: Callable[[str], bool],
                  max_size: int) -> tuple[str, str, set[str]]:
    """Check one file of an uploaded shard and make it the LFS object of its sha256. Returns the
    file's Xet hash, its sha256 and the xorbs it uses. ``store`` is the hub's ``Store``."""
    xet: XetStore = store.xet
    file_hex = hashing.hash_to_hex(info.file_hash)
    if info.size > max_size:
        raise XetFormatError(f"file {file_hex} has {info.size} bytes; this hub takes files of "
                             f"at most {max_size}")
    terms = _verified_terms(xet, info, file_hex, usable)
    known = xet.file_record(file_hex)
    if known is not None:
        digest = known["sha256"]          # checked when it was first registered
    else:
        sha = hashlib.sha256()
        for chunk in xet.iter_file({"terms": terms}, 0, max(info.size - 1, 0)):
            sha.update(chunk)
        digest = sha.hexdigest()
    if info.sha256 is not None and not sha256_matches(info.sha256, digest):
        raise XetFormatError(f"file {file_hex}: its content has sha256 {digest}, not the "
                             f"{hashing.hash_to_hex(info.sha256)} the shard states")
    if known is None:
        xet.put_file_record(file_hex, {"size": info.size, "sha256": digest, "terms": terms})
        if terms:
            first = xet.xorb_chunks(terms[0][0])[terms[0][1]].hash
            xet.index_chunk(hashing.hash_to_hex(first), terms[0][0])
    if xet.xet_hash_of(digest) is None:
        xet.set_xet_hash(digest, file_hex)
    xet.link_file(file_hex, {t[0] for t in terms})
    return file_hex, digest, {t[0] for t in terms}


def blob_xorbs(chunks: Iterable[bytes]) -> Iterator[tuple[int, list[ChunkRecord]]]:
    """Chunks grouped into xorbs of about XORB_RAW_TARGET raw bytes: (the blob offset of the
    xorb's first chunk, records laid out as uncompressed chunks with their headers)."""
    records: list[ChunkRecord] = []
    base = offset = raw = 0
    for chunk in chunks:
        records.append(ChunkRecord(offset, len(chunk), len(chunk), hashing.chunk_hash(chunk)))
        offset += HEADER_SIZE + len(chunk)
        raw += len(chunk)
        if raw >= XORB_RAW_TARGET:
            yield base, records
            base += raw
            records, offset, raw = [], 0, 0
    if records:
        yield base, records


def xetify_blob(store: Any, sha256: str) -> str | None:
    """Give the LFS blob ``sha256`` a Xet reconstruction (chunked, packed into xorbs here);
    returns its Xet file hash (None when the blob is not stored)."""
    xet: XetStore = store.xet
    found = xet.xet_hash_of(sha256)
    if found is not None:
        return found
    path = store.blob_path(sha256)
    terms, pairs, size, digest = [], [], 0, hashlib.sha256()
    with xet.gc_lock(exclusive=False):
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return None
        with f:
            def counted(stream: Iterable[bytes]) -> Iterator[bytes]:
                nonlocal size
                for chunk in stream:
                    size += len(chunk)
                    digest.update(chunk)
                    yield chunk

            for base, records in blob_xorbs(counted(iter_chunks(f))):
                xorb_hex = hashing.hash_to_hex(records_hash(records))
                if not xet.has_xorb(xorb_hex):
                    xet.store_blob_xorb(xorb_hex, sha256, base, records)
                terms.append([xorb_hex, 0, len(records), sum(r.size for r in records)])
                pairs += [(r.hash, r.size) for r in records]
        if digest.hexdigest() != sha256:
            raise XetFormatError(f"blob {sha256} does not hash to its name")
        file_hex = hashing.hash_to_hex(hashing.file_hash(pairs))
        if xet.file_record(file_hex) is None:
            xet.put_file_record(file_hex, {"size": size, "sha256": sha256, "terms": terms})
        if pairs and not dedupe_eligible(pairs[0][0]):   # eligible ones are indexed already
            xet.index_chunk(hashing.hash_to_hex(pairs[0][0]), terms[0][0])
        xet.set_xet_hash(sha256, file_hex)
        xet.link_file(file_hex, {t[0] for t in terms})
    return file_hex


_background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xetify")


def xetify_in_background(store: Any, sha256: str) -> None:
    """``xetify_blob`` on the hub's one background worker (so that many large blobs never take
    every core at once), at most once at a time per blob."""
    with _xetify_lock:
        if sha256 in _xetify_running:
            return
        _xetify_running.add(sha256)

    def run() -> None:
        try:
            xetify_blob(store, sha256)
        except Exception:  # noqa: BLE001 - a later request retries; the blob itself is intact
            logging.getLogger("modelpatch.hub").exception("chunking blob %s failed", sha256)
        finally:
            with _xetify_lock:
                _xetify_running.discard(sha256)

    _background.submit(run)


# LFS blobs up to this size are chunked when first asked for; larger ones in the background (the
# answer then goes without a Xet hash, and the client downloads over plain HTTP meanwhile)
XETIFY_INLINE_MAX = 16 * 1024 * 1024


def ensure_xet_hash(store: Any, meta: Any, sha256: str, size: int,
                    inline_max: int = XETIFY_INLINE_MAX) -> str | None:
    """The Xet file hash of the LFS object ``sha256`` of repo ``meta``, chunking the blob now
    (up to ``inline_max`` bytes) or in the background when it has none yet; its xorbs are
    recorded as used by the repo (for the repo's dedupe answers)."""
    found = store.xet.xet_hash_of(sha256)
    if found is None:
        if size > inline_max:
            xetify_in_background(store, sha256)
            return None
        found = xetify_blob(store, sha256)
        if found is None:
            return None
    for xorb_hex in store.xet.file_xorbs(found):
        store.xet.mark_xorb(xorb_hex, meta.kind, meta.id)
    return found
