"""Talking to a hub with huggingface_hub: the endpoint and repo id checks made before any
request, the client, whether the hub offers Xet (``xet_offered``; an old hub that does not is
spoken to over Git LFS: ``lfs_only``), one call with its errors turned into one-line
``HubError``s, and huggingface_hub's output (its bars off, its log lines once).

The token comes from ``HF_TOKEN`` or huggingface_hub's login and is only ever handed to the
client: never printed, logged or written.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from contextlib import contextmanager
from urllib.parse import urlparse

from ...errors import HubError, InputError
from ...model_ref import REPO_ID_HINT, check_repo_id  # noqa: F401  (the hub's names too)

XET_HEADERS = ("X-Xet-Cas-Url", "X-Xet-Access-Token", "X-Xet-Token-Expiration")


def check_endpoint(endpoint: str | None) -> str | None:
    """``endpoint``, else ``$HF_ENDPOINT`` (None when neither is set), if it is an http(s) URL
    with a host; otherwise an ``InputError`` naming it (exit code 2), before any request."""
    value = endpoint if endpoint is not None else (os.environ.get("HF_ENDPOINT") or None)
    if value is None:
        return None
    try:
        parts = urlparse(value)
        ok = (parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
              and not any(c.isspace() or ord(c) < 32 for c in value))
        _ = parts.port                     # a bad port raises ValueError
    except ValueError:
        ok = False
    if not ok:
        shown = re.sub(r"//[^/?#]*@", "//***@", value)   # never print credentials in the URL
        raise InputError(f"hub endpoint {shown!r} is not an http:// or https:// URL",
                         hint="check --endpoint / HF_ENDPOINT, e.g. https://huggingface.co")
    return value.rstrip("/")


def client(endpoint: str | None):
    """An ``HfApi`` for ``endpoint`` (default ``$HF_ENDPOINT``, then huggingface.co). Xet is
    left as huggingface_hub decides it: downloads use it where the hub's answers name a Xet
    hash, uploads where ``xet_offered`` says the hub takes them. A malformed endpoint is an
    ``InputError``."""
    endpoint = check_endpoint(endpoint)
    from huggingface_hub import HfApi

    from .guard import install

    install()                 # every answer checked before huggingface_hub acts on it
    return HfApi(endpoint=endpoint)


def xet_offered(api, repo_id: str, revision: str | None, *, write: bool) -> bool:
    """Whether the hub hands out a Xet token for ``repo_id`` (``hf_xet`` installed and not
    turned off by ``HF_HUB_DISABLE_XET``): a hub that refuses the token route, or answers
    without the token's headers, is an older hub that speaks Git LFS only."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session
    from huggingface_hub.utils._runtime import is_xet_available

    if not is_xet_available():
        return False
    kind = "write" if write else "read"
    url = f"{api.endpoint}/api/models/{repo_id}/xet-{kind}-token/{revision or 'main'}"
    try:
        response = get_session().get(url, headers=build_hf_headers(token=api.token),
                                     timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except (OSError, *_transport_errors()):
        return False
    cas = response.headers.get(XET_HEADERS[0], "")
    return (response.status_code == 200 and all(h in response.headers for h in XET_HEADERS)
            and urlparse(cas).scheme in ("http", "https"))


@contextmanager
def lfs_only(on: bool = True):
    """huggingface_hub uploads and downloads over Git LFS and plain HTTP inside the block
    (``on``): it would otherwise go through Xet, which an older hub refuses."""
    from huggingface_hub import constants

    saved = constants.HF_HUB_DISABLE_XET
    constants.HF_HUB_DISABLE_XET = saved or on
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = saved


def hub_call(what: str, repo_id: str, fn, *args, **kwargs):
    """Run a huggingface_hub call, turning its errors into one-line ``HubError``s (an argument
    its validators refuse: an ``InputError``)."""
    from huggingface_hub.errors import (
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return fn(*args, **kwargs)
    except LocalEntryNotFoundError as exc:
        # snapshot_download found neither the hub nor a cached copy: report why it could not
        # ask the hub (its own text is a paragraph of advice), as every other call does
        cause = exc.__cause__
        if cause is None or isinstance(cause, OfflineModeIsEnabled):
            raise HubError(f"{what}: not in the Hugging Face cache, and HF_HUB_OFFLINE forbids "
                           f"downloading it", where=repo_id) from None
        return hub_call(what, repo_id, _raise, cause, endpoint=_endpoint(fn, kwargs))
    except HFValidationError as exc:
        raise InputError(f"{what}: {str(exc).splitlines()[0] if str(exc) else 'invalid argument'}",
                         where=repo_id) from None
    except RepositoryNotFoundError:
        raise HubError(f"{what}: repository not found or not visible with this token",
                       where=repo_id, hint="check the name, the endpoint and HF_TOKEN") from None
    except RevisionNotFoundError:
        revision = kwargs.get("revision")
        raise InputError(f"{what}: revision {revision!r} not found in {repo_id}"
                         if revision else f"{what}: revision not found in {repo_id}",
                         hint="check the branch, tag or commit id") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        hint = _STATUS_HINTS.get(status)
        raise HubError(f"{what}: the hub answered HTTP {status}", where=repo_id,
                       hint=hint) from None
    except OSError as exc:
        raise HubError(f"{what}: {exc.strerror or exc}", where=repo_id) from None
    except _transport_errors() as exc:      # connection refused, DNS, TLS, timeouts
        raise HubError(f"{what}: cannot reach the hub at {_endpoint(fn, kwargs)} "
                       f"({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else 'no details'})",
                       where=repo_id, hint="check --endpoint / HF_ENDPOINT") from None


def _raise(exc: BaseException, endpoint: str | None = None):
    raise exc


def _endpoint(fn, kwargs: dict) -> str:
    """The hub a call talks to: its ``endpoint`` argument, its ``HfApi``'s, else
    huggingface_hub's default."""
    endpoint = kwargs.get("endpoint") or getattr(getattr(fn, "__self__", None), "endpoint", None)
    if not endpoint:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    return str(endpoint).rstrip("/")


_STATUS_HINTS = {
    401: "check HF_TOKEN or `hf auth login` for this endpoint",
    403: "the token lacks the permission: check HF_TOKEN or `hf auth login` for this endpoint",
}


@contextmanager
def hub_output(progress: bool):
    """huggingface_hub's output for the block: its progress bars off (modelpatch draws its own,
    from the bytes it sees arrive: ``growth.py``; two sets of bars on one terminal overwrite
    each other and split the lines printed after them), unless ``HF_HUB_DISABLE_PROGRESS_BARS=0``
    asks for them; its log lines once, not again through the root logger, and with
    ``progress=False`` (``-q``) only its errors."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from huggingface_hub.utils import logging as hf_logging  # configures its logger on import

    hf_log = hf_logging.get_logger()
    saved = hf_log.level, hf_log.propagate
    hf_log.propagate = False
    if not progress:
        hf_log.setLevel(logging.ERROR)
    turn_off = not are_progress_bars_disabled()
    with warnings.catch_warnings():       # HF_HUB_DISABLE_PROGRESS_BARS=0 wins: say nothing
        warnings.simplefilter("ignore")
        if turn_off:
            disable_progress_bars()
    try:
        yield
    finally:
        hf_log.setLevel(saved[0])
        hf_log.propagate = saved[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if turn_off:
                enable_progress_bars()


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The network error classes of the HTTP library huggingface_hub uses (httpx2, httpx or
    requests, whichever it imported); they are not OSErrors."""
    found = []
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"),
                         ("requests", "RequestException")):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)
