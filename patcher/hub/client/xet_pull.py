"""``pull``'s Xet path: a variant's rewritten shards rebuilt from the base's chunks on this
machine, with only the chunks the base lacks downloaded.

A shard a recipe rewrote (kv-cache scales dropped, MTP layers stripped, tensors renamed) is
mostly the base shard's bytes at other offsets. Content-defined chunking cuts both at the same
places around those bytes, so most of the variant's chunks are the base's. For each such file:

1. the local base file (same path in the base, found in the Hugging Face cache or under
   ``--reuse`` by its sha256, ``reuse.find_local``) is cut into chunks and hashed here
   (``patcher.hub.xet``), which gives its Xet file hash;
2. the hub's reconstruction of that hash names, term by term, the xorb and chunk indices the
   base's chunks are stored as: walking it along the local chunks maps each (xorb, index) to
   bytes of the local file (each term's length must be its local chunks' sizes);
3. the hub's reconstruction of the variant's file (its Xet hash from ``paths-info``) is written
   term by term: a term whose chunks are all mapped is copied from the local file (each chunk
   hashed again as read), any other is downloaded (the fetch entry's byte range, once) and its
   chunks decoded and hashed;
4. the chunks' hashes must give the variant file's Xet hash (``file_hash``): a hub that names
   the wrong chunks or sends other bytes is refused in one line. ``pull`` then checks the
   file's sha256 against the hub's LFS digest and the provenance manifest, as for any file.

Anything this path cannot use (no Xet, no local base, a base the hub has no reconstruction of)
leaves the file to the ordinary download.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import HubError, OperationFailed
from .xet_terms import Fetch, Reconstruction, Term, parse_reconstruction

log = logging.getLogger("modelpatch")
#: Fetch entries (at most a 64 MiB xorb each) kept decoded while a file is written: terms of
#: the new chunks often take turns between two xorbs.
KEPT_FETCHES = 2


@dataclass
class XetPulled:
    """What the Xet path wrote: ``files`` ``{path: size}``; of their bytes, ``local_bytes``
    came from local chunks; ``received_bytes`` is what the hub sent (reconstructions and
    xorb ranges)."""

    files: dict[str, int] = field(default_factory=dict)
    local_bytes: int = 0
    received_bytes: int = 0

    @property
    def file_bytes(self) -> int:
        return sum(self.files.values())


class Cas:
    """The hub's Xet storage, as the read token of one repository reaches it."""

    def __init__(self, url: str, token: str, pulled: XetPulled):
        from huggingface_hub.utils import get_session

        self.url, self._auth = url.rstrip("/"), {"Authorization": f"Bearer {token}"}
        self._session, self._pulled = get_session(), pulled

    def reconstruction(self, file_hash: str, size: int, what: str) -> Reconstruction | None:
        """The reconstruction of the file with Xet hash ``file_hash``; None when the hub has
        none (404)."""
        from .guard import listing_budget

        url = f"{self.url}/v1/reconstructions/{file_hash}"
        with self._session.stream("GET", url, headers=self._auth) as response:
            if response.status_code == 404:
                return None
            if response.status_code != 200:
                raise HubError(f"the hub answered HTTP {response.status_code} to the Xet "
                               f"reconstruction of {what}")
            body = _read(response, listing_budget(), f"the Xet reconstruction of {what}")
        self._pulled.received_bytes += len(body)
        try:
            data = json.loads(body)
        except ValueError:
            raise HubError(f"the hub's Xet reconstruction of {what} is not JSON") from None
        return parse_reconstruction(data, size, what)

    def chunks(self, fetch: Fetch, what: str) -> list[tuple[bytes, bytes]]:
        """``(hash, bytes)`` of the chunks ``fetch`` covers, downloaded, decoded and hashed."""
        from ...errors import XetFormatError
        from ..xet.xorb import iter_xorb

        headers = dict(self._auth, Range=f"bytes={fetch.first}-{fetch.last}")
        with self._session.stream("GET", fetch.url, headers=headers) as response:
            if response.status_code not in (200, 206):
                raise HubError(f"the hub answered HTTP {response.status_code} to a xorb range "
                               f"of {what}")
            data = _read(response, fetch.size, f"a xorb range of {what}")
        self._pulled.received_bytes += len(data)
        if len(data) != fetch.size:
            raise HubError(f"the hub sent {len(data)} bytes of a {fetch.size}-byte xorb range "
                           f"of {what}")
        count = fetch.end - fetch.start
        try:
            out = [(record.hash, raw) for record, raw in iter_xorb(data, count)]
        except XetFormatError as exc:
            raise HubError(f"the hub's xorb data for {what} is refused: {exc}") from None
        if len(out) != count:
            raise HubError(f"the hub's xorb range for {what} holds {len(out)} chunks, not "
                           f"{count}")
        return out


def _read(response, limit: int, what: str) -> bytes:
    parts, seen = [], 0
    for part in response.iter_bytes():
        seen += len(part)
        if seen > limit:
            raise HubError(f"the hub's answer for {what} is larger than {limit} bytes")
        parts.append(part)
    return b"".join(parts)


def connect(api, repo_id: str, commit: str, pulled: XetPulled) -> Cas | None:
    """The hub's Xet storage for ``repo_id`` (a read token for ``commit``); None when the hub
    does not offer Xet."""
    from huggingface_hub.utils import build_hf_headers, get_session

    from .connection import XET_HEADERS, xet_offered

    if not xet_offered(api, repo_id, commit, write=False):
        return None
    url = f"{api.endpoint}/api/models/{repo_id}/xet-read-token/{commit}"
    response = get_session().get(url, headers=build_hf_headers(token=api.token))
    cas, token = (response.headers.get(h) for h in XET_HEADERS[:2])
    if response.status_code != 200 or not cas or not token:
        return None
    return Cas(cas, token, pulled)


def xet_file_hash(path: Path) -> str:
    """The Xet hash of a local file: ``hf_xet``'s hasher where installed (native code), else
    this package's chunker."""
    try:
        import hf_xet

        return hf_xet.hash_files([str(path)])[0].hash
    except (ImportError, AttributeError):
        pass
    from ..xet.chunking import iter_chunks
    from ..xet.hashing import chunk_hash, file_hash, hash_to_hex

    with open(path, "rb") as f:
        return hash_to_hex(file_hash([(chunk_hash(c), len(c)) for c in iter_chunks(f)]))


@dataclass
class _BaseTerm:
    """A term of the base's reconstruction, where its bytes are in the local base file, and
    the offsets known so far of its chunks (index -> byte offset in the file)."""

    start: int
    end: int
    offset: int
    length: int
    known: dict[int, int]


class LocalBase:
    """A local base file read through the hub's reconstruction of it: which bytes of the file
    chunk ``i`` of xorb ``X`` is.

    A term's first and last chunk boundaries are known from the terms' lengths; the others are
    found when needed by cutting the file's bytes into chunks from the nearest boundary known
    before them (``patcher.hub.xet.chunking``: the same cuts as the whole file's, since a cut
    depends only on the bytes since the previous one), so only the bytes around what the
    variant changed are chunked here."""

    def __init__(self, path: Path, recon: Reconstruction, what: str):
        self.path, self.what = path, what
        self.terms: dict[str, list[_BaseTerm]] = {}
        offset = 0
        for t in recon.terms:
            self.terms.setdefault(t.xorb, []).append(
                _BaseTerm(t.start, t.end, offset, t.length,
                          {t.start: offset, t.end: offset + t.length}))
            offset += t.length
        self._file = open(path, "rb")

    def close(self) -> None:
        self._file.close()

    def source(self, term: Term) -> int | None:
        """The offset in the local file of the bytes of ``term`` (a term of the variant), or
        None when no base term holds all its chunks."""
        for bt in self.terms.get(term.xorb, ()):
            if bt.start <= term.start and term.end <= bt.end:
                first = self._offset(bt, term.start)
                end = first + term.length
                if bt.known.setdefault(term.end, end) != end or end > bt.offset + bt.length:
                    raise HubError(f"the hub's Xet reconstructions of {self.what} and its base "
                                   f"disagree on the length of chunks {term.start}..{term.end} "
                                   f"of xorb {term.xorb[:12]}",
                                   hint="the hub's storage may be corrupted")
                return first
        return None

    def _offset(self, bt: _BaseTerm, index: int) -> int:
        if index in bt.known:
            return bt.known[index]
        from ..xet.chunking import iter_chunks

        anchor = max(i for i in bt.known if i < index)
        at = bt.known[anchor]
        self._file.seek(at)
        stream = _Window(self._file, bt.offset + bt.length - at)
        for i, data in enumerate(iter_chunks(stream, read_size=1 << 20), start=anchor + 1):
            at += len(data)
            bt.known.setdefault(i, at)
            if i == index:
                return at
        raise HubError(f"the hub's Xet reconstruction of {self.what}'s base names more chunks "
                       f"than its bytes on this machine hold", hint="the hub's storage may be "
                                                                    "corrupted")

    def read(self, offset: int, length: int) -> bytes:
        self._file.seek(offset)
        data = self._file.read(length)
        if len(data) != length:
            raise OperationFailed(f"{self.path} changed while pull read it", where=self.path)
        return data


class _Window:
    """The next ``left`` bytes of an open file, as a stream."""

    def __init__(self, f, left: int):
        self._f, self._left = f, left

    def read(self, n: int) -> bytes:
        data = self._f.read(min(n, self._left))
        self._left -= len(data)
        return data


def rebuild(dest: Path, recon: Reconstruction, base: LocalBase, cas: Cas, want: str,
            what: str, pulled: XetPulled) -> None:
    """Write the file ``recon`` describes at ``dest`` (new): each term the local base holds
    from its bytes, any other from the hub (its chunks decoded and hashed); the file written
    must have the Xet hash ``want``, which hashes every chunk, reused or received. Nothing is
    left at ``dest`` on any error."""
    fetched: dict[Fetch, list[tuple[bytes, bytes]]] = {}
    try:
        with open(dest, "xb") as out:
            for term in recon.terms:
                source = base.source(term)
                if source is not None:
                    out.write(base.read(source, term.length))
                    pulled.local_bytes += term.length
                    continue
                fetch = recon.fetch_for(term)
                if fetch not in fetched:
                    if len(fetched) >= KEPT_FETCHES:   # a few fetch entries in memory at once
                        del fetched[next(iter(fetched))]
                    fetched[fetch] = cas.chunks(fetch, what)
                got = fetched[fetch][term.start - fetch.start:term.end - fetch.start]
                if sum(len(data) for _, data in got) != term.length:
                    raise HubError(f"a term of the hub's Xet reconstruction of {what} unpacks "
                                   f"to another length than it says",
                                   hint="the hub's storage may be corrupted")
                for _, data in got:
                    out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if xet_file_hash(dest) != want:
            raise HubError(f"the chunks the hub named for {what} do not hash to its Xet hash",
                           hint="the hub's storage may be corrupted")
    except BaseException:
        try:
            os.unlink(dest)
        except FileNotFoundError:
            pass
        raise
