"""Upload side of the embedded hub, as ``HfApi.create_commit`` / ``upload_folder`` drive it:

1. ``POST /api/{type}s/{repo}/preupload/{rev}``: the server decides ``lfs`` or ``regular`` per
   file and returns the oid of the file already at that path (the client skips unchanged files).
2. ``POST /{repo}.git/info/lfs/objects/batch`` (Git LFS batch API, ``basic`` transfer): for each
   LFS object not yet in the repo, a signed upload URL and a verify URL. A client offering the
   ``xet`` transfer gets it: each missing object's upload action names the repo's Xet write-token
   route, and the bytes go through the CAS API.
3. ``PUT`` the signed URL: the body is streamed to a temp file, hashed, checked against the oid,
   renamed into the blob store. ``POST .../verify`` then confirms it.
4. ``POST /api/{type}s/{repo}/commit/{rev}``: an NDJSON stream of ``header``, ``file`` (base64
   content), ``lfsFile``, ``deletedFile`` and ``deletedFolder`` lines, applied as one commit.

With hf_xet installed, huggingface_hub skips steps 2-3: it uploads through the Xet CAS API
(``routes_cas.py``; a shard's files become LFS objects of the repo) and the commit's ``lfsFile``
lines then name them exactly as after an LFS upload. An object uploaded over LFS is chunked in the
background so that Xet clients can download it too (``store/xet_ingest.xetify_blob``).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any
from urllib.parse import quote

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..request_errors import BadRequest, PayloadTooLarge, RevisionNotFound
from ..store.commit_ops import Op
from ..store.git_objects import lfs_entry, regular_entry, upload_mode
from ..store.naming import REPO_KINDS, SHA256_HEX, check_path
from ..store.xet_ingest import ensure_xet_hash
from .web import (
    LIST_BODY_LIMIT,
    Hub,
    base_url,
    in_thread,
    json_list,
    ndjson_lines,
    parse_json,
    read_json_object,
    repo_url,
)

LFS_JSON = "application/vnd.git-lfs+json"
MAX_COMMIT_LINE = 64 * 1024 * 1024  # a regular file (< 10 MiB) base64-encoded fits easily
MAX_COMMIT_OPS = 100_000
UPLOAD_FLUSH_BYTES = 4 * 1024 * 1024


def _no_pull_requests(request: Request) -> None:
    if request.query_params.get("create_pr") not in (None, "", "0", "false", "False"):
        raise BadRequest("pull requests are not supported by this hub; commit to a branch")


async def preupload(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, _ = hub.writable_repo(request, p["kind"], p["repo_id"])
    _no_pull_requests(request)
    payload = await read_json_object(request, LIST_BODY_LIMIT)
    head = await in_thread(hub.store.resolve, meta, p["rev"])
    files = json_list(payload, "files")
    out = await in_thread(_upload_modes, files, head.tree)   # up to MAX_LIST_ITEMS of them
    return JSONResponse({"files": out, "commitOid": head.id})


def _upload_modes(files: list[Any], tree: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("path"), str):
            raise BadRequest("each file needs a 'path'")
        path, size = check_path(f["path"]), f.get("size")
        if not isinstance(size, int) or size < 0:
            raise BadRequest(f"{path}: 'size' must be a non-negative integer")
        try:
            sample = base64.b64decode(f.get("sample") or "", validate=True)
        except (ValueError, TypeError):
            raise BadRequest(f"{path}: 'sample' is not base64") from None
        mode = upload_mode(path, size, sample)
        existing = tree.get(path)
        oid = None  # what the client compares with its local oid to skip unchanged files
        if existing is not None and existing["lfs"] == (mode == "lfs"):
            oid = existing["sha256"] if existing["lfs"] else existing["git_oid"]
        out.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": oid})
    return out


def _lfs_error(oid: Any, size: Any, code: int, message: str) -> dict[str, Any]:
    return {"oid": str(oid), "size": size if isinstance(size, int) else 0,
            "error": {"code": code, "message": message}}


async def lfs_batch(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    kind, repo_id = p["kind"], p["repo_id"]
    meta, _ = hub.writable_repo(request, kind, repo_id)
    payload = await read_json_object(request, LIST_BODY_LIMIT)
    if payload.get("operation") != "upload":
        raise BadRequest("only the 'upload' operation is supported (download via /resolve)")
    transfers = payload.get("transfers") or ["basic"]
    if not isinstance(transfers, list) or not {"basic", "xet"} & set(map(str, transfers)):
        raise BadRequest("only the 'xet' and 'basic' transfers are supported")
    if payload.get("hash_algo", "sha256") != "sha256":
        raise BadRequest("only sha256 object ids are supported")
    objects = json_list(payload, "objects")
    base = repo_url(request, kind, repo_id) + ".git/info/lfs/objects"
    out = await in_thread(_lfs_actions, hub, meta, kind, repo_id, objects, base)  # stats
    transfer = "xet" if "xet" in transfers else "basic"
    if transfer == "xet":
        # a Xet client uploads through the CAS API with a token from the write-token route
        ref = payload.get("ref")
        name = ref.get("name") if isinstance(ref, dict) else None
        revision = quote(name if isinstance(name, str) and name else "main", safe="")
        token_url = f"{base_url(request)}/api/{REPO_KINDS[kind]}/{repo_id}/xet-write-token/" \
                    f"{revision}"
        for obj in out:
            if "actions" in obj:
                obj["actions"] = {"upload": {"href": token_url}}
    return JSONResponse({"transfer": transfer, "objects": out, "hash_algo": "sha256"},
                        media_type=LFS_JSON)


def _lfs_actions(hub: Hub, meta: Any, kind: str, repo_id: str, objects: list[Any],
                 base: str) -> list[dict[str, Any]]:
    out = []
    for obj in objects:
        oid, size = (obj.get("oid"), obj.get("size")) if isinstance(obj, dict) else (None, None)
        if not isinstance(oid, str) or not SHA256_HEX.fullmatch(oid):
            out.append(_lfs_error(oid, size, 422, "oid must be 64 lowercase hex digits"))
        elif not isinstance(size, int) or size < 0:
            out.append(_lfs_error(oid, size, 422, "size must be a non-negative integer"))
        elif hub.store.has_lfs_object(meta, oid) and hub.store.blob_size(oid) == size:
            out.append({"oid": oid, "size": size})  # already there: no actions, no upload
        else:
            query = hub.upload_query(kind, repo_id, oid, size)
            out.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                "upload": {"href": f"{base}/upload/{oid}/{size}?{query}"},
                "verify": {"href": f"{base}/verify"},
            }})
    return out


async def lfs_upload(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    """PUT of one LFS object to its signed URL, streamed to disk and checked against the oid."""
    kind, repo_id, oid = p["kind"], p["repo_id"], p["oid"]
    if not SHA256_HEX.fullmatch(oid) or not p["size"].isdigit():
        raise BadRequest("malformed upload URL")
    size = int(p["size"])
    hub.check_upload(request, kind, repo_id, oid, size)
    meta = hub.store.get_repo(kind, repo_id)
    if meta is None:
        raise BadRequest(f"repository {repo_id} no longer exists")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) != size:
        raise BadRequest(f"Content-Length {declared} does not match the object size {size}")
    writer = await in_thread(hub.store.blob_writer)
    loop = asyncio.get_running_loop()
    in_flight: asyncio.Future[None] | None = None  # one write runs while the next is read
    try:
        pending: list[bytes] = []
        pending_bytes = received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > size:
                raise BadRequest(f"upload is larger than the declared {size} bytes")
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= UPLOAD_FLUSH_BYTES:
                if in_flight is not None:
                    await in_flight
                in_flight = loop.run_in_executor(None, writer.write, b"".join(pending))
                pending, pending_bytes = [], 0
        if in_flight is not None:
            await in_flight
        if pending:
            await in_thread(writer.write, b"".join(pending))
        await in_thread(writer.commit, oid, size)
    except ClientDisconnect:
        return Response(status_code=400)  # nobody is listening; the temp file is gone below
    finally:
        # Removes the temp file unless committed; after a write still running in its thread.
        if in_flight is not None and not in_flight.done():
            in_flight.add_done_callback(lambda _: writer.abort())
        else:
            writer.abort()
    hub.store.add_lfs_object(meta, oid)
    # the Xet side of the object (small ones now, large ones in the background), so that a Xet
    # client downloads it through the CAS API and deduplicates its next upload against it
    await in_thread(ensure_xet_hash, hub.store, meta, oid, size)
    return JSONResponse({})


async def lfs_verify(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, _ = hub.writable_repo(request, p["kind"], p["repo_id"])
    payload = await read_json_object(request)
    oid, size = payload.get("oid"), payload.get("size")
    if not isinstance(oid, str) or not SHA256_HEX.fullmatch(oid):
        raise BadRequest("expected a sha256 'oid'")
    stored = hub.store.blob_size(oid)
    if not hub.store.has_lfs_object(meta, oid) or stored is None:
        raise BadRequest(f"LFS object {oid} was not uploaded to {meta.id}", status=404)
    if isinstance(size, int) and size != stored:
        raise BadRequest(f"LFS object {oid} has {stored} bytes, not {size}", status=422)
    return JSONResponse({})


async def commit(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    kind, repo_id, branch = p["kind"], p["repo_id"], p["rev"]
    meta, who = hub.writable_repo(request, kind, repo_id)
    _no_pull_requests(request)
    if branch not in hub.store.refs(meta)["branches"]:
        raise RevisionNotFound(f"Invalid rev id: {branch}")
    header: dict[str, Any] | None = None
    ops: list[Op] = []
    async for line in ndjson_lines(request, MAX_COMMIT_LINE):
        if len(ops) >= MAX_COMMIT_OPS:
            raise PayloadTooLarge(f"at most {MAX_COMMIT_OPS} files per commit")
        item = await in_thread(parse_json, line) if len(line) > 64 * 1024 else parse_json(line)
        try:
            key, value = item["key"], item["value"]
        except (KeyError, TypeError, IndexError):
            raise BadRequest("each commit line must be a JSON object with 'key' and 'value'") \
                from None
        if not isinstance(value, dict):
            raise BadRequest(f"'{key}' line: 'value' must be an object")
        if key == "header":
            header = value
            continue
        path = value.get("path")
        if not isinstance(path, str):
            raise BadRequest(f"'{key}' line without a 'path'")
        if key == "file":
            data = await in_thread(decode_content, value)
            sha = await in_thread(hub.store.put_bytes, data)
            ops.append(Op("add", check_path(path), regular_entry(sha, data)))
        elif key == "lfsFile":
            ops.append(Op("add", check_path(path), _lfs_line(hub, meta, path, value)))
        elif key == "deletedFile":
            ops.append(Op("delete_file", path))
        elif key == "deletedFolder":
            ops.append(Op("delete_folder", path))
        else:
            raise BadRequest(f"unknown commit line key {key!r}")
    if header is None:
        raise BadRequest("the commit has no 'header' line")
    summary, description = header.get("summary"), header.get("description") or ""
    parent = header.get("parentCommit")
    if not isinstance(summary, str) or not isinstance(description, str) or not (
            parent is None or isinstance(parent, str)):
        raise BadRequest("header: 'summary', 'description', 'parentCommit' must be strings")
    new = await in_thread(hub.store.commit, meta, branch, ops, message=summary,
                          description=description, author=who.user, parent_commit=parent)
    return JSONResponse({"success": True, "commitOid": new.id,
                         "commitUrl": f"{repo_url(request, kind, repo_id)}/commit/{new.id}",
                         "commitMessage": summary, "hookOutput": "", "pullRequestUrl": None})


def _lfs_line(hub: Hub, meta: Any, path: str, value: dict[str, Any]) -> dict[str, Any]:
    oid, size = value.get("oid"), value.get("size")
    if value.get("algo", "sha256") != "sha256" or not isinstance(oid, str) \
            or not SHA256_HEX.fullmatch(oid):
        raise BadRequest(f"{path}: lfsFile needs a sha256 'oid'")
    stored = hub.store.blob_size(oid)
    if stored is None or not hub.store.has_lfs_object(meta, oid):
        raise BadRequest(f"{path}: LFS object {oid} was not uploaded to this repository")
    if size is not None and size != stored:
        raise BadRequest(f"{path}: LFS object {oid} has {stored} bytes, not {size}")
    return lfs_entry(oid, stored)


def decode_content(value: dict[str, Any]) -> bytes:
    """The bytes of a ``file`` line of a commit (base64, or plain text with ``utf-8``)."""
    content = value.get("content")
    encoding = value.get("encoding", "base64")
    if not isinstance(content, str):
        raise BadRequest("commit file line without a string 'content'")
    if encoding == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except ValueError:
            raise BadRequest(f"invalid base64 content for {value.get('path')!r}") from None
    if encoding == "utf-8":
        return content.encode("utf-8")
    raise BadRequest(f"unsupported content encoding {encoding!r}")
