"""JSON files of model directories: strict reading, and style-preserving load/dump for patching.

``parse_json`` reads a file strictly. ``load_json_document`` / ``dump_json_document`` round-trip a
file byte for byte (key order, indentation, separators, escaping, number literals, trailing
newline), so a patch changes only the keys it touches. ``unified_diff`` renders a change.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any

from ..errors import ModelDirError
from .unique_keys import keys_all_distinct

_FAST_MIN_BYTES = 1 << 16


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing duplicate keys: one C-level dict build per object, and a
    key-by-key search only when the sizes show a duplicate."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {duplicate!r}")
    return obj


def _no_constant(literal: str) -> Any:
    raise ValueError(f"{literal} is not a JSON value")


def parse_json(data: bytes, where: str, *, constants: bool = True) -> Any:
    """Parse ``data`` as strict UTF-8 JSON; duplicate keys and bad encodings are errors, and so
    are ``NaN``/``Infinity`` (which Python's json accepts) when ``constants`` is False."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelDirError(f"not valid UTF-8 at byte {exc.start}", where=where) from None
    try:
        if len(data) >= _FAST_MIN_BYTES:    # a shard index: 273k keys at Kimi-K2.5 scale
            doc = json.loads(text, parse_constant=None if constants else _no_constant)
            if keys_all_distinct(data, doc):
                return doc
        return json.loads(text, object_pairs_hook=no_duplicate_keys,
                          parse_constant=None if constants else _no_constant)
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                            where=where) from None
    except (ValueError, RecursionError) as exc:
        raise ModelDirError(f"invalid JSON: {exc}", where=where) from None


# --------------------------------------------------------------------------------------------
# Style-preserving documents: load a JSON file, patch its value, write it back so that only the
# patched keys change. Key order is kept (dicts keep insertion order); numbers keep their exact
# literals; indentation, separators, escaping and the trailing newline are detected and reused.
# --------------------------------------------------------------------------------------------

_JSON_WS = " \t\n\r"
_BOM = "\ufeff"


class _Literal:
    """Pickles and copies as the literal it was parsed from (values are immutable)."""

    __slots__ = ()

    def __reduce__(self):
        return (type(self), (self.literal,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class JsonFloat(_Literal, float):
    """A float that remembers the literal it was parsed from (``1e-06``, ``0.00001``, ``1.0``).

    It compares and computes like a float. ``dump_json_document`` writes the literal back, so an
    unchanged number keeps its spelling.
    """

    __slots__ = ("literal",)

    def __new__(cls, literal: str):
        if literal in ("NaN", "Infinity", "-Infinity"):
            self = super().__new__(cls, {"NaN": "nan", "Infinity": "inf",
                                         "-Infinity": "-inf"}[literal])
        else:
            self = super().__new__(cls, literal)
        self.literal = literal
        return self


class JsonInt(_Literal, int):
    """An int whose literal is not ``str(int)`` (only ``-0``); written back as parsed."""

    def __new__(cls, literal: str):
        self = super().__new__(cls, literal)
        self.literal = literal
        return self


def _parse_int(literal: str) -> int:
    value = int(literal)
    return value if str(value) == literal else JsonInt(literal)


@dataclass(frozen=True)
class JsonStyle:
    """How a JSON file is laid out, as ``json.dumps`` options plus what surrounds the value.

    ``indent`` is the string for one level (``"  "``, ``"\\t"``...), or None for a single line.
    ``sort_keys``: every object in the file had sorted keys, so keys a patch adds are sorted in
    too (transformers writes ``sort_keys=True``); otherwise new keys go last.
    """

    indent: str | None = "  "
    item_separator: str = ","
    key_separator: str = ": "
    ensure_ascii: bool = True
    sort_keys: bool = False
    newline: str = "\n"
    leading: str = ""
    trailing: str = "\n"
    bom: bool = False
    exact: bool = True
    """False when this style does not reproduce the file it was detected from byte for byte."""


@dataclass
class JsonDocument:
    """A parsed JSON file. ``exact`` is True when ``dump_json_document(value, style)`` gives the
    original bytes back; when False, ``note`` says what cannot be reproduced, and a rewrite of the
    file will also change its formatting (the planner should warn)."""

    value: Any
    style: JsonStyle
    note: str | None = None

    @property
    def exact(self) -> bool:
        return self.style.exact


def _all_sorted(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            keys = list(v)
            if keys != sorted(keys):
                return False
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[,:]')


def _guess_style(body: str, value: Any, newline: str, leading: str, trailing: str,
                 bom: bool) -> JsonStyle:
    indent: str | None = None
    lines = body.split(newline)
    if len(lines) > 1:
        second = lines[1]
        indent = second[:len(second) - len(second.lstrip(" \t"))]
    item_sep, key_sep = (",", ": ") if indent is not None else (", ", ": ")
    seen_item = seen_key = False
    for m in _TOKEN.finditer(body):
        tok = m.group()
        if tok == "," and not seen_item:
            nxt = body[m.end():m.end() + 1]
            item_sep = ", " if nxt == " " else ","
            seen_item = True
        elif tok == ":" and not seen_key:
            nxt = body[m.end():m.end() + 1]
            key_sep = ": " if nxt == " " else ":"
            seen_key = True
        if seen_item and seen_key:
            break
    # Raw non-ASCII means ensure_ascii=False. A pure-ASCII file reads back the same either way;
    # keep it ASCII.
    ensure_ascii = body.isascii()
    return JsonStyle(indent=indent, item_separator=item_sep, key_separator=key_sep,
                     ensure_ascii=ensure_ascii, sort_keys=_all_sorted(value), newline=newline,
                     leading=leading, trailing=trailing, bom=bom)


def load_json_document(data: bytes, where: str) -> JsonDocument:
    """Parse a JSON file and capture its layout so that it can be written back unchanged.

    Args:
        data: the file's bytes (strict UTF-8, an optional BOM; duplicate keys are errors).
        where: the file's name, for error messages.
    Returns:
        A ``JsonDocument``; ``exact`` tells whether the layout round-trips byte for byte.
    Raises:
        ModelDirError: the bytes are not JSON.
    """
    bom = data.startswith(b"\xef\xbb\xbf")
    raw = data[3:] if bom else data
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelDirError(f"not valid UTF-8 at byte {exc.start + (3 if bom else 0)}",
                            where=where) from None
    try:
        value = json.loads(text, object_pairs_hook=no_duplicate_keys, parse_float=JsonFloat,
                           parse_int=_parse_int, parse_constant=JsonFloat)
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                            where=where) from None
    except (ValueError, RecursionError) as exc:
        raise ModelDirError(f"invalid JSON: {exc}", where=where) from None
    stripped = text.lstrip(_JSON_WS)
    leading = text[:len(text) - len(stripped)]
    body = stripped.rstrip(_JSON_WS)
    trailing = stripped[len(body):]
    newline = "\r\n" if "\r\n" in text else "\n"
    style = _guess_style(body, value, newline, leading, trailing, bom)
    out = dump_json_document(value, style)
    if out == data:
        return JsonDocument(value, style)
    # Locate the first difference for the warning.
    a, b = data.decode("utf-8", "replace"), out.decode("utf-8", "replace")
    pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    line = a.count("\n", 0, pos) + 1
    return JsonDocument(value, dataclasses.replace(style, exact=False),
                        f"its formatting cannot be reproduced exactly (first difference on line "
                        f"{line}); a rewrite will reformat it")


def _encode(value: Any, style: JsonStyle, out: list[str], level: int) -> None:
    """Append the JSON text of ``value`` (nested ``level`` deep) to ``out``, in ``style``.

    Containers recurse here directly and scalars are written inline, keeping to one stack frame
    per nesting level, as the parser does.
    """
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(encode_basestring_ascii(value) if style.ensure_ascii
                   else encode_basestring(value))
    elif isinstance(value, (JsonFloat, JsonInt)):
        out.append(value.literal)
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        if value != value:
            out.append("NaN")
        elif value in (float("inf"), float("-inf")):
            out.append("Infinity" if value > 0 else "-Infinity")
        else:
            out.append(float.__repr__(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        sep, first, last = _delimiters(style, level, "[", "]")
        out.append(first)
        for i, item in enumerate(value):
            if i:
                out.append(sep)
            _encode(item, style, out, level + 1)
        out.append(last)
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        sep, first, last = _delimiters(style, level, "{", "}")
        out.append(first)
        items = sorted(value.items()) if style.sort_keys else value.items()
        for i, (key, item) in enumerate(items):
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, not {type(key).__name__}")
            if i:
                out.append(sep)
            out.append(encode_basestring_ascii(key) if style.ensure_ascii
                       else encode_basestring(key))
            out.append(style.key_separator)
            _encode(item, style, out, level + 1)
        out.append(last)
    else:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _delimiters(style: JsonStyle, level: int, opening: str, closing: str
                ) -> tuple[str, str, str]:
    """``(separator, first, last)`` around the items of a non-empty array or object nested
    ``level`` deep: on one line, or one item per line indented one step deeper."""
    if style.indent is None:
        return style.item_separator, opening, closing
    inner = "\n" + style.indent * (level + 1)
    return (style.item_separator + inner, opening + inner,
            "\n" + style.indent * level + closing)


def dump_json_document(value: Any, style: JsonStyle) -> bytes:
    """Serialize ``value`` in ``style``. Numbers parsed by ``load_json_document`` keep their
    literals; other floats are written as Python's ``json`` writes them."""
    out: list[str] = []
    _encode(value, style, out, 0)
    text = "".join(out)
    if style.newline != "\n" and style.indent is not None:
        text = text.replace("\n", style.newline)  # safe: JSON strings escape their newlines
    data = (style.leading + text + style.trailing).encode("utf-8")
    return b"\xef\xbb\xbf" + data if style.bom else data


def unified_diff(before: bytes | None, after: bytes | None, name: str, *,
                 context: int = 3) -> str:
    """A ``git diff``-style unified diff of two versions of a text file (``None``: absent)."""
    def lines(data: bytes | None) -> list[str]:
        if data is None:
            return []
        result = data.decode("utf-8", "replace").splitlines(keepends=True)
        if result and not result[-1].endswith(("\n", "\r")):
            result[-1] += "\n\\ No newline at end of file\n"
        return result

    import difflib  # diffs are for `plan`; reading JSON (every command) does not

    return "".join(difflib.unified_diff(
        lines(before), lines(after),
        fromfile="/dev/null" if before is None else f"a/{name}",
        tofile="/dev/null" if after is None else f"b/{name}", n=context))
