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
from .xet_terms import Fetch, Reconstruction, parse_reconstruction

log = logging.getLogger("modelpatch")


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


@dataclass(frozen=True)
class LocalChunk:
    path: Path
    offset: int
    size: int
    hash: bytes


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
        from ..xet.errors import XetFormatError
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


def local_chunks(path: Path) -> list[LocalChunk]:
    """``path`` cut into its content-defined chunks, each hashed."""
    from ..xet.chunking import iter_chunks
    from ..xet.hashing import chunk_hash

    out, offset = [], 0
    with open(path, "rb") as f:
        for data in iter_chunks(f):
            out.append(LocalChunk(path, offset, len(data), chunk_hash(data)))
            offset += len(data)
    return out


def file_hash_of(chunks: list[LocalChunk]) -> str:
    from ..xet.hashing import file_hash, hash_to_hex

    return hash_to_hex(file_hash([(c.hash, c.size) for c in chunks]))


def map_base(recon: Reconstruction, chunks: list[LocalChunk],
             what: str) -> dict[tuple[str, int], LocalChunk]:
    """(xorb, chunk index) -> the local chunk the base's reconstruction stores there."""
    mapped: dict[tuple[str, int], LocalChunk] = {}
    at = 0
    for term in recon.terms:
        run = chunks[at:at + term.end - term.start]
        at += term.end - term.start
        if len(run) != term.end - term.start or sum(c.size for c in run) != term.length:
            raise HubError(f"the hub's Xet reconstruction of {what} does not match its chunks "
                           f"on this machine", hint="the hub's storage may be corrupted")
        for index, chunk in enumerate(run, start=term.start):
            mapped.setdefault((term.xorb, index), chunk)
    if at != len(chunks):
        raise HubError(f"the hub's Xet reconstruction of {what} names {at} chunks, the file "
                       f"has {len(chunks)}", hint="the hub's storage may be corrupted")
    return mapped


def rebuild(dest: Path, recon: Reconstruction, local: dict[tuple[str, int], LocalChunk],
            cas: Cas, want: str, what: str, pulled: XetPulled) -> None:
    """Write the file ``recon`` describes at ``dest`` (new), from local chunks where every chunk
    of a term is mapped, else from the hub; its chunks must hash to ``want``, its Xet hash.
    Nothing is left at ``dest`` on any error."""
    from ..xet.hashing import file_hash, hash_to_hex

    hashes: list[tuple[bytes, int]] = []
    fetched: dict[Fetch, list[tuple[bytes, bytes]]] = {}
    files: dict[Path, object] = {}
    try:
        with open(dest, "xb") as out:
            for term in recon.terms:
                indices = range(term.start, term.end)
                if all((term.xorb, i) in local for i in indices):
                    got = [_local_bytes(local[(term.xorb, i)], files) for i in indices]
                    pulled.local_bytes += sum(len(data) for _, data in got)
                else:
                    fetch = recon.fetch_for(term)
                    if fetch not in fetched:
                        fetched.clear()        # one fetch entry in memory at a time
                        fetched[fetch] = cas.chunks(fetch, what)
                    got = fetched[fetch][term.start - fetch.start:term.end - fetch.start]
                    _check_mapped(got, term, local, what)
                if sum(len(data) for _, data in got) != term.length:
                    raise HubError(f"a term of the hub's Xet reconstruction of {what} unpacks "
                                   f"to another length than it says")
                for digest, data in got:
                    out.write(data)
                    hashes.append((digest, len(data)))
            out.flush()
            os.fsync(out.fileno())
        if hash_to_hex(file_hash(hashes)) != want:
            raise HubError(f"the chunks the hub named for {what} do not hash to its Xet hash",
                           hint="the hub's storage may be corrupted")
    except BaseException:
        try:
            os.unlink(dest)
        except FileNotFoundError:
            pass
        raise
    finally:
        for f in files.values():
            f.close()


def _check_mapped(got, term, local, what: str) -> None:
    """A downloaded chunk at an index the base's reconstruction mapped to a local chunk must
    be that chunk."""
    for i, (digest, _) in enumerate(got, start=term.start):
        mine = local.get((term.xorb, i))
        if mine is not None and mine.hash != digest:
            raise HubError(f"the hub's chunk {i} of xorb {term.xorb[:12]} for {what} is not "
                           f"the chunk its reconstruction of the base names",
                           hint="the hub's storage may be corrupted")


def _local_bytes(chunk: LocalChunk, files: dict) -> tuple[bytes, bytes]:
    """A local chunk's bytes, hashed again: the file may have changed since it was chunked."""
    from ..xet.hashing import chunk_hash

    f = files.get(chunk.path)
    if f is None:
        f = files[chunk.path] = open(chunk.path, "rb")
    f.seek(chunk.offset)
    data = f.read(chunk.size)
    digest = chunk_hash(data)
    if digest != chunk.hash:
        raise OperationFailed(f"{chunk.path} changed while pull read it", where=chunk.path)
    return digest, data
