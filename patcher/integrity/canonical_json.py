"""The canonical JSON of manifests and change logs, fast.

The bytes are exactly ``json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False,
allow_nan=False) + "\\n"`` in UTF-8 (``reference_canonical_json``). The standard library encodes
with ``indent`` in pure Python, through nested generators (its C encoder is used only without
``indent``): about 0.25 s per thousand change-log entries here, so an apply that changes the 273k
tensors of a Kimi-K2.5-sized checkpoint spent minutes in it. This encoder walks the value once,
appends pieces to one list and joins them, with the C string escaper of the standard library for
every string: the same bytes in about a sixth of the time.

Only plain JSON values take the fast path: ``dict`` with ``str`` keys, ``list`` and ``tuple`` of
exactly those types, and ``str``, ``int``, finite ``float`` (subclasses too, encoded as json
encodes them), ``bool`` and ``None``. Anything else (container subclasses, non-string keys, NaN
and infinities, values json cannot encode, cycles) is handed to the reference encoder, which then
produces its bytes or raises its ``ValueError``/``TypeError``.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring  # the C escaper where available, as json uses
from typing import Any

__all__ = ["EncodedArray", "canonical_json", "encode_array", "reference_canonical_json"]

_INF = float("inf")
_int_repr = int.__repr__
_float_repr = float.__repr__


class EncodedArray(list):
    """A JSON array that carries its own canonical text (``encode_array``), so that a document
    embedding it (the manifest embeds the change log, whose digest needs its text alone) does not
    encode it again: the text is re-indented to its depth instead (every newline of canonical
    JSON is structural: strings escape theirs). To the standard library it is a plain list, so
    the reference encoder gives the same bytes. It must not be changed after encoding."""

    text: str


def encode_array(items) -> tuple[EncodedArray, bytes]:
    """``items`` as an ``EncodedArray``, and its canonical JSON (``canonical_json``)."""
    array = EncodedArray(items)
    data = canonical_json(array)
    array.text = data[:-1].decode("utf-8")
    return array, data


class _NotPlain(Exception):
    """A value outside the fast path: the reference encoder decides."""


def reference_canonical_json(obj: Any) -> bytes:
    """The definition: the standard library's encoder with the manifest's settings."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
            + "\n").encode("utf-8")


def canonical_json(obj: Any) -> bytes:
    """``reference_canonical_json(obj)``, byte for byte, in linear time with small constants."""
    out: list[str] = []
    try:
        _value(obj, out, "\n")
    except (_NotPlain, RecursionError):
        return reference_canonical_json(obj)
    out.append("\n")
    return "".join(out).encode("utf-8")


def _scalar(o: Any) -> str:
    t = type(o)
    if t is str:
        return encode_basestring(o)
    if t is int:
        return _int_repr(o)
    if o is None:
        return "null"
    if o is True:
        return "true"
    if o is False:
        return "false"
    if isinstance(o, str):              # a subclass (torch.__version__): as json encodes it
        return encode_basestring(o)
    if isinstance(o, int):
        return _int_repr(o)
    if isinstance(o, float):
        if o != o or o == _INF or o == -_INF:
            raise _NotPlain
        return _float_repr(o)
    raise _NotPlain


def _value(o: Any, out: list[str], newline: str) -> None:
    """Append the encoding of ``o``, whose line starts after ``newline`` (``"\\n"`` plus the
    indentation of its level)."""
    t = type(o)
    if t is dict:
        _dict(o, out, newline)
    elif t is list or t is tuple or t is EncodedArray:
        _list(o, out, newline)
    else:
        out.append(_scalar(o))


# Encoded keys (``"key": ``): a change log repeats a few dozen keys millions of times.
_KEYS: dict[str, str] = {}


def _key(key: str) -> str:
    name = encode_basestring(key) + ": "
    if len(_KEYS) < 4096:
        _KEYS[key] = name
    return name


def _dict(o: dict, out: list[str], newline: str) -> None:
    if not o:
        out.append("{}")
        return
    inner = newline + "  "
    lead = "{" + inner
    sep = "," + inner
    append = out.append
    keys = _KEYS
    for key in sorted(o):
        name = keys.get(key)
        if name is None:
            if type(key) is not str:
                raise _NotPlain
            name = _key(key)
        value = o[key]
        t = type(value)
        if t is str:
            append(lead + name + encode_basestring(value))
        elif t is dict:
            append(lead + name)
            _dict(value, out, inner)
        elif t is list or t is tuple or t is EncodedArray:
            append(lead + name)
            _list(value, out, inner)
        else:
            append(lead + name + _scalar(value))
        lead = sep
    append(newline + "}")


def _list(o: list | tuple, out: list[str], newline: str) -> None:
    text = getattr(o, "text", None) if type(o) is EncodedArray else None
    if text is not None:
        out.append(text.replace("\n", newline))
        return
    if not o:
        out.append("[]")
        return
    inner = newline + "  "
    lead = "[" + inner
    sep = "," + inner
    append = out.append
    for value in o:
        t = type(value)
        if t is str:
            append(lead + encode_basestring(value))
        elif t is dict:
            append(lead)
            _dict(value, out, inner)
        elif t is list or t is tuple or t is EncodedArray:
            append(lead)
            _list(value, out, inner)
        elif t is int:
            append(lead + _int_repr(value))
        else:
            append(lead + _scalar(value))
        lead = sep
    append(newline + "]")
