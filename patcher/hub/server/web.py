"""What every route of the embedded hub shares: the context (store, tokens, URL signer), access
checks, request-body readers and Hub-shaped JSON responses. Needs Starlette (``modelpatch[hub]``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from ...display import printable
from ..request_errors import (
    BadRequest,
    Forbidden,
    HubRequestError,
    PayloadTooLarge,
    RepoNotFound,
    Unauthorized,
)
from ..store.records import RepoMeta
from ..store.storage import Store
from .tokens import Identity, TokenTable

JSON_BODY_LIMIT = 1024 * 1024          # control requests: repo create/delete, refs, settings
LIST_BODY_LIMIT = 8 * 1024 * 1024      # preupload and LFS batch requests, validate-yaml
MAX_LIST_ITEMS = 10_000                # files of a preupload, objects of an LFS batch
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"  # the Hub's exact message


class UrlSigner:
    """HMAC signatures for the LFS upload URLs (the client PUTs to them without its token)."""

    def __init__(self, key: bytes):
        self._key = key

    def sign(self, *parts: str) -> str:
        return hmac.new(self._key, "\n".join(parts).encode(), hashlib.sha256).hexdigest()

    def check(self, signature: str, *parts: str) -> bool:
        return hmac.compare_digest(signature, self.sign(*parts))


@dataclass
class Hub:
    store: Store
    tokens: TokenTable
    signer: UrlSigner
    upload_url_ttl_s: int = 24 * 3600
    xet_token_ttl_s: int = 3600
    public_url: str | None = None       # ``hub serve --public-url``: the URL clients reach

    # -- identity and access ---------------------------------------------------------------

    def identity(self, request: Request) -> Identity | None:
        """The token's identity; None without an Authorization header; 401 for a bad token."""
        header = request.headers.get("authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized(INVALID_CREDENTIALS)
        found = self.tokens.lookup(token)
        if found is None:
            raise Unauthorized(INVALID_CREDENTIALS)
        return found

    def readable_repo(self, request: Request, kind: str, repo_id: str,
                      who: Identity | None = None) -> RepoMeta:
        """The repo if the request may read it. A private repo the caller cannot read looks
        exactly like a missing one (401 without a token, 404 with one), as on the Hub."""
        who = who if who is not None else self.identity(request)
        meta = self.store.get_repo(kind, repo_id)
        if meta is None or (meta.private and not (who is not None and who.owns(meta.namespace))):
            raise RepoNotFound(f"Repository not found: {repo_id}",
                               status=401 if who is None else 404)
        return meta

    def writable_repo(self, request: Request, kind: str, repo_id: str) -> tuple[RepoMeta, Identity]:
        who = self.identity(request)
        meta = self.readable_repo(request, kind, repo_id, who)
        return meta, require_write(who, meta.namespace)

    # -- signed upload URLs ----------------------------------------------------------------

    def upload_query(self, kind: str, repo_id: str, oid: str, size: int) -> str:
        expires = str(int(time.time()) + self.upload_url_ttl_s)
        sig = self.signer.sign("upload", kind, repo_id, oid, str(size), expires)
        return f"expires={expires}&sig={sig}"

    def check_upload(self, request: Request, kind: str, repo_id: str, oid: str, size: int) -> None:
        expires = request.query_params.get("expires", "")
        sig = request.query_params.get("sig", "")
        if not (expires.isdigit() and sig
                and self.signer.check(sig, "upload", kind, repo_id, oid, str(size), expires)):
            raise Forbidden("invalid upload URL signature")
        if int(expires) < time.time():
            raise Forbidden("upload URL expired; request a new one from the LFS batch endpoint")


def require_write(who: Identity | None, namespace: str | None) -> Identity:
    """``who`` if it holds a write token for ``namespace`` (None: any namespace)."""
    if who is None:
        raise Unauthorized("You must be authenticated with a write token to do this")
    if not who.write:
        raise Forbidden("your token is read-only")
    if namespace is not None and not who.owns(namespace):
        raise Forbidden(f"you cannot write to namespace {namespace!r}")
    return who


def new_signing_key() -> bytes:
    return secrets.token_bytes(32)


# -- responses ---------------------------------------------------------------------------------


def error_response(err: HubRequestError) -> JSONResponse:
    message = printable(err.message).strip()      # a header value: no edge spaces
    headers = {"X-Error-Message": message.encode("latin-1", "replace").decode("latin-1")}
    if err.code:
        headers["X-Error-Code"] = err.code
    headers.update(err.headers)
    return JSONResponse({"error": printable(err.message)}, status_code=err.status,
                        headers=headers)


def base_url(request: Request) -> str:
    """The URL the client reached us at (no trailing slash): hrefs we return must match it.
    ``hub serve --public-url`` overrides it (a proxy in front that rewrites the Host)."""
    public = getattr(request.app.state, "hub", None)
    if public is not None and public.public_url:
        return public.public_url.rstrip("/")
    return str(request.base_url).rstrip("/")


def repo_url(request: Request, kind: str, repo_id: str) -> str:
    prefix = "datasets/" if kind == "dataset" else ""
    return f"{base_url(request)}/{prefix}{repo_id}"


# -- request bodies ----------------------------------------------------------------------------


async def read_body(request: Request, limit: int = JSON_BODY_LIMIT) -> bytes:
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise PayloadTooLarge(f"request body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int = JSON_BODY_LIMIT) -> Any:
    body = await read_body(request, limit)
    if not body.strip():
        return {}
    return await in_thread(parse_json, body) if len(body) > 64 * 1024 else parse_json(body)


def parse_json(data: bytes) -> Any:
    """``data`` as JSON; 400 for invalid or too deeply nested JSON, and for a string holding a
    lone surrogate (``"\\ud800"``: valid JSON, not valid UTF-8, so no name, path, oid or
    revision of a repository can hold one, and it could not be written or answered)."""
    try:
        value = json.loads(data)
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("request body holds a lone surrogate (not valid UTF-8)") from None
    except (ValueError, RecursionError):
        raise BadRequest("request body is not valid JSON (or nested too deeply)") from None
    return value


async def read_json_object(request: Request, limit: int = JSON_BODY_LIMIT) -> dict[str, Any]:
    value = await read_json(request, limit)
    if not isinstance(value, dict):
        raise BadRequest("expected a JSON object")
    return value


def json_list(payload: dict[str, Any], key: str, limit: int = MAX_LIST_ITEMS) -> list[Any]:
    """``payload[key]``, a list of at most ``limit`` items (400 / 413 otherwise)."""
    value = payload.get(key)
    if not isinstance(value, list):
        raise BadRequest(f"expected a {key!r} list")
    if len(value) > limit:
        raise PayloadTooLarge(f"at most {limit} {key} per request")
    return value


async def read_form_or_json(request: Request, limit: int, max_fields: int
                            ) -> dict[str, list[str]]:
    """A urlencoded form (what ``get_paths_info`` sends) or a JSON object, as lists of values;
    at most ``limit`` bytes and ``max_fields`` values (413 beyond). Parsed off the event loop."""
    body = await read_body(request, limit)
    as_json = request.headers.get("content-type", "").startswith("application/json")
    return await in_thread(_parse_form, body, as_json, max_fields)


def _parse_form(body: bytes, as_json: bool, max_fields: int) -> dict[str, list[str]]:
    if as_json:
        value = parse_json(body or b"{}")
        if not isinstance(value, dict):
            raise BadRequest("expected a JSON object")
        form = {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in value.items()}
        if sum(len(v) for v in form.values()) > max_fields:
            raise PayloadTooLarge(f"at most {max_fields} values per request")
        return form
    try:
        return parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=max_fields)
    except UnicodeDecodeError:
        raise BadRequest("request body is not UTF-8") from None
    except ValueError:
        raise PayloadTooLarge(f"at most {max_fields} values per request") from None


async def ndjson_lines(request: Request, max_line: int) -> AsyncIterator[bytes]:
    """The non-empty lines of a streamed NDJSON body, never buffering more than one line."""
    buf = bytearray()
    async for chunk in request.stream():
        start = len(buf)
        buf += chunk
        while True:
            i = buf.find(b"\n", start)
            if i < 0:
                break
            line = bytes(buf[:i])
            del buf[:i + 1]
            start = 0
            if line.strip():
                yield line
        if len(buf) > max_line:
            raise PayloadTooLarge(f"a commit line is larger than {max_line} bytes")
    if bytes(buf).strip():
        yield bytes(buf)


def truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


async def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking store call (locks, fsync, hashing) off the event loop."""
    return await run_in_threadpool(fn, *args, **kwargs)
