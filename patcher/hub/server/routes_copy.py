"""Cross-repository LFS copies, as ``HfApi.create_commit`` drives them for a
``CommitOperationCopy(..., src_repo_id=..., src_repo_type=...)`` of an LFS file:

1. ``POST /api/{type}s/{src}/paths-info/{rev}``: the source file's LFS sha256 and its ``xetHash``
   (the client refuses to copy a file without one): its real Xet file hash, or, while a large
   blob is still being chunked, ``COPY_HANDLE_PREFIX`` + the sha256, which is not a 64-hex Xet
   hash, so no client takes it for one. Either names the file here.
2. ``POST /api/{type}s/{src}/lfs-files/duplicate`` with
   ``{"target": {"type", "name"}, "files": [{"xetHash", "sha256", "filename"}]}``: the endpoint
   lives on the *source* repo. The token must read the source (a private source it cannot read
   is a 404, as everywhere) and write the target. Each object must be committed in the source
   (some commit of it references the sha256; an upload never committed does not count). The
   answer lists ``failed`` objects with their ``error``; the client raises on any.
3. The commit's ``lfsFile`` line then names the sha256 in the target, as after an upload.

Blobs and xorbs are content-addressed and shared by all repos, so a duplicate writes only the
target's markers (its LFS object, its xorbs' users): no blob or xorb bytes are copied.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..request_errors import BadRequest
from ..store.naming import REPO_KINDS, SHA256_HEX
from ..store.records import RepoMeta
from ..store.storage import Store
from .web import LIST_BODY_LIMIT, Hub, in_thread, json_list, read_json_object, require_write

COPY_HANDLE_PREFIX = "modelpatch-lfs-sha256:"


def copy_handle(sha256: str) -> str:
    """The ``xetHash`` this hub gives an LFS file in paths-info while the file has no Xet hash
    yet: a handle for the duplicate endpoint, never mistaken for a real Xet hash."""
    return COPY_HANDLE_PREFIX + sha256


async def duplicate(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    who = hub.identity(request)
    source = hub.readable_repo(request, p["kind"], p["repo_id"], who)
    payload = await read_json_object(request, LIST_BODY_LIMIT)
    target = _target(hub, request, payload, who)
    files = json_list(payload, "files")
    failed = await in_thread(_duplicate_files, hub.store, source, target, files)
    done = len(files) - len(failed)
    return JSONResponse({"duplicated": done, "failed": failed})


def _target(hub: Hub, request: Request, payload: dict[str, Any], who: Any) -> RepoMeta:
    target = payload.get("target")
    if not isinstance(target, dict) or not isinstance(target.get("name"), str):
        raise BadRequest("'target' must be an object with a 'type' and a 'name'")
    kind = target.get("type", "model")
    if not isinstance(kind, str) or kind not in REPO_KINDS:
        raise BadRequest(f"unsupported target repo type {kind!r}")
    meta = hub.readable_repo(request, kind, target["name"], who)
    require_write(who, meta.namespace)
    return meta


def _duplicate_files(store: Store, source: RepoMeta, target: RepoMeta,
                     files: list[Any]) -> list[dict[str, str]]:
    committed = committed_lfs_objects(store, source)
    failed = []
    for item in files:
        sha = item.get("sha256") if isinstance(item, dict) else None
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            failed.append({"sha256": str(sha), "error": "'sha256' must be 64 lowercase hex digits"})
            continue
        handle = item.get("xetHash")
        if handle is not None and handle not in (copy_handle(sha), store.xet.xet_hash_of(sha)):
            failed.append({"sha256": sha, "error": "'xetHash' is not this file's Xet hash"})
        elif sha not in committed or store.blob_size(sha) is None:
            failed.append({"sha256": sha, "error": f"no committed LFS file of {source.id} "
                                                   f"has this sha256"})
        else:
            store.add_lfs_object(target, sha)
            found = store.xet.xet_hash_of(sha)
            for xorb_hex in store.xet.file_xorbs(found) if found else ():
                store.xet.mark_xorb(xorb_hex, target.kind, target.id)
    return failed


def committed_lfs_objects(store: Store, meta: RepoMeta) -> set[str]:
    """The sha256 of every LFS file some commit of ``meta`` holds: what a reader of the repo
    can download (any commit id resolves, reachable from a ref or not)."""
    found: set[str] = set()
    for path in (meta.dir / "commits").glob("*.json"):
        commit = store.read_commit(meta, path.stem)
        found.update(e["sha256"] for e in commit.tree.values() if e["lfs"])
    return found
