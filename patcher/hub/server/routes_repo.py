"""Repository API of the embedded hub: whoami, create/delete repos, repo info, file listings,
refs, branches, tags, commit history and settings. Response shapes follow what
``huggingface_hub.HfApi`` parses (``ModelInfo``, ``RepoFile``/``RepoFolder``, ``GitRefs``...).
"""

from __future__ import annotations

import hashlib
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..request_errors import BadRequest, EntryNotFound, PayloadTooLarge, Unauthorized
from ..store.git_objects import lfs_pointer
from ..store.naming import DEFAULT_BRANCH, REPO_KINDS, split_repo_id
from ..store.records import Commit, RepoMeta
from ..store.storage import Store
from ..store.xet_ingest import ensure_xet_hash
from .routes_copy import copy_handle
from .web import (
    INVALID_CREDENTIALS,
    LIST_BODY_LIMIT,
    Hub,
    in_thread,
    read_form_or_json,
    read_json_object,
    repo_url,
    require_write,
    truthy,
)

TREE_PAGE_SIZE = 1000
MAX_INFO_PATHS = 1000                   # huggingface_hub asks for at most 500 at a time
PATHS_INFO_BODY_LIMIT = 2 * 1024 * 1024


# -- rendering ---------------------------------------------------------------------------------


def file_entry(path: str, e: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "file", "path": path, "size": e["size"], "oid": e["git_oid"]}
    if e["lfs"]:
        out["lfs"] = {"oid": e["sha256"], "size": e["size"],
                      "pointerSize": len(lfs_pointer(e["sha256"], e["size"]))}
    return out


def folder_entry(path: str, tree: dict[str, dict[str, Any]]) -> dict[str, Any]:
    prefix = path + "/"
    h = hashlib.sha1()
    for p in sorted(p for p in tree if p.startswith(prefix)):
        h.update(f"{p}\0{tree[p]['git_oid']}\n".encode())
    return {"type": "directory", "path": path, "size": 0, "oid": h.hexdigest()}


def sibling(path: str, e: dict[str, Any], blobs: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"rfilename": path}
    if blobs:
        out.update(size=e["size"], blobId=e["git_oid"])
        if e["lfs"]:
            out["lfs"] = {"sha256": e["sha256"], "size": e["size"],
                          "pointerSize": len(lfs_pointer(e["sha256"], e["size"]))}
    return out


def last_commits(store: Store, meta: RepoMeta, head: Commit,
                 paths: list[str], folders: list[str]) -> dict[str, Commit]:
    """For each path (file or folder), the newest commit that changed it."""
    found: dict[str, Commit] = {}
    todo_files, todo_folders = set(paths), set(folders)

    def subtree(tree: dict[str, Any], folder: str) -> dict[str, Any]:
        return {p: v for p, v in tree.items() if p.startswith(folder + "/")}

    for commit in store.history(meta, head):
        if not (todo_files or todo_folders):
            break
        parent_tree = store.read_commit(meta, commit.parent).tree if commit.parent else {}
        for p in list(todo_files):
            if commit.tree.get(p) != parent_tree.get(p):
                found[p] = commit
                todo_files.discard(p)
        for f in list(todo_folders):
            if subtree(commit.tree, f) != subtree(parent_tree, f):
                found[f] = commit
                todo_folders.discard(f)
    return found


def _with_last_commit(entries: list[dict[str, Any]], store: Store, meta: RepoMeta,
                      commit: Commit) -> None:
    files = [e["path"] for e in entries if e["type"] == "file"]
    folders = [e["path"] for e in entries if e["type"] == "directory"]
    found = last_commits(store, meta, commit, files, folders)
    for e in entries:
        c = found.get(e["path"])
        if c is not None:
            e["lastCommit"] = {"id": c.id, "title": c.message, "date": c.time}


def repo_info_json(request: Request, meta: RepoMeta, commit: Commit, blobs: bool) -> dict[str, Any]:
    namespace = meta.namespace
    used = {e["sha256"]: e["size"] for e in commit.tree.values()}
    info: dict[str, Any] = {
        "_id": hashlib.sha1(f"{meta.kind}/{meta.id}".encode()).hexdigest()[:24],
        "id": meta.id, "author": namespace, "sha": commit.id, "lastModified": commit.time,
        "createdAt": meta.created_at, "private": meta.private, "gated": False,
        "disabled": False, "downloads": 0, "likes": 0, "tags": [],
        "siblings": [sibling(p, e, blobs) for p, e in sorted(commit.tree.items())],
        "usedStorage": sum(used.values()),
    }
    if meta.kind == "model":
        info["modelId"] = meta.id
    return info


# -- routes without a repo ---------------------------------------------------------------------


async def whoami(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    who = hub.identity(request)
    if who is None:
        raise Unauthorized(INVALID_CREDENTIALS)
    role = "write" if who.write else "read"
    return JSONResponse({
        "type": "user", "id": who.user, "name": who.user, "fullname": who.user,
        "orgs": [{"type": "org", "name": o, "roleInOrg": role} for o in who.orgs if o != "*"],
        "auth": {"type": "access_token",
                 "accessToken": {"displayName": "modelpatch hub token", "role": role}},
    })


def _repo_from_payload(payload: dict[str, Any], who_user: str | None) -> tuple[str, str]:
    kind = payload.get("type") or "model"
    if not isinstance(kind, str) or kind not in REPO_KINDS:
        raise BadRequest(f"unsupported repo type {kind!r} (this hub serves models and datasets)")
    name, org = payload.get("name"), payload.get("organization") or who_user
    if not isinstance(name, str) or not isinstance(org, str):
        raise BadRequest("expected 'name' (and 'organization') strings")
    repo_id = f"{org}/{name}"
    split_repo_id(repo_id)
    return kind, repo_id


async def create_repo(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    who = require_write(hub.identity(request), None)
    payload = await read_json_object(request)
    kind, repo_id = _repo_from_payload(payload, who.user)
    require_write(who, repo_id.split("/")[0])
    visibility = payload.get("visibility")
    private = visibility == "private" if visibility is not None else bool(payload.get("private"))
    url = repo_url(request, kind, repo_id)
    if hub.store.get_repo(kind, repo_id) is not None:
        return JSONResponse({"error": f"You already created this {kind} repo", "url": url},
                            status_code=409)
    await in_thread(hub.store.create_repo, kind, repo_id, private=private, author=who.user)
    return JSONResponse({"url": url, "name": repo_id, "id": repo_id})


async def delete_repo(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    who = hub.identity(request)
    payload = await read_json_object(request)
    kind, repo_id = _repo_from_payload(payload, who.user if who else None)
    meta = hub.readable_repo(request, kind, repo_id, who)
    require_write(who, meta.namespace)
    await in_thread(hub.store.delete_repo, meta)
    return JSONResponse({})


async def validate_yaml(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    # upload_folder/create_commit call this before committing a README.md. Card metadata is
    # not interpreted here, so there is nothing to reject.
    await read_json_object(request, LIST_BODY_LIMIT)
    return JSONResponse({"errors": [], "warnings": []})


# -- routes of a repo --------------------------------------------------------------------------


def _readable_commit(hub: Hub, request: Request, p: dict[str, str],
                     default_rev: str | None = None) -> tuple[RepoMeta, Commit]:
    """The repo (if readable) and the commit ``p["rev"]`` names: file reads, so callers run
    this off the event loop (``in_thread``)."""
    meta = hub.readable_repo(request, p["kind"], p["repo_id"])
    return meta, hub.store.resolve(meta, p.get("rev") or default_rev or DEFAULT_BRANCH)


async def repo_info(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    def render() -> dict[str, Any]:
        meta, commit = _readable_commit(hub, request, p)
        return repo_info_json(request, meta, commit, truthy(request.query_params.get("blobs")))

    return JSONResponse(await in_thread(render))


async def list_tree(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, commit = await in_thread(_readable_commit, hub, request, p)
    recursive = truthy(request.query_params.get("recursive"))
    entries = await in_thread(_tree_entries, commit, p, recursive)
    try:
        cursor = int(request.query_params.get("cursor", "0"))
        limit = min(int(request.query_params.get("limit", TREE_PAGE_SIZE)), TREE_PAGE_SIZE)
    except ValueError:
        raise BadRequest("cursor and limit must be integers") from None
    if cursor < 0:
        raise BadRequest("cursor must not be negative")
    page = entries[cursor:cursor + max(limit, 1)]
    await in_thread(_with_xet_hashes, page, hub.store)
    if truthy(request.query_params.get("expand")):
        await in_thread(_with_last_commit, page, hub.store, meta, commit)
    headers = {}
    if cursor + len(page) < len(entries):
        nxt = request.url.include_query_params(cursor=cursor + len(page), limit=limit)
        headers["Link"] = f'<{nxt}>; rel="next"'
    return JSONResponse(page, headers=headers)


def _with_xet_hashes(entries: list[dict[str, Any]], store: Store) -> None:
    """The Xet hash of each LFS file that has one (a Xet client then skips the HEAD call)."""
    for entry in entries:
        if "lfs" in entry:
            found = store.xet.xet_hash_of(entry["lfs"]["oid"])
            if found is not None:
                entry["xetHash"] = found


def _tree_entries(commit: Commit, p: dict[str, str], recursive: bool) -> list[dict[str, Any]]:
    base = p.get("path", "").strip("/")
    prefix = base + "/" if base else ""
    under = sorted(path for path in commit.tree if path.startswith(prefix))
    if base and not under:
        raise EntryNotFound(f"{base!r} is not a folder at {p['rev']}",
                            headers={"X-Repo-Commit": commit.id})
    files, folders = [], set()
    for path in under:
        parts = path[len(prefix):].split("/")
        if recursive:
            folders.update(prefix + "/".join(parts[:i]) for i in range(1, len(parts)))
            files.append(path)
        elif len(parts) == 1:
            files.append(path)
        else:
            folders.add(prefix + parts[0])
    return ([folder_entry(f, commit.tree) for f in sorted(folders)]
            + [file_entry(f, commit.tree[f]) for f in files])


async def paths_info(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    """At most MAX_INFO_PATHS paths in a body of at most PATHS_INFO_BODY_LIMIT bytes; every
    step that grows with the repo or the request runs off the event loop."""
    meta, commit = await in_thread(_readable_commit, hub, request, p)
    form = await read_form_or_json(request, PATHS_INFO_BODY_LIMIT, MAX_INFO_PATHS + 8)
    paths = form.get("paths", [])
    if len(paths) > MAX_INFO_PATHS:
        raise PayloadTooLarge(f"at most {MAX_INFO_PATHS} paths per request")
    out = await in_thread(_path_entries, hub.store, meta, commit.tree, paths)
    if truthy((form.get("expand") or ["false"])[0]):
        await in_thread(_with_last_commit, out, hub.store, meta, commit)
    return JSONResponse(out)


def _path_entries(store: Store, meta: RepoMeta, tree: dict[str, dict[str, Any]],
                  paths: list[str]) -> list[dict[str, Any]]:
    folders = {path.rsplit("/", i)[0] for path in tree for i in range(1, path.count("/") + 1)}
    out: list[dict[str, Any]] = []
    for path in dict.fromkeys(raw.strip("/") for raw in paths):
        if path in tree:
            out.append(file_entry(path, tree[path]))
            if tree[path]["lfs"]:      # what a cross-repo copy names it by (routes_copy)
                entry = tree[path]
                # never chunks here (a request may name 1,000 files): what is not chunked yet
                # is, in the background, and its copy handle names it meanwhile
                out[-1]["xetHash"] = (ensure_xet_hash(store, meta, entry["sha256"], entry["size"],
                                                      inline_max=-1)
                                      or copy_handle(entry["sha256"]))
        elif path in folders:
            out.append(folder_entry(path, tree))
    return out


async def list_refs(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta = await in_thread(hub.readable_repo, request, p["kind"], p["repo_id"])
    refs = await in_thread(hub.store.refs, meta)

    def items(kind: str, prefix: str) -> list[dict[str, str]]:
        return [{"name": n, "ref": f"{prefix}{n}", "targetCommit": c}
                for n, c in sorted(refs[kind].items())]

    return JSONResponse({"branches": items("branches", "refs/heads/"), "converts": [],
                         "tags": items("tags", "refs/tags/"), "pullRequests": []})


async def list_commits(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, head = await in_thread(_readable_commit, hub, request, p)
    commits = await in_thread(lambda: list(hub.store.history(meta, head)))
    return JSONResponse([{"id": c.id, "title": c.message, "message": c.description,
                          "authors": [{"user": c.author}], "date": c.time} for c in commits])


async def create_branch(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, _ = hub.writable_repo(request, p["kind"], p["repo_id"])
    payload = await read_json_object(request)
    start = payload.get("startingPoint") or DEFAULT_BRANCH
    if not isinstance(start, str):
        raise BadRequest("'startingPoint' must be a revision string")
    await in_thread(hub.store.create_ref, meta, "branches", p["ref"], start)
    return JSONResponse({})


async def delete_branch(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, _ = hub.writable_repo(request, p["kind"], p["repo_id"])
    await in_thread(hub.store.delete_ref, meta, "branches", p["ref"])
    return JSONResponse({})


async def create_tag(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, _ = hub.writable_repo(request, p["kind"], p["repo_id"])
    payload = await read_json_object(request)
    tag = payload.get("tag")
    if not isinstance(tag, str):
        raise BadRequest("expected a 'tag' string")
    await in_thread(hub.store.create_ref, meta, "tags", tag, p["ref"])
    return JSONResponse({})


async def delete_tag(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, _ = hub.writable_repo(request, p["kind"], p["repo_id"])
    await in_thread(hub.store.delete_ref, meta, "tags", p["ref"])
    return JSONResponse({})


async def update_settings(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    meta, _ = hub.writable_repo(request, p["kind"], p["repo_id"])
    payload = await read_json_object(request)
    if payload.get("gated") not in (None, False):
        raise BadRequest("gated repos are not supported by this hub")
    visibility = payload.get("visibility")
    if visibility is not None:
        if visibility not in ("private", "public"):
            raise BadRequest(f"unsupported visibility {visibility!r}")
        await in_thread(hub.store.set_private, meta, visibility == "private")
    elif "private" in payload:
        await in_thread(hub.store.set_private, meta, bool(payload["private"]))
    return JSONResponse({})
