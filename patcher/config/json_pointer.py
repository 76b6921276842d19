"""RFC 6901 JSON Pointers: validation, joining under a scope, and lookup. Splitting and escaping
are the ``jsonpointer`` package's (installed with jsonpatch); validation with a message for a
recipe author, scopes, and the strict lookup (``MISSING``, no end-of-list ``-``) are here.

Pointers are plain strings: ``""`` is the whole document, ``"/a/b"`` the member ``b`` of ``a``.
``~0`` and ``~1`` escape ``~`` and ``/`` inside a reference token. Array indices are ``0`` or a
decimal number without leading zeros; ``-`` names the element after the last one (only ``add``
and ``set`` can use it).
"""

from __future__ import annotations

import re
from typing import Any

from jsonpointer import JsonPointer, escape, unescape

_INDEX = re.compile(r"(?:0|[1-9][0-9]*)\Z")
_BAD_ESCAPE = re.compile(r"~(?![01])")

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>",
                                     "__bool__": lambda self: False})()
"""Sentinel: the pointer names nothing in the document."""


def pointer_error(pointer: object) -> str | None:
    """Why ``pointer`` is not an RFC 6901 JSON Pointer, or None if it is one."""
    if not isinstance(pointer, str):
        return f"a JSON pointer must be a string, not {type(pointer).__name__}"
    if pointer and not pointer.startswith("/"):
        return f"JSON pointer {pointer!r} must start with '/' (or be \"\" for the whole document)"
    if _BAD_ESCAPE.search(pointer):
        return f"JSON pointer {pointer!r} has '~' not followed by 0 or 1 (write '~0' for '~')"
    return None


def split_pointer(pointer: str) -> list[str]:
    """The unescaped reference tokens of a valid pointer (``[]`` for ``""``)."""
    return JsonPointer(pointer).parts


def escape_token(token: str) -> str:
    return escape(token)


def make_pointer(tokens: list[str] | tuple[str, ...]) -> str:
    return JsonPointer.from_parts(list(tokens)).path


def normalize_scope(scope: str) -> str:
    """A scope of ``in:``: ``/`` (and ``""``) is the document root, anything else a pointer."""
    return "" if scope in ("", "/") else scope


def join_pointer(scope: str, pointer: str) -> str:
    """``pointer`` read inside the value at ``scope``: ``join_pointer("/t", "/a") == "/t/a"``."""
    return normalize_scope(scope) + pointer


def parent_pointer(pointer: str) -> tuple[str, str]:
    """(parent pointer, last unescaped token) of a non-root pointer."""
    head, _, last = pointer.rpartition("/")
    return head, unescape(last)


def _step(value: Any, token: str) -> Any:
    if isinstance(value, dict):
        return value.get(token, MISSING)
    if isinstance(value, list):
        if _INDEX.match(token):
            index = int(token)
            if index < len(value):
                return value[index]
        return MISSING
    return MISSING


def resolve(doc: Any, pointer: str) -> Any:
    """The value ``pointer`` names in ``doc``, or ``MISSING``."""
    value = doc
    for token in split_pointer(pointer):
        value = _step(value, token)
        if value is MISSING:
            return MISSING
    return value


def deepest_existing(doc: Any, pointer: str) -> tuple[str, Any]:
    """The longest prefix of ``pointer`` that exists in ``doc``, with its value."""
    value = doc
    done: list[str] = []
    for token in split_pointer(pointer):
        nxt = _step(value, token)
        if nxt is MISSING:
            break
        done.append(token)
        value = nxt
    return make_pointer(done), value


def json_type(value: Any) -> str:
    """The JSON type name of a Python value (for messages)."""
    if value is MISSING:
        return "missing"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: ``true`` is not ``1``, ``1`` equals ``1.0``, order of keys is not
    significant, order of array items is."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return a is None and b is None
