"""Xet access tokens of the embedded hub, and the routes that hand them out::

    GET /api/{type}/{repo}/xet-read-token/{rev}     a read token (the repo must be readable)
    GET /api/{type}/{repo}/xet-write-token/{rev}    a write token (the repo must be writable)

The answer carries ``casUrl``, ``accessToken`` and ``exp`` both as JSON and as the
``X-Xet-Cas-Url`` / ``X-Xet-Access-Token`` / ``X-Xet-Token-Expiration`` headers huggingface_hub
reads. The CAS API is served by this hub itself under ``/cas`` of the URL the client reached (or
``hub serve --public-url``).

A token is ``xet1.<payload>.<signature>``: the payload (base64url JSON) names one repo, one access
level, the user and namespaces of the hub token it was issued for, and its expiry; the signature
is an HMAC with the hub's secret key. A token for one repo never opens another, a read token never
writes, and an expired or altered token is a 401."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..request_errors import Forbidden, Unauthorized
from ..store.naming import REPO_KINDS
from .tokens import Identity
from .web import Hub, base_url, in_thread

CAS_PREFIX = "/cas"
TOKEN_PREFIX = "xet1"
MAX_TOKEN_LENGTH = 4096


@dataclass(frozen=True)
class XetGrant:
    """What a valid Xet token allows: one repo, read or write, on behalf of one identity."""

    kind: str
    repo_id: str
    write: bool
    user: str
    orgs: tuple[str, ...]
    expires: int

    @property
    def identity(self) -> Identity:
        return Identity(user=self.user, write=self.write, orgs=self.orgs)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def issue_token(hub: Hub, grant: XetGrant) -> str:
    payload = _b64(json.dumps({"k": grant.kind, "r": grant.repo_id, "w": grant.write,
                               "u": grant.user, "o": list(grant.orgs), "e": grant.expires},
                              separators=(",", ":")).encode())
    return f"{TOKEN_PREFIX}.{payload}.{hub.signer.sign('xet-token', payload)}"


def parse_token(hub: Hub, token: str, now: float | None = None) -> XetGrant:
    """The grant of a token this hub signed; Unauthorized if it is not one or has expired."""
    parts = token.split(".")
    if len(token) > MAX_TOKEN_LENGTH or len(parts) != 3 or parts[0] != TOKEN_PREFIX \
            or not hub.signer.check(parts[2], "xet-token", parts[1]):
        raise Unauthorized("invalid Xet access token")
    try:
        doc = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        grant = XetGrant(kind=doc["k"], repo_id=doc["r"], write=bool(doc["w"]), user=doc["u"],
                         orgs=tuple(doc["o"]), expires=int(doc["e"]))
    except (ValueError, KeyError, TypeError):
        raise Unauthorized("invalid Xet access token") from None
    if grant.expires <= (time.time() if now is None else now):
        raise Unauthorized("the Xet access token has expired; request a new one")
    return grant


def request_grant(hub: Hub, request: Request, *, write: bool = False) -> XetGrant:
    """The grant of the request's bearer Xet token; 401 without a valid one, 403 for a read
    token where writing is asked."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("a Xet access token is required (Authorization: Bearer ...)")
    grant = parse_token(hub, token.strip())
    if write and not grant.write:
        raise Forbidden("this Xet token is read-only")
    return grant


def cas_url(hub: Hub, request: Request) -> str:
    return base_url(request) + CAS_PREFIX


async def xet_token(hub: Hub, request: Request, p: dict[str, str]) -> Response:
    write = "/xet-write-token/" in request.url.path
    kind, repo_id = p["kind"], p["repo_id"]
    if write:
        meta, who = hub.writable_repo(request, kind, repo_id)
    else:
        who = hub.identity(request)
        meta = hub.readable_repo(request, kind, repo_id, who)
        if p["rev"] != "None":
            await in_thread(hub.store.resolve, meta, p["rev"])   # 404 for an unknown revision
    expires = int(time.time()) + hub.xet_token_ttl_s
    grant = XetGrant(kind=kind, repo_id=meta.id, write=write,
                     user=who.user if who is not None else "",
                     orgs=who.orgs if who is not None else (), expires=expires)
    token, url = issue_token(hub, grant), cas_url(hub, request)
    headers = {"X-Xet-Cas-Url": url, "X-Xet-Access-Token": token,
               "X-Xet-Token-Expiration": str(expires)}
    return JSONResponse({"casUrl": url, "accessToken": token, "exp": expires}, headers=headers)


def refresh_route(request: Request, kind: str, repo_id: str, revision: str) -> str:
    """The URL a Xet client fetches read tokens from for a file of ``repo_id`` at ``revision``."""
    return f"{base_url(request)}/api/{REPO_KINDS[kind]}/{repo_id}/xet-read-token/{revision}"
