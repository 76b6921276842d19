"""Every answer of a hub is checked before huggingface_hub acts on it.

huggingface_hub turns what a hub says into local paths: a file listing's names become files of
a snapshot or a ``--local-dir``, the ``ETag`` (or ``X-Linked-Etag``) of a ``/resolve/`` answer
becomes ``blobs/<ETag>`` in the cache, and ``X-Repo-Commit`` becomes ``snapshots/<commit>`` and
``.no_exist/<commit>``. It does not check them. So the one HTTP client huggingface_hub uses in
this process (``set_client_factory``) is huggingface_hub's own, with two event hooks and a
network layer added:

- a ``/resolve/`` answer's ``X-Repo-Commit`` must be a 40-digit commit id, its ``X-Linked-Etag``
  (else its ``ETag``) a git sha1 or sha256, its ``Location`` a URL without control characters
  or ``..`` segments;
- the JSON answers of the hub's API (listing, paths-info, tree, preupload, commit, LFS batch)
  are read under the listing budget (``MODELPATCH_HUB_MAX_LISTING_BYTES``, uncompressed: they
  are asked for without compression, and one compressed anyway is refused), must be JSON where
  huggingface_hub parses them, and every file name, oid and commit id in them goes through
  ``patcher.names`` (a name may sit in a dot-directory here: those are refused where they
  matter, e.g. by ``pull``);
- inside ``within(deadline)`` every socket read and write of the calling thread, and every
  chunk of an answer, is refused once the deadline has passed (``MODELPATCH_HUB_DEADLINE``: a
  hub that drips a byte every few seconds cannot hold a command forever).

A refusal is an ``UnsafeName`` (exit 2) or a ``HubError`` (exit 3), one line, raised before
huggingface_hub has seen the answer.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from contextlib import contextmanager
from urllib.parse import urljoin, urlsplit

import httpx2

from ...errors import HubError, InputError
from ...names import checked_digest, checked_name

LISTING_ENV = "MODELPATCH_HUB_MAX_LISTING_BYTES"
DEADLINE_ENV = "MODELPATCH_HUB_DEADLINE"
#: The largest JSON answer read from a hub. A listing with file metadata is ~300 bytes a file:
#: 64 MiB is some 200,000 files, more than any model repository holds.
DEFAULT_LISTING_BYTES = 64 * 1024 * 1024
#: Seconds an ``hf://`` read (the listing, then every header and small file) may take in all.
DEFAULT_DEADLINE = 600.0

_FILE_ROUTE = re.compile(r"/resolve/|/api/resolve-cache/")
_API_ROUTE = re.compile(r"/api/|/info/lfs/objects/batch$")
_INFO = re.compile(r"/api/(models|datasets|spaces)/[^/]+(/[^/]+)?(/revision/.+)?$")
_LIST = re.compile(r"/api/(models|datasets|spaces)/.+/(paths-info|tree)/")
_LOCATION_OK = re.compile(r"[\x21-\x7e]+")
_local = threading.local()
_installed = False
_install_lock = threading.Lock()


def listing_budget() -> int:
    return _env_number(LISTING_ENV, DEFAULT_LISTING_BYTES, int)


def deadline_budget() -> float:
    return _env_number(DEADLINE_ENV, DEFAULT_DEADLINE, float)


def _env_number(name: str, default, kind):
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or value != value or value == float("inf"):
        raise InputError(f"{name}={text!r} is not a positive number")
    return value


def install() -> None:
    """Make huggingface_hub's HTTP client this process's checked one (once)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from huggingface_hub.utils import set_client_factory

        set_client_factory(_client_factory)
        _installed = True


def _client_factory():
    from huggingface_hub.utils._http import default_client_factory

    client = default_client_factory()
    hooks = client.event_hooks
    client.event_hooks = {"request": [*hooks.get("request", []), _on_request],
                          "response": [*hooks.get("response", []), _on_response]}
    _add_deadline_layer(client)
    return client


@contextmanager
def within(deadline: float):
    """Hub traffic of this thread must end by ``deadline`` (``time.monotonic()``)."""
    saved = getattr(_local, "deadline", None)
    _local.deadline = deadline if saved is None else min(saved, deadline)
    try:
        yield
    finally:
        _local.deadline = saved


def new_deadline() -> float:
    return time.monotonic() + deadline_budget()


def _remaining() -> float | None:
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise HubError(f"the hub did not answer within the {deadline_budget():g} s deadline for "
                       f"reading a repository", hint=f"raise it with {DEADLINE_ENV}=SECONDS")
    return left


def _clamped(timeout: float | None) -> float | None:
    left = _remaining()
    return left if timeout is None or (left is not None and left < timeout) else timeout


# ------------------------------------------------------------------ hooks


def _on_request(request) -> None:
    _remaining()
    kind = request.extensions.get("modelpatch_route")
    if kind is None:        # a redirect keeps the route of the request that started it
        path = request.url.path
        kind = "file" if _FILE_ROUTE.search(path) else "api" if _API_ROUTE.search(path) else ""
        request.extensions["modelpatch_route"] = kind
        request.extensions["modelpatch_path"] = path
    if kind == "api":
        request.headers["Accept-Encoding"] = "identity"


def _on_response(response) -> None:
    request = response.request
    if _FILE_ROUTE.search(request.url.path) or request.method == "HEAD":
        _check_file_headers(response)
    route = request.extensions.get("modelpatch_route")
    if route == "api":
        _read_api_answer(response, request.extensions.get("modelpatch_path", ""))
    elif getattr(_local, "deadline", None) is not None:
        response.stream = _Guarded(response.stream, None)


def _check_file_headers(response) -> None:
    """What huggingface_hub's file metadata takes from this answer (``get_hf_file_metadata``:
    the commit, the ETag of an answer it does not follow further, where it redirects)."""
    headers = response.headers
    commit = headers.get("X-Repo-Commit")
    if commit is not None:      # also on a 404: it names the cache's .no_exist/<commit>
        checked_digest(commit, what="the hub's X-Repo-Commit header", lengths=(40,))
    if response.status_code >= 400:
        return
    location = headers.get("Location")
    if location is not None:
        parts = urlsplit(location) if _LOCATION_OK.fullmatch(location) else None
        if (parts is None or parts.scheme.lower() not in ("", "http", "https")
                or ".." in parts.path.split("/")):
            raise HubError(f"the hub redirected to {location[:120]!r}: not an http(s) URL "
                           f"without '..' segments", hint="is the endpoint a hub?")
        target = urlsplit(urljoin(str(response.request.url), location))
        if 300 <= response.status_code < 400 and \
                target.netloc == response.request.url.netloc.decode("ascii", "replace"):
            return                   # followed on the same host: that answer is checked
    for name in ("X-Linked-Etag", "ETag"):
        value = headers.get(name)
        if value is not None:
            tag = value[2:] if value.startswith("W/") else value
            checked_digest(tag.strip('"'), what=f"the hub's {name} header")
            return


def _read_api_answer(response, path: str) -> None:
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise HubError(f"the hub compressed its answer to {path} ({encoding}) although asked "
                       f"not to: its size cannot be budgeted")
    response.stream = _Guarded(response.stream, listing_budget())
    if response.status_code >= 300:
        return                       # huggingface_hub reads the error body, within the budget
    response.read()
    method = response.request.method
    if method in ("GET", "POST") and (_INFO.search(path) or _LIST.search(path)):
        try:
            data = json.loads(response.content)
        except ValueError:
            raise HubError(f"the hub's answer to {path} is not JSON",
                           hint="is the endpoint a hub?") from None
        _check_listing(data)
    elif "json" in response.headers.get("Content-Type", ""):
        try:
            data = json.loads(response.content)
        except ValueError:
            return                   # huggingface_hub reports it
        _check_listing(data)


def _check_listing(data) -> None:
    """File names, oids and commit ids anywhere huggingface_hub takes them from an answer."""
    if isinstance(data, list):
        for entry in data:
            _check_entry(entry)
        return
    if not isinstance(data, dict):
        return
    if data.get("sha") is not None:
        checked_digest(data["sha"], what="the listing's commit id", lengths=(40,))
    if data.get("commitOid") is not None:
        checked_digest(data["commitOid"], what="the hub's commit id", lengths=(40,))
    for key in ("siblings", "files", "objects"):
        entries = data.get(key)
        if isinstance(entries, list):
            for entry in entries:
                _check_entry(entry)


def _check_entry(entry) -> None:
    if not isinstance(entry, dict):
        return
    for key in ("rfilename", "path"):
        if key in entry:
            checked_name(entry[key], what="the hub's file listing entry", allow_dot_dirs=True)
    for key in ("blobId", "oid"):
        if entry.get(key) is not None:
            checked_digest(entry[key], what=f"the hub's {key}")
    lfs = entry.get("lfs")
    if isinstance(lfs, dict):
        for key in ("sha256", "oid"):
            if lfs.get(key) is not None:
                checked_digest(lfs[key], what=f"the hub's LFS {key}", lengths=(64,))


class _Guarded(httpx2.SyncByteStream):
    """An answer's body, refused past ``limit`` bytes or past the thread's deadline."""

    def __init__(self, inner, limit: int | None):
        self._inner, self._limit, self._seen = inner, limit, 0

    def __iter__(self):
        for chunk in self._inner:
            _remaining()
            self._seen += len(chunk)
            if self._limit is not None and self._seen > self._limit:
                raise HubError(f"the hub's answer is larger than the listing budget of "
                               f"{self._limit} bytes",
                               hint=f"raise it with {LISTING_ENV}=BYTES")
            yield chunk

    def close(self) -> None:
        self._inner.close()


# ------------------------------------------------------------------ the network layer


def _add_deadline_layer(client) -> None:
    """Every socket read and write of the default transport checks the deadline, so a hub
    dripping its status line or headers is refused as well as one dripping its body."""
    import httpcore2

    transport = getattr(client, "_transport", None)
    if not isinstance(transport, httpx2.HTTPTransport) or \
            not isinstance(getattr(transport, "_pool", None), httpcore2.ConnectionPool):
        return
    transport._pool = httpcore2.ConnectionPool(
        ssl_context=httpx2.create_ssl_context(), http1=True, http2=False,
        max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0,
        network_backend=_DeadlineBackend(httpcore2))


class _DeadlineBackend:
    def __init__(self, httpcore2):
        self._inner = httpcore2.SyncBackend()
        self._timeouts = (httpcore2.ReadTimeout, httpcore2.WriteTimeout,
                          httpcore2.ConnectTimeout)

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _DeadlineStream(self, self._call(self._inner.connect_tcp, host, port,
                                                _clamped(timeout), local_address,
                                                socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _DeadlineStream(self, self._call(self._inner.connect_unix_socket, path,
                                                _clamped(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._timeouts:
            _remaining()             # the deadline's own refusal, not a retried timeout
            raise


class _DeadlineStream:
    def __init__(self, backend: _DeadlineBackend, inner):
        self._backend, self._inner = backend, inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._backend._call(self._inner.read, max_bytes, _clamped(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._backend._call(self._inner.write, buffer, _clamped(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _DeadlineStream(self._backend, self._backend._call(
            self._inner.start_tls, ssl_context, server_hostname, _clamped(timeout)))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)
