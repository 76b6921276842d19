"""Errors the embedded hub answers requests with. Each carries the HTTP status and the Hub's
``X-Error-Code``, which ``huggingface_hub.utils._http.hf_raise_for_status`` maps to the client's
RepositoryNotFoundError / RevisionNotFoundError / EntryNotFoundError.

Their own hierarchy, apart from ``patcher.errors``: they become HTTP answers, never the command
line's exit codes, and the server turns any other exception into a 500."""

from __future__ import annotations


class HubRequestError(Exception):
    """A request the hub refuses. ``status`` is the HTTP status, ``code`` the X-Error-Code,
    ``headers`` extra response headers."""

    status = 400
    code: str | None = None

    def __init__(self, message: str, *, status: int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.headers = dict(headers or {})


class BadRequest(HubRequestError):
    status = 400


class Unauthorized(HubRequestError):
    status = 401


class Forbidden(HubRequestError):
    status = 403


class RepoNotFound(HubRequestError):
    status = 404
    code = "RepoNotFound"


class RevisionNotFound(HubRequestError):
    status = 404
    code = "RevisionNotFound"


class EntryNotFound(HubRequestError):
    status = 404
    code = "EntryNotFound"


class Conflict(HubRequestError):
    status = 409


class PreconditionFailed(HubRequestError):
    status = 412


class PayloadTooLarge(HubRequestError):
    status = 413


class NotFound(HubRequestError):
    """A Xet object (file, xorb, chunk) the token cannot see or the hub does not hold."""

    status = 404


class RangeNotSatisfiable(HubRequestError):
    status = 416
