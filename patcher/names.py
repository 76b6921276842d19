"""Names from outside: the one check every externally supplied name passes before it reaches a
filesystem call.

A hub's listing, an ETag, an LFS oid, a revision, a recipe's ``include:`` or ``from:`` path, a
rule file's field: each is a *name*, never a path the sender chooses. ``name_problem`` says why a
name is not a plain relative path inside the directory it will be joined to; ``checked_name``
raises ``UnsafeName`` (one line, exit 2) with that reason. Digests and revisions have their own
narrow shapes (``checked_digest``, ``checked_revision``).
"""

from __future__ import annotations

import re

from patcher.errors import UnsafeName

#: the longest name accepted: longer than any real repository path, short enough that a name
#: never becomes a cost of its own
MAX_NAME = 1024
#: the longest single path component most filesystems accept
MAX_COMPONENT = 255

_DRIVE = re.compile(r"[A-Za-z]:")
_HEX = {40: re.compile(r"[0-9a-f]{40}"), 64: re.compile(r"[0-9a-f]{64}")}
_REVISION = re.compile(r"[A-Za-z0-9._/\-]{1,200}")


def name_problem(name: object, *, allow_dot_dirs: bool = False) -> str | None:
    """Why ``name`` is not a normalized relative POSIX path that stays inside the directory it
    is joined to, or None. Dot-directories (``.git/``, ``.cache/``, ``.ssh/``...) and dot-names
    as a last component are refused unless ``allow_dot_dirs`` (a file like ``.gitattributes``
    is a last component and is always allowed)."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    if "\0" in name:
        return "has a NUL character"
    if any("\ud800" <= c <= "\udfff" for c in name):
        return "has a lone surrogate (not valid UTF-8)"
    if "\\" in name:
        return "has a backslash (names use '/')"
    if name.startswith("/") or _DRIVE.match(name):
        return "is an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "has a '..' component"
    if any(p in ("", ".") for p in parts):
        return "has an empty or '.' component"
    if any(len(p.encode("utf-8")) > MAX_COMPONENT for p in parts):
        return f"has a component longer than {MAX_COMPONENT} bytes"
    if not allow_dot_dirs and any(p.startswith(".") for p in parts[:-1]):
        return "is inside a dot-directory"
    return None


def checked_name(name: object, *, what: str, allow_dot_dirs: bool = False) -> str:
    """``name`` itself when ``name_problem`` finds nothing, else ``UnsafeName`` naming ``what``
    (e.g. "the hub's file listing entry")."""
    problem = name_problem(name, allow_dot_dirs=allow_dot_dirs)
    if problem is not None:
        raise UnsafeName(f"{what} {_shown(name)} {problem}; refused before any file was touched")
    return name  # type: ignore[return-value]


def checked_digest(value: object, *, what: str, lengths: tuple[int, ...] = (40, 64)) -> str:
    """A lowercase hex digest (git sha1: 40, sha256: 64) or ``UnsafeName``: an ETag or oid that
    names a blob file."""
    if isinstance(value, str) and any(n in _HEX and _HEX[n].fullmatch(value) for n in lengths):
        return value
    raise UnsafeName(f"{what} {_shown(value)} is not a hex digest of "
                     f"{' or '.join(str(n) for n in lengths)} characters")


def checked_revision(value: object, *, what: str = "revision") -> str:
    """A commit id, branch or tag name: letters, digits, ``._/-``, no ``..``, no leading or
    trailing ``/``, no dot-component; at most 200 characters."""
    if (isinstance(value, str) and _REVISION.fullmatch(value) and ".." not in value
            and not value.startswith("/") and not value.endswith("/")
            and not any(p.startswith(".") or not p for p in value.split("/"))):
        return value
    raise UnsafeName(f"{what} {_shown(value)} is not a commit id, branch or tag name")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
