"""Xet storage of the embedded hub, under ``ROOT/xet/`` beside the LFS blob store::

    xorbs/ab/<xorb hash>          a xorb as uploaded (read-only), shared by every repo
    xorbs/ab/<xorb hash>.idx      its chunks: 48 bytes each (offset, stored size, size, hash)
    xorbs/ab/<xorb hash>.src      or, for a xorb the hub cut from an LFS blob: that blob and
                                  where in it the xorb starts; its bytes (uncompressed chunks)
                                  are made from the blob when read, so the blob is not stored twice
    files/ab/<file hash>.json     a file's reconstruction: {"size", "sha256", "terms"}
    sha256/ab/<sha256>            the Xet file hash of an LFS object (text)
    chunks/ab/<chunk hash>/<xorb> global dedupe index: xorbs holding an eligible chunk
    xorb-repos/ab/<xorb>/<key>    the repos a xorb was uploaded to or is used by (access checks)
    xorb-files/ab/<xorb>/<file>   the files a xorb holds chunks of (dedupe answers name their
                                  other xorbs too)
    gc.lock                       flock: shared while files register, exclusive while gc sweeps

Names are Xet hash strings (64 lowercase hex digits, checked here before any path is built).
A xorb's index is written before the xorb itself, and both through ``tmp/`` and a rename, so a
present xorb always has its index; ``gc`` removes the xorb first."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any, Iterator

from ...errors import XetFormatError
from ...fsops import replace_file
from ..request_errors import BadRequest
from ..xet import hashing
from ..xet.xorb import HEADER_SIZE, ChunkRecord, iter_xorb, read_chunks, records_hash

_INDEX = struct.Struct("<QII32s")
# a chunk's hash qualifies for the global dedupe index when its last 8 bytes, as a little-endian
# u64, are 0 modulo this (the protocol's rule; the first chunk of every file qualifies too)
DEDUPE_MODULUS = 1024


def checked_hex(value: str, what: str = "Xet hash") -> str:
    if not isinstance(value, str) or not hashing.is_hash_hex(value):
        raise BadRequest(f"malformed {what}: expected 64 lowercase hexadecimal digits")
    return value


def dedupe_eligible(raw_hash: bytes) -> bool:
    return int.from_bytes(raw_hash[24:32], "little") % DEDUPE_MODULUS == 0


def repo_key(kind: str, repo_id: str) -> str:
    return hashlib.sha256(f"{kind}/{repo_id}".encode()).hexdigest()[:40]


class XetStore:
    """Xorbs, file reconstructions and their indexes under ``root``; temp files in ``tmp``."""

    _CACHE_MAX = 256

    def __init__(self, root: Path, tmp: Path, blobs: Path):
        self.root = Path(root)
        self.tmp = tmp
        self.blobs = blobs
        for sub in ("xorbs", "files", "sha256", "chunks", "xorb-repos", "xorb-files"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._indexes: dict[str, list[ChunkRecord]] = {}

    def _path(self, section: str, hexhash: str, suffix: str = "") -> Path:
        checked_hex(hexhash)
        return self.root / section / hexhash[:2] / (hexhash + suffix)

    # -- the gc lock -----------------------------------------------------------------------

    @contextlib.contextmanager
    def gc_lock(self, exclusive: bool) -> Iterator[None]:
        """Shared while files register (their xorbs must not vanish meanwhile), exclusive while
        ``gc`` decides and deletes."""
        fd = os.open(self.root / "gc.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    # -- xorbs -----------------------------------------------------------------------------

    def xorb_path(self, hexhash: str) -> Path:
        return self._path("xorbs", hexhash)

    def xorb_size(self, hexhash: str) -> int | None:
        try:
            return self.xorb_path(hexhash).stat().st_size
        except FileNotFoundError:
            pass
        if not self._path("xorbs", hexhash, ".src").exists():
            return None
        try:
            return self.xorb_chunks(hexhash)[-1].end
        except (XetFormatError, IndexError):
            return None

    def has_xorb(self, hexhash: str) -> bool:
        return self.xorb_size(hexhash) is not None

    def xorb_chunks(self, hexhash: str) -> list[ChunkRecord]:
        """The chunks of a stored xorb (from its index); XetFormatError if it is not stored."""
        cached = self._indexes.get(hexhash)
        if cached is not None:
            return cached
        try:
            raw = self._path("xorbs", hexhash, ".idx").read_bytes()
        except FileNotFoundError:
            raise XetFormatError(f"xorb {hexhash} is not stored on this hub") from None
        records = [ChunkRecord(offset, stored, size, digest)
                   for offset, stored, size, digest in _INDEX.iter_unpack(raw)]
        if len(self._indexes) >= self._CACHE_MAX:
            self._indexes.clear()
        self._indexes[hexhash] = records
        return records

    def put_xorb(self, hexhash: str, data: bytes, max_chunks: int) -> bool:
        """Store an uploaded xorb after decoding every chunk and recomputing the xorb's hash
        from them; XetFormatError if it is malformed or its hash is not ``hexhash``. Returns
        False when it was already stored."""
        checked_hex(hexhash)
        if self.has_xorb(hexhash):
            return False
        records = [record for record, _ in iter_xorb(data, max_chunks)]
        if not records:
            raise XetFormatError("the xorb has no chunks")
        actual = hashing.hash_to_hex(records_hash(records))
        if actual != hexhash:
            raise XetFormatError(f"the xorb's chunks hash to {actual}, not {hexhash}")
        end = records[-1].end
        self.store_xorb(hexhash, data[:end], records)
        return True

    def store_xorb(self, hexhash: str, data: bytes, records: list[ChunkRecord]) -> None:
        """Write a xorb whose records are known good (checked, or built by this hub)."""
        index = b"".join(_INDEX.pack(r.offset, r.stored_size, r.size, r.hash) for r in records)
        path = self.xorb_path(hexhash)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(self._path("xorbs", hexhash, ".idx"), index, mode=0o444, tmp_dir=self.tmp,
                     prefix="xorb-")
        replace_file(path, data, mode=0o444, tmp_dir=self.tmp, prefix="xorb-")
        for record in records:
            if dedupe_eligible(record.hash):
                self.index_chunk(hashing.hash_to_hex(record.hash), hexhash)

    def store_blob_xorb(self, hexhash: str, sha256: str, base: int,
                        records: list[ChunkRecord]) -> None:
        """Record a xorb made of the uncompressed chunks of blob ``sha256`` from byte ``base``
        on (``records``: offsets as if each chunk had its 8-byte header before it)."""
        index = b"".join(_INDEX.pack(r.offset, r.stored_size, r.size, r.hash) for r in records)
        self._path("xorbs", hexhash).parent.mkdir(parents=True, exist_ok=True)
        replace_file(self._path("xorbs", hexhash, ".idx"), index, mode=0o444, tmp_dir=self.tmp,
                     prefix="xorb-")
        replace_file(self._path("xorbs", hexhash, ".src"),
                     json.dumps({"sha256": sha256, "offset": base}).encode(), mode=0o444,
                     tmp_dir=self.tmp, prefix="xorb-")
        for record in records:
            if dedupe_eligible(record.hash):
                self.index_chunk(hashing.hash_to_hex(record.hash), hexhash)

    def read_xorb(self, hexhash: str, first: int, last: int) -> bytes:
        """Bytes ``first..last`` (inclusive) of a stored xorb, as uploaded or made from its blob;
        FileNotFoundError if it is not stored."""
        try:
            with open(self.xorb_path(hexhash), "rb") as f:
                f.seek(first)
                return f.read(last - first + 1)
        except FileNotFoundError:
            pass
        source = json.loads(self._path("xorbs", hexhash, ".src").read_bytes())
        records = self.xorb_chunks(hexhash)
        parts, start = [], None
        with open(self.blobs / source["sha256"][:2] / source["sha256"], "rb") as blob:
            for i, r in enumerate(records):
                if r.end <= first or r.offset > last:
                    continue
                start = r.offset if start is None else start
                blob.seek(source["offset"] + r.offset - HEADER_SIZE * i)
                parts.append(bytes((0,)) + r.size.to_bytes(3, "little") + bytes((0,))
                             + r.size.to_bytes(3, "little") + blob.read(r.size))
        data = b"".join(parts)
        return data[first - (start or 0):last - (start or 0) + 1]

    def read_chunks(self, hexhash: str, start: int, end: int) -> list[bytes]:
        """The raw bytes of chunks ``[start, end)`` of a stored xorb."""
        records = self.xorb_chunks(hexhash)
        if not 0 <= start < end <= len(records):
            raise XetFormatError(f"chunks [{start}, {end}) are outside xorb {hexhash} "
                                 f"({len(records)} chunks)")
        wanted = records[start:end]
        data = self.read_xorb(hexhash, wanted[0].offset, wanted[-1].end - 1)
        return read_chunks(data, start, wanted)

    # -- which repos a xorb belongs to -----------------------------------------------------

    def mark_xorb(self, hexhash: str, kind: str, repo_id: str) -> None:
        """Record that ``hexhash`` was uploaded to, or is used by, the repo."""
        folder = self._path("xorb-repos", hexhash)
        marker = folder / repo_key(kind, repo_id)
        if marker.exists():
            return
        folder.mkdir(parents=True, exist_ok=True)
        replace_file(marker, f"{kind}\n{repo_id}\n".encode(), mode=0o444, tmp_dir=self.tmp,
                     prefix="mark-")

    def xorb_repos(self, hexhash: str) -> list[tuple[str, str]]:
        folder = self._path("xorb-repos", hexhash)
        out = []
        with contextlib.suppress(FileNotFoundError):
            for marker in folder.iterdir():
                kind, _, rest = marker.read_text().partition("\n")
                out.append((kind, rest.strip()))
        return out

    def link_file(self, file_hex: str, xorbs: set[str]) -> None:
        """Record that file ``file_hex`` is made of chunks of ``xorbs``."""
        for xorb_hex in xorbs:
            folder = self._path("xorb-files", xorb_hex)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / checked_hex(file_hex)).touch()

    def sibling_xorbs(self, xorb_hex: str, limit: int) -> list[str]:
        """Other xorbs of the files ``xorb_hex`` holds chunks of (at most ``limit``)."""
        out: list[str] = []
        with contextlib.suppress(FileNotFoundError):
            for entry in sorted(self._path("xorb-files", xorb_hex).iterdir()):
                for other in sorted(self.file_xorbs(entry.name) if hashing.is_hash_hex(
                        entry.name) else ()):
                    if other != xorb_hex and other not in out and self.has_xorb(other):
                        out.append(other)
                        if len(out) >= limit:
                            return out
        return out

    # -- global dedupe index ---------------------------------------------------------------

    def index_chunk(self, chunk_hex: str, xorb_hex: str) -> None:
        folder = self._path("chunks", chunk_hex)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / checked_hex(xorb_hex)).touch()

    def chunk_xorbs(self, chunk_hex: str) -> list[str]:
        """Stored xorbs holding the (dedupe-eligible) chunk ``chunk_hex``."""
        folder = self._path("chunks", chunk_hex)
        try:
            names = sorted(entry.name for entry in folder.iterdir())
        except FileNotFoundError:
            return []
        return [name for name in names if hashing.is_hash_hex(name) and self.has_xorb(name)]

    # -- files -----------------------------------------------------------------------------

    def file_record(self, file_hex: str) -> dict[str, Any] | None:
        """``{"size", "sha256", "terms": [[xorb, start, end, size], ...]}`` or None."""
        try:
            return json.loads(self._path("files", file_hex, ".json").read_bytes())
        except FileNotFoundError:
            return None

    def put_file_record(self, file_hex: str, record: dict[str, Any]) -> None:
        path = self._path("files", file_hex, ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(record, separators=(",", ":")).encode(), mode=0o444,
                     tmp_dir=self.tmp, prefix="xfile-")

    def set_xet_hash(self, sha256: str, file_hex: str) -> None:
        path = self._path("sha256", sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, checked_hex(file_hex).encode(), mode=0o444, tmp_dir=self.tmp,
                     prefix="xsha-")

    def xet_hash_of(self, sha256: str) -> str | None:
        """The Xet file hash of an LFS object, if the hub has its reconstruction."""
        try:
            found = self._path("sha256", sha256).read_text().strip()
        except FileNotFoundError:
            return None
        if not hashing.is_hash_hex(found) or self.file_record(found) is None:
            return None
        return found

    def iter_file(self, record: dict[str, Any], first: int, last: int,
                  batch_bytes: int = 8 * 1024 * 1024) -> Iterator[bytes]:
        """Bytes ``first..last`` (inclusive) of a file, rebuilt from its xorbs a batch of chunks
        (about ``batch_bytes``) at a time."""
        pos = 0
        for xorb_hex, start, end, size in record["terms"]:
            if pos + size <= first:
                pos += size
                continue
            records = self.xorb_chunks(xorb_hex)
            i = start
            while i < end and pos + records[i].size <= first:     # wholly before the range
                pos += records[i].size
                i += 1
            while i < end and pos <= last:
                j, got = i, 0
                while j < end and (got == 0 or got + records[j].size <= batch_bytes):
                    got += records[j].size
                    j += 1
                data = b"".join(self.read_chunks(xorb_hex, i, j))
                lo, hi = max(first - pos, 0), min(last - pos + 1, len(data))
                if lo < hi:
                    yield data[lo:hi]
                pos += len(data)
                i = j
            if pos > last:
                return

    def file_xorbs(self, file_hex: str) -> set[str]:
        record = self.file_record(file_hex)
        return {term[0] for term in record["terms"]} if record else set()

    # -- listing (gc) ----------------------------------------------------------------------

    def iter_hex(self, section: str, suffix: str = "") -> Iterator[tuple[str, Path]]:
        for sub in sorted((self.root / section).iterdir()):
            if not sub.is_dir():
                continue
            for entry in sub.iterdir():
                name = entry.name
                if suffix:
                    if not name.endswith(suffix):
                        continue
                    name = name[:-len(suffix)]
                elif "." in name:
                    continue
                if hashing.is_hash_hex(name):
                    yield name, entry

