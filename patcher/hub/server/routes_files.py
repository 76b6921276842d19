"""File downloads of the embedded hub: ``GET``/``HEAD /[datasets/]{repo}/resolve/{rev}/{path}``.

What ``hf_hub_download`` reads from the HEAD answer (file_download.get_hf_file_metadata):
``X-Repo-Commit`` (required), ``X-Linked-Etag`` or ``ETag`` (the cache's blob name: sha256 for LFS
files, git blob sha1 otherwise), ``X-Linked-Size`` or ``Content-Length``. No redirect is made:
the file is served from this very URL, streamed from the blob store, with Range support.
A file uploaded over Xet has no blob: it is rebuilt from its xorbs as it is sent (one byte
range honoured). An LFS file also gets ``X-Xet-Hash`` and its token route
(``X-Xet-Refresh-Route`` and a ``Link: <...>; rel="xet-auth"``): with them a Xet client
downloads it through the CAS API.
"""

from __future__ import annotations

import os

from starlette.concurrency import iterate_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse

from ..request_errors import EntryNotFound, HubRequestError
from ..store.naming import check_path
from ..store.xet_ingest import ensure_xet_hash
from .web import Hub, in_thread
from .xet_auth import refresh_route


class BlobResponse(FileResponse):
    """A FileResponse reading 1 MiB at a time (the default 64 KiB costs a thread hop per read)."""

    chunk_size = 1024 * 1024


async def resolve(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    return await in_thread(_blob_response, hub, request, p)   # file reads and a stat


def _blob_response(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta = hub.readable_repo(request, p["kind"], p["repo_id"])
    commit = hub.store.resolve(meta, p["rev"])
    path = p["path"]
    entry = commit.tree.get(path)
    if entry is None:
        check_path(path)
        raise EntryNotFound(f"Entry not found: {path} at {p['rev']}",
                            headers={"X-Repo-Commit": commit.id})
    sha, size = entry["sha256"], entry["size"]
    blob = hub.store.blob_path(sha)
    try:
        st = os.stat(blob)
    except FileNotFoundError:
        st = None
    record = None
    if st is None and entry["lfs"]:      # uploaded over Xet: kept only as xorbs
        found = hub.store.xet.xet_hash_of(sha)
        record = hub.store.xet.file_record(found) if found else None
    if (st is None or st.st_size != size) and (record is None or record["size"] != size):
        raise HubRequestError(f"blob {sha} of {path} is missing or damaged in the store",
                              status=500)
    etag = sha if entry["lfs"] else entry["git_oid"]
    headers = {
        "ETag": f'"{etag}"',
        "X-Repo-Commit": commit.id,
        "Content-Length": str(size),
        "Accept-Ranges": "bytes",
        "Cache-Control": "private, max-age=0, must-revalidate",
    }
    if entry["lfs"]:
        headers["X-Linked-Etag"] = f'"{sha}"'
        headers["X-Linked-Size"] = str(size)
        xet_hash = ensure_xet_hash(hub.store, meta, sha, size)
        if xet_hash is not None:    # a Xet client downloads from the CAS API instead
            route = refresh_route(request, meta.kind, meta.id, commit.id)
            headers["X-Xet-Hash"] = xet_hash
            headers["X-Xet-Refresh-Route"] = route
            headers["Link"] = f'<{route}>; rel="xet-auth"'
    if record is not None:
        return _rebuilt_response(hub, request, record, headers)
    return BlobResponse(blob, headers=headers, stat_result=st,
                        media_type="application/octet-stream",
                        filename=path.rsplit("/", 1)[-1])


def _rebuilt_response(hub: Hub, request: Request, record: dict, headers: dict[str, str]
                      ) -> Response:
    """A file kept only as xorbs, rebuilt as it is sent; one ``bytes=a-b`` Range is honoured
    (another Range form gets the whole file, as HTTP allows)."""
    size = record["size"]
    first, last, status = 0, size - 1, 200
    asked = request.headers.get("range", "")
    unit, _, spec = asked.partition("=")
    a, dash, b = spec.strip().partition("-")
    if unit.strip().lower() == "bytes" and dash and a.isdigit() and (b.isdigit() or not b):
        first, last = int(a), min(int(b) if b else size - 1, size - 1)
        if first >= size or last < first:
            return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
        status = 206
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    headers["Content-Length"] = str(last - first + 1)
    if request.method == "HEAD" or size == 0:
        return Response(status_code=status, headers=headers,
                        media_type="application/octet-stream")
    return StreamingResponse(iterate_in_threadpool(hub.store.xet.iter_file(record, first, last)),
                             status_code=status, headers=headers,
                             media_type="application/octet-stream")
