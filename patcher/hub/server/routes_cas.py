"""The CAS API of the embedded hub (hub-docs ``docs/xet/api.md``), under ``/cas``::

    POST /cas/v1/xorbs/default/{xorb}            upload a xorb (write token)
    HEAD /cas/v1/xorbs/default/{xorb}            does the hub hold it (for this token)?
    POST /cas/v1/shards                          register the files of a shard (write token)
    POST /cas/v2/shards                          the same, progress streamed as NDJSON
    GET  /cas/v1/chunks/default[-merkledb]/{chunk}  global dedupe: a shard of xorbs holding it
    HEAD /cas/v1/files/{file}                    a file's size
    GET  /cas/v1/reconstructions/{file}          how to rebuild a file (or a Range of it)
    GET  /cas/v2/reconstructions/{file}          the same, in the v2 shape
    POST /cas/v1/reconstructions                 several files at once (v1 shape)
    GET  /cas/xorbs/{xorb}?r=&e=&s=              xorb bytes, by a URL a reconstruction signed

Every call but the last needs a Xet token (``xet_auth.py``) and sees only its repo: a file is
found only if it is an LFS object of that repo; a xorb is usable, and shows in a dedupe answer,
only if it was uploaded to or is used by a repo the token's user can read. Everything uploaded is
checked: a xorb's chunks are decoded and its hash recomputed, a shard's files are rebuilt from
their chunks and must hash as they claim (``store/xet_ingest.py``). Malformed input is a 400 in
one line; bodies are capped (413)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...display import printable
from ...errors import XetFormatError
from ..request_errors import BadRequest, Forbidden, HubRequestError, NotFound, RepoNotFound
from ..store.records import RepoMeta
from ..store.xet_ingest import register_file
from ..store.xet_store import checked_hex
from ..xet import hashing, shard
from ..xet.xorb import MAX_XORB_SIZE, parse_xorb, records_hash
from .cas_reconstruct import parse_range, reconstruction
from .web import LIST_BODY_LIMIT, Hub, in_thread, json_list, read_body, read_json
from .xet_auth import XetGrant, cas_url, request_grant

# a xorb may carry a client's metadata footer beyond its 64 MiB of chunks
MAX_XORB_BODY = MAX_XORB_SIZE + 4 * 1024 * 1024
MAX_XORB_CHUNKS = 65_536
MAX_SHARD_BODY = 64 * 1024 * 1024
MAX_SHARD_RECORDS = MAX_SHARD_BODY // shard.ENTRY_SIZE
MAX_FILE_SIZE = 1 << 40                 # one file a shard registers: 1 TiB
MAX_DEDUPE_XORBS = 32                   # xorbs one dedupe answer describes (~1.5 MiB)
DEDUPE_ANSWER_TTL_S = 7 * 24 * 3600
SHARD_HEARTBEAT_S = 5

log = logging.getLogger("modelpatch.hub")


def _grant_repo(hub: Hub, grant: XetGrant) -> RepoMeta:
    meta = hub.store.get_repo(grant.kind, grant.repo_id)
    if meta is None:
        raise RepoNotFound(f"Repository not found: {grant.repo_id}")
    return meta


def usable_xorb(hub: Hub, grant: XetGrant, xorb_hex: str) -> bool:
    """True if the xorb was uploaded to, or is used by, a repo the grant's user can read."""
    who = grant.identity
    for kind, repo_id in hub.store.xet.xorb_repos(xorb_hex):
        if (kind, repo_id) == (grant.kind, grant.repo_id):
            return True
        meta = hub.store.get_repo(kind, repo_id)
        if meta is not None and (not meta.private or (who.user and who.owns(meta.namespace))):
            return True
    return False


def _visible_file(hub: Hub, grant: XetGrant, file_hex: str) -> dict[str, Any]:
    checked_hex(file_hex, "file hash")
    record = hub.store.xet.file_record(file_hex)
    meta = hub.store.get_repo(grant.kind, grant.repo_id)
    if record is None or meta is None or not hub.store.has_lfs_object(meta, record["sha256"]):
        raise NotFound(f"file {file_hex} not found")
    return record


def _format_error(err: XetFormatError) -> BadRequest:
    return BadRequest(str(err).replace("\n", " "))


# -- uploads -----------------------------------------------------------------------------------


async def upload_xorb(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    grant = request_grant(hub, request, write=True)
    xorb_hex = checked_hex(p["xorb"], "xorb hash")
    meta = _grant_repo(hub, grant)
    body = await read_body(request, MAX_XORB_BODY)
    inserted = await in_thread(_store_xorb, hub, meta, xorb_hex, body)
    return JSONResponse({"was_inserted": inserted})


def _store_xorb(hub: Hub, meta: RepoMeta, xorb_hex: str, body: bytes) -> bool:
    xet = hub.store.xet
    try:
        existed = xet.has_xorb(xorb_hex)
        if existed:
            # the same proof as a first upload: the body must be this xorb
            actual = hashing.hash_to_hex(records_hash(parse_xorb(body, MAX_XORB_CHUNKS)))
            if actual != xorb_hex:
                raise XetFormatError(f"the xorb's chunks hash to {actual}, not {xorb_hex}")
            with contextlib.suppress(FileNotFoundError):   # fresh again for gc's grace period
                os.utime(xet.xorb_path(xorb_hex))
            inserted = False
        else:
            inserted = xet.put_xorb(xorb_hex, body, MAX_XORB_CHUNKS)
    except XetFormatError as err:
        raise _format_error(err) from None
    xet.mark_xorb(xorb_hex, meta.kind, meta.id)
    return inserted


async def head_xorb(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    grant = request_grant(hub, request)
    xorb_hex = checked_hex(p["xorb"], "xorb hash")
    size = hub.store.xet.xorb_size(xorb_hex)
    if size is None or not await in_thread(usable_xorb, hub, grant, xorb_hex):
        raise NotFound(f"xorb {xorb_hex} not found")
    return Response(headers={"Content-Length": str(size)})


async def upload_shard(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    grant = request_grant(hub, request, write=True)
    meta = _grant_repo(hub, grant)
    body = await read_body(request, MAX_SHARD_BODY)
    await in_thread(_register_shard, hub, grant, meta, body)
    return JSONResponse({"result": 1})


async def upload_shard_stream(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    """``POST /cas/v2/shards``: the same registration, its progress streamed as NDJSON events
    (a heartbeat every few seconds while a large file is rebuilt and hashed), ending in a
    ``result`` or an ``error`` event. Bad tokens and bodies are refused before the stream."""
    grant = request_grant(hub, request, write=True)
    meta = _grant_repo(hub, grant)
    body = await read_body(request, MAX_SHARD_BODY)

    async def events() -> AsyncIterator[bytes]:
        task = asyncio.ensure_future(in_thread(_register_shard, hub, grant, meta, body))
        progress = json.dumps({"type": "validating", "verified": 0, "total": 1}) + "\n"
        yield progress.encode()
        while not (await asyncio.wait({task}, timeout=SHARD_HEARTBEAT_S))[0]:
            yield progress.encode()
        try:
            task.result()
        except HubRequestError as err:
            yield (json.dumps({"type": "error", "message": printable(err.message)}) + "\n"
                   ).encode()
            return
        except Exception:
            log.exception("registering a shard failed")
            yield b'{"type": "error", "message": "internal server error"}\n'
            return
        yield b'{"type": "committing", "stage": "syncing"}\n'
        yield b'{"type": "result", "result": 1}\n'

    return StreamingResponse(events(), media_type="application/x-ndjson",
                             headers={"Cache-Control": "no-cache"})


def _register_shard(hub: Hub, grant: XetGrant, meta: RepoMeta, body: bytes) -> None:
    xet = hub.store.xet
    try:
        parsed = shard.parse_shard(body, MAX_SHARD_RECORDS)
        with xet.gc_lock(exclusive=False):
            for info in parsed.files:
                _, sha, xorbs = register_file(hub.store, info,
                                              lambda x: usable_xorb(hub, grant, x),
                                              MAX_FILE_SIZE)
                for xorb_hex in xorbs:
                    xet.mark_xorb(xorb_hex, meta.kind, meta.id)
                hub.store.add_lfs_object(meta, sha)
    except XetFormatError as err:
        raise _format_error(err) from None


# -- global dedupe -----------------------------------------------------------------------------


async def dedupe_query(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    grant = request_grant(hub, request)
    chunk_hex = checked_hex(p["chunk"], "chunk hash")
    data = await in_thread(_dedupe_shard, hub, grant, chunk_hex)
    if data is None:
        raise NotFound(f"chunk {chunk_hex} not found")
    return Response(data, media_type="application/octet-stream")


def _dedupe_shard(hub: Hub, grant: XetGrant, chunk_hex: str) -> bytes | None:
    xet = hub.store.xet
    found = [x for x in xet.chunk_xorbs(chunk_hex) if usable_xorb(hub, grant, x)]
    if not found:
        return None
    # the other xorbs of the files these belong to: a client re-uploading a changed file finds
    # all of its unchanged chunks in one answer (those without an indexed chunk too)
    for xorb_hex in list(found):
        for other in xet.sibling_xorbs(xorb_hex, MAX_DEDUPE_XORBS):
            if len(found) >= MAX_DEDUPE_XORBS:
                break
            if other not in found and usable_xorb(hub, grant, other):
                found.append(other)
    key = secrets.token_bytes(hashing.HASH_SIZE)
    xorbs = []
    for xorb_hex in found[:MAX_DEDUPE_XORBS]:
        records = xet.xorb_chunks(xorb_hex)
        chunks = tuple(shard.ChunkInfo(hashing.keyed_hash(r.hash, key), r.offset, r.size)
                       for r in records)
        xorbs.append(shard.XorbInfo(hashing.hex_to_hash(xorb_hex), chunks,
                                    sum(r.size for r in records), xet.xorb_size(xorb_hex) or 0))
    now = int(time.time())
    return shard.serialize_shard(shard.Shard([], xorbs, shard.ShardFooter(
        key, now, now + DEDUPE_ANSWER_TTL_S)))


# -- downloads ---------------------------------------------------------------------------------


async def head_file(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    grant = request_grant(hub, request)
    record = await in_thread(_visible_file, hub, grant, p["file"])
    return Response(headers={"Content-Length": str(record["size"])})


async def get_reconstruction(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    grant = request_grant(hub, request)
    version = 2 if request.url.path.startswith("/cas/v2/") else 1
    record = await in_thread(_visible_file, hub, grant, p["file"])
    want = parse_range(request.headers.get("range"), record["size"])
    if want is None and record["size"] == 0:
        return JSONResponse(reconstruction(hub, cas_url(hub, request), record, None, version))
    answer = await in_thread(reconstruction, hub, cas_url(hub, request), record, want, version)
    return JSONResponse(answer)


async def batch_reconstruction(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    grant = request_grant(hub, request)
    payload = await read_json(request, LIST_BODY_LIMIT)
    keys = json_list({"files": payload}, "files") if isinstance(payload, list) else None
    if keys is None:
        raise BadRequest("expected a JSON array of {\"prefix\", \"hash\"} keys")
    cas = cas_url(hub, request)
    files: dict[str, Any] = {}
    fetch_info: dict[str, list[Any]] = {}
    for key in keys:
        file_hex = key.get("hash") if isinstance(key, dict) else None
        if not isinstance(file_hex, str):
            raise BadRequest("each key needs a 'hash'")
        record = await in_thread(_visible_file, hub, grant, file_hex)
        answer = await in_thread(reconstruction, hub, cas, record, None, 1)
        files[file_hex] = answer["terms"]
        for xorb_hex, entries in answer["fetch_info"].items():
            fetch_info.setdefault(xorb_hex, []).extend(entries)
    return JSONResponse({"files": files, "fetch_info": fetch_info})


async def read_xorb(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    """Bytes of a xorb by a signed URL; the Range asked must lie inside the signed range."""
    xorb_hex = checked_hex(p["xorb"], "xorb hash")
    query = request.query_params
    rng, expires, sig = query.get("r", ""), query.get("e", ""), query.get("s", "")
    first, dash, last = rng.partition("-")
    if not (expires.isdigit() and sig and dash and first.isdigit() and last.isdigit()
            and hub.signer.check(sig, "xorb", xorb_hex, rng, expires)):
        raise Forbidden("invalid xorb URL signature")
    if int(expires) < time.time():
        raise Forbidden("the xorb URL has expired; ask for the reconstruction again")
    lo, hi = int(first), int(last)
    asked = request.headers.get("range")
    if asked is not None:
        unit, _, spec = asked.partition("=")
        a, dash, b = spec.partition("-")
        if unit.strip() != "bytes" or not (a.isdigit() and b.isdigit()) or \
                not lo <= int(a) <= int(b) <= hi:
            raise Forbidden("the Range asked is not the range this URL was signed for")
        lo, hi = int(a), int(b)
    data = await in_thread(_read_range, hub, xorb_hex, lo, hi)
    size = hub.store.xet.xorb_size(xorb_hex) or 0
    return Response(data, status_code=206 if asked is not None else 200,
                    media_type="application/octet-stream",
                    headers={"Content-Range": f"bytes {lo}-{hi}/{size}"})


def _read_range(hub: Hub, xorb_hex: str, lo: int, hi: int) -> bytes:
    try:
        data = hub.store.xet.read_xorb(xorb_hex, lo, hi)
    except (FileNotFoundError, XetFormatError):
        raise NotFound(f"xorb {xorb_hex} not found") from None
    if len(data) != hi - lo + 1:
        raise NotFound(f"xorb {xorb_hex} is shorter than the range")
    return data
