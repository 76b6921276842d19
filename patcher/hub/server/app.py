"""``modelpatch hub serve``: a self-hosted hub speaking the part of the Hugging Face Hub HTTP API
that ``huggingface_hub`` uses to create repos, commit (Xet, or Git LFS ``basic`` transfer), list
and download files (over Xet or plain HTTP), and manage branches.

Public API: ``create_app(root)`` (a Starlette app) and ``serve(root, host, port)``.
Storage layout: ``storage.py``; token file format: ``tokens.py``.

Endpoints (``{type}`` is ``models`` or ``datasets``; ``[datasets/]`` prefixes dataset repos)::

    GET    /api/whoami-v2
    POST   /api/repos/create                     DELETE /api/repos/delete
    POST   /api/validate-yaml
    GET    /api/{type}/{repo}[/revision/{rev}]   (?blobs=true: sizes, blob ids, LFS sha256)
    GET    /api/{type}/{repo}/tree/{rev}[/{path}] (?recursive, ?expand, paginated with Link)
    POST   /api/{type}/{repo}/paths-info/{rev}
    GET    /api/{type}/{repo}/refs               GET /api/{type}/{repo}/commits/{rev}
    POST   /api/{type}/{repo}/branch/{branch}    DELETE /api/{type}/{repo}/branch/{branch}
    POST   /api/{type}/{repo}/tag/{rev}          DELETE /api/{type}/{repo}/tag/{tag}
    PUT    /api/{type}/{repo}/settings
    POST   /api/{type}/{repo}/preupload/{rev}    POST /api/{type}/{repo}/commit/{rev}
    POST   /api/{type}/{repo}/lfs-files/duplicate (cross-repo LFS copies: routes_copy.py)
    POST   /[datasets/]{repo}.git/info/lfs/objects/batch
    PUT    /[datasets/]{repo}.git/info/lfs/objects/upload/{oid}/{size}?expires=&sig=
    POST   /[datasets/]{repo}.git/info/lfs/objects/verify
    GET    /[datasets/]{repo}/resolve/{rev}/{path}   (and HEAD; Range requests; X-Xet-Hash)
    GET    /api/{type}/{repo}/xet-read-token/{rev}   GET /api/{type}/{repo}/xet-write-token/{rev}
    /cas/...                                      the Xet CAS API (routes_cas.py)

Routing works on the raw (still percent-encoded) path, because the client quotes revisions with
``safe=""``: a branch ``a/b`` arrives as ``a%2Fb`` and must stay one segment.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import unquote

from ...display import printable
from ...errors import HubError, InputError
from ...fsops import write_file

try:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise HubError("the embedded hub needs Starlette and uvicorn",
                   hint="pip install -e '.[hub]' in the modelpatch checkout") from exc

from ..request_errors import BadRequest, HubRequestError
from ..store.storage import Store
from . import routes_cas, routes_copy, routes_files, routes_repo, routes_upload, xet_auth
from .tokens import TokenTable
from .traffic import CountBytes, Traffic
from .web import Hub, UrlSigner, error_response, new_signing_key

log = logging.getLogger("modelpatch.hub")

Handler = Callable[[Hub, Request, dict[str, str]], Awaitable[Response]]

_REPO = r"(?P<ns>[^/]+)/(?P<name>[^/]+)"
_API = r"/api/(?P<kinds>models|datasets)/" + _REPO
_GIT = r"/(?:(?P<prefix>datasets)/)?(?P<ns>[^/]+)/(?P<name>[^/]+?)\.git/info/lfs/objects"
_SEG = r"[^/]+"

_ROUTES: list[tuple[frozenset[str], str, Handler]] = [
    ({"GET"}, r"/api/whoami-v2", routes_repo.whoami),
    ({"POST"}, r"/api/repos/create", routes_repo.create_repo),
    ({"DELETE"}, r"/api/repos/delete", routes_repo.delete_repo),
    ({"POST"}, r"/api/validate-yaml", routes_repo.validate_yaml),
    ({"GET"}, _API, routes_repo.repo_info),
    ({"GET"}, _API + rf"/revision/(?P<rev>{_SEG})", routes_repo.repo_info),
    ({"GET"}, _API + rf"/tree/(?P<rev>{_SEG})(?:/(?P<path>.*))?", routes_repo.list_tree),
    ({"POST"}, _API + rf"/paths-info/(?P<rev>{_SEG})", routes_repo.paths_info),
    ({"GET"}, _API + r"/refs", routes_repo.list_refs),
    ({"GET"}, _API + rf"/commits/(?P<rev>{_SEG})", routes_repo.list_commits),
    ({"POST"}, _API + rf"/branch/(?P<ref>{_SEG})", routes_repo.create_branch),
    ({"DELETE"}, _API + rf"/branch/(?P<ref>{_SEG})", routes_repo.delete_branch),
    ({"POST"}, _API + rf"/tag/(?P<ref>{_SEG})", routes_repo.create_tag),
    ({"DELETE"}, _API + rf"/tag/(?P<ref>{_SEG})", routes_repo.delete_tag),
    ({"PUT"}, _API + r"/settings", routes_repo.update_settings),
    ({"POST"}, _API + rf"/preupload/(?P<rev>{_SEG})", routes_upload.preupload),
    ({"POST"}, _API + rf"/commit/(?P<rev>{_SEG})", routes_upload.commit),
    ({"POST"}, _API + r"/lfs-files/duplicate", routes_copy.duplicate),
    ({"GET", "POST"}, _API + rf"/xet-(?:read|write)-token/(?P<rev>{_SEG})", xet_auth.xet_token),
    ({"POST"}, _GIT + r"/batch", routes_upload.lfs_batch),
    ({"PUT"}, _GIT + rf"/upload/(?P<oid>{_SEG})/(?P<size>{_SEG})", routes_upload.lfs_upload),
    ({"POST"}, _GIT + r"/verify", routes_upload.lfs_verify),
    ({"GET", "HEAD"}, r"/(?:(?P<prefix>datasets)/)?" + _REPO
     + rf"/resolve/(?P<rev>{_SEG})/(?P<path>.+)", routes_files.resolve),
    ({"POST"}, rf"/cas/v1/xorbs/default/(?P<xorb>{_SEG})", routes_cas.upload_xorb),
    ({"HEAD"}, rf"/cas/v1/xorbs/default/(?P<xorb>{_SEG})", routes_cas.head_xorb),
    ({"POST"}, r"/cas/v1/shards", routes_cas.upload_shard),
    ({"POST"}, r"/cas/v2/shards", routes_cas.upload_shard_stream),
    ({"GET"}, rf"/cas/v1/chunks/default(?:-merkledb)?/(?P<chunk>{_SEG})", routes_cas.dedupe_query),
    ({"HEAD"}, rf"/cas/v1/files/(?P<file>{_SEG})", routes_cas.head_file),
    ({"GET"}, rf"/cas/v[12]/reconstructions/(?P<file>{_SEG})", routes_cas.get_reconstruction),
    ({"POST"}, r"/cas/v1/reconstructions", routes_cas.batch_reconstruction),
    ({"GET"}, rf"/cas/xorbs/(?P<xorb>{_SEG})", routes_cas.read_xorb),
]
_COMPILED = [(methods, re.compile(pattern), handler) for methods, pattern, handler in _ROUTES]


def _params(m: re.Match[str]) -> dict[str, str]:
    groups = {k: unquote(v, errors="strict") for k, v in m.groupdict().items() if v is not None}
    if any("\0" in v for v in groups.values()):
        raise BadRequest("a NUL character in the URL path")
    out = {k: v for k, v in groups.items() if k not in ("ns", "name", "kinds", "prefix")}
    if "ns" in groups:
        out["repo_id"] = f"{groups['ns']}/{groups['name']}"
        out["kind"] = "dataset" if (groups.get("kinds") == "datasets"
                                    or groups.get("prefix") == "datasets") else "model"
    return out


async def _dispatch(request: Request) -> Response:
    hub: Hub = request.app.state.hub
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    path = raw.decode("latin-1").split("?", 1)[0]
    allowed: set[str] = set()
    for methods, rx, handler in _COMPILED:
        m = rx.fullmatch(path)
        if m is None:
            continue
        if request.method not in methods:
            allowed |= methods
            continue
        try:
            return await handler(hub, request, _params(m))
        except UnicodeDecodeError:
            return error_response(BadRequest("the URL path is not percent-encoded UTF-8"))
        except HubRequestError as err:
            return error_response(err)
        except ClientDisconnect:
            return Response(status_code=400)
        except Exception:
            log.exception("internal error on %s %s", request.method,
                          printable(request.url.path))
            return error_response(HubRequestError("internal server error", status=500))
    if allowed:
        return error_response(HubRequestError(f"method {request.method} not allowed", status=405,
                                              headers={"Allow": ", ".join(sorted(allowed))}))
    return error_response(HubRequestError(f"no such endpoint: {request.url.path}", status=404))


class _EveryMethod:
    """``_dispatch`` as an ASGI endpoint for every HTTP method (a plain function route would
    answer unknown methods itself, in plain text); ``_dispatch`` answers its own JSON 405s."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        response = await _dispatch(Request(scope, receive))
        await response(scope, receive, send)


class _AccessLog:
    """One log line per request: method, path (never the query: it carries upload signatures;
    never headers: they carry tokens), status, duration. Control characters a request put in
    its method or path are escaped, so no request can forge a line."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0
        start = time.monotonic()

        async def _send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        finally:
            log.info("%s %s %d %.0fms", printable(scope["method"]),
                     printable(scope["path"]), status,
                     (time.monotonic() - start) * 1000)


def _signing_key(root: Path) -> bytes:
    path = root / "secret.key"
    for _ in range(2):
        try:
            key = path.read_bytes()
            if len(key) >= 32:
                return key
            raise InputError("signing key is too short; delete it to make a new one", where=path)
        except FileNotFoundError:
            pass
        key = new_signing_key()
        try:
            write_file(path, key, mode=0o600)
        except FileExistsError:
            continue  # another process made it meanwhile: read theirs
        return key
    raise InputError("cannot create the signing key", where=path)


def create_app(root: Path, public_url: str | None = None) -> Starlette:
    """The hub as a Starlette app serving the repositories stored under ``root`` (created if
    missing). ``public_url``: the URL clients reach the hub at, for the URLs it hands out
    (default: the request's own). Raises InputError for an unusable root or a malformed
    ``tokens.json``."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise InputError("hub root is not a directory", where=root)
    try:
        store = Store(root)
        store.clean_tmp()
        key = _signing_key(root)
    except OSError as exc:
        raise InputError(f"cannot use hub root: {exc.strerror or exc}", where=root) from None
    tokens = TokenTable(root / "tokens.json")
    if len(tokens) == 0:
        log.warning("no tokens in %s: public repos are readable, nothing is writable",
                    root / "tokens.json")
    traffic = Traffic()
    app = Starlette(
        routes=[Route("/{path:path}", _EveryMethod())],
        middleware=[Middleware(_AccessLog), Middleware(CountBytes, traffic=traffic)],
    )
    app.state.traffic = traffic
    app.state.hub = Hub(store=store, tokens=tokens, signer=UrlSigner(key),
                        public_url=public_url.rstrip("/") if public_url else None)
    return app


def build_server(root: Path, host: str = "127.0.0.1", port: int = 8080, *,
                 log_level: str = "info",
                 public_url: str | None = None) -> tuple[Any, socket.socket]:
    """A uvicorn server for the hub and its bound listening socket (``port=0``: a free port,
    read it from ``sock.getsockname()``). Run it with ``server.run(sockets=[sock])``."""
    import uvicorn

    app = create_app(root, public_url=public_url)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:   # not an address, nor a name that resolves
        raise InputError(f"cannot listen on {host!r}: {getattr(exc, 'strerror', None) or exc}",
                         hint="--host takes an IP address or a resolvable host name") from None
    try:
        sock = socket.create_server((host, port))
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise HubError(f"cannot listen on {host}:{port}: {reason}",
                       hint="pick another port= or host=") from None
    # proxy_headers: a TLS proxy on 127.0.0.1 may set X-Forwarded-Proto, so that the upload URLs
    # handed to clients say https (uvicorn trusts only 127.0.0.1 for this by default).
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                            server_header=False)
    return uvicorn.Server(config), sock


def serve(root: Path, host: str = "127.0.0.1", port: int = 8080,
          public_url: str | None = None) -> None:
    """Serve the hub stored under ``root`` until interrupted (Ctrl-C / SIGTERM)."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s hub %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    server, sock = build_server(root, host, port, public_url=public_url)
    actual_host, actual_port = sock.getsockname()[:2]
    shown = f"[{actual_host}]" if ":" in actual_host else actual_host
    log.info("serving %s at http://%s:%d", Path(root).resolve(), shown, actual_port)
    if not ipaddress.ip_address(actual_host).is_loopback:
        log.warning("plain HTTP on a non-loopback address: tokens cross the network unencrypted; "
                    "put a TLS-terminating proxy in front")
    server.run(sockets=[sock])
