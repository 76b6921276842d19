"""Validation helpers for recipes: typed reads from ruamel nodes that record problems with their
``line:col`` instead of raising, so that one pass reports every problem in a recipe."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Iterator, Sequence

from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar

from ..config.json_pointer import normalize_scope, pointer_error
from ..model.model_dir import SKIPPED_DIRS

Pos = tuple[int, int]  # 1-based (line, column)

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}\Z")
# the provenance manifest and the OMS signature: never a recipe's to write or drop
RESERVED_NAMES = ("modelpatch.provenance.json", "model.sig")
RESERVED_DIRS = (".modelpatch",)


class _Invalid:
    def __repr__(self) -> str:
        return "<invalid>"


INVALID: Any = _Invalid()
"""Returned by a read whose problem has been recorded."""


def is_map(node: Any) -> bool:
    return isinstance(node, dict)


def is_seq(node: Any) -> bool:
    return isinstance(node, list)


def yaml_type(node: Any) -> str:
    if node is None:
        return "null"
    if isinstance(node, bool):
        return "a boolean"
    if isinstance(node, int):
        return "an integer"
    if isinstance(node, float):
        return "a number"
    if isinstance(node, (str, TaggedScalar)):
        return "a string"
    if is_map(node):
        return "a mapping"
    if is_seq(node):
        return "a list"
    return f"a {type(node).__name__}"


def node_pos(node: Any, fallback: Pos) -> Pos:
    lc = getattr(node, "lc", None)
    if isinstance(node, (CommentedMap, CommentedSeq)) and lc is not None and lc.line is not None:
        return lc.line + 1, lc.col + 1
    return fallback


def key_pos(node: CommentedMap, key: Any) -> Pos:
    try:
        line, col = node.lc.key(key)
        return line + 1, col + 1
    except (AttributeError, KeyError, TypeError):
        return node_pos(node, (1, 1))


def val_pos(node: CommentedMap, key: Any) -> Pos:
    try:
        line, col = node.lc.value(key)
        fallback = (line + 1, col + 1)
    except (AttributeError, KeyError, TypeError):
        fallback = key_pos(node, key)
    return node_pos(node.get(key), fallback)


def item_pos(node: CommentedSeq, index: int) -> Pos:
    try:
        line, col = node.lc.item(index)
        fallback = (line + 1, col + 1)
    except (AttributeError, KeyError, IndexError, TypeError):
        fallback = node_pos(node, (1, 1))
    return node_pos(node[index], fallback)


def did_you_mean(word: str, options: Sequence[str]) -> str | None:
    """``"did you mean 'x'?"`` for the option closest to ``word``: a case-insensitive match,
    else difflib's closest, else the (at most 3) options that start with or contain it."""
    low = word.lower()
    close = ([o for o in options if o.lower() == low]
             or difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
             or ([o for o in options if o.lower().startswith(low)]
                 or [o for o in options if low in o.lower()] if low else []))
    if not close or len(close) > 3:
        return None
    return "did you mean " + " or ".join(repr(c) for c in close) + "?"


def filename_error(name: str) -> str | None:
    """Why ``name`` is not a safe relative path to a model file, or None: never in a
    dot-directory (``.git/``, ``.cache/``, ``.modelpatch/``...), never one of those itself."""
    if name == "":
        return "a file name must not be empty"
    if "\\" in name:
        return f"file name {name!r} has a backslash; use '/' between directories"
    if "\0" in name:
        return f"file name {name!r} has a NUL character"
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return f"file name {name!r} is absolute; give a path relative to the model directory"
    parts = name.split("/")
    if ".." in parts:
        return f"file name {name!r} has a '..' component; it must stay inside the model directory"
    if "" in parts or "." in parts:
        return f"file name {name!r} has an empty or '.' component"
    if parts[0] in RESERVED_DIRS or name in RESERVED_NAMES:
        return f"file name {name!r} is reserved for modelpatch's own records"
    if parts[-1] in SKIPPED_DIRS or any(p.startswith(".") for p in parts[:-1]):
        return (f"file name {name!r} is not a model file: recipes never touch dot-directories "
                f"such as .git/, .cache/ or .modelpatch/")
    return None


class Validator:
    """Typed reads of recipe nodes; problems are recorded as (line, col, message)."""

    def __init__(self, source: str):
        self.source = source
        self.problems: list[tuple[int, int, str]] = []
        self.recipe_path: Any = None               # the file being read, for include: paths
        self.including: tuple[str, ...] = ()        # the recipes including it (cycle check)
        self.include_cache: dict[str, Any] = {}      # resolved path -> recipe, whole load
        self.include_count = 0                      # include items it expands to
        self.param_names: set[str] = set()          # declared params, for {references}

    def err(self, pos: Pos, message: str) -> None:
        self.problems.append((pos[0], pos[1], message))

    def loc(self, pos: Pos) -> str:
        return f"{self.source}:{pos[0]}:{pos[1]}"

    def pos_of(self, node: Any) -> Pos:
        return node_pos(node, (1, 1))

    # ---- keys

    def check_keys(self, node: CommentedMap, allowed: Sequence[str], what: str, *,
                   required: Sequence[str] = (), suggest: Sequence[str] | None = None) -> int:
        """Record unknown keys (with a did-you-mean) and missing required ones; return the number
        of unknown keys."""
        unknown = 0
        for key in node:
            if not isinstance(key, str):
                self.err(key_pos(node, key), f"keys must be strings; got {yaml_type(key)}")
                unknown += 1
            elif key not in allowed:
                unknown += 1
                hint = (did_you_mean(key, suggest or allowed)
                        or "expected one of: " + ", ".join(allowed or suggest or ()))
                self.err(key_pos(node, key), f"unknown key {key!r} in {what} ({hint})")
        for key in required:
            if key not in node:
                self.err(self.pos_of(node), f"{what} needs {key!r}")
        return unknown

    # ---- scalars

    def _scalar(self, node: CommentedMap, key: str) -> Any:
        value = node[key]
        if isinstance(value, TaggedScalar):
            return str(value.value)
        return value

    def check_string(self, value: Any, pos: Pos, *, nonempty: bool = True,
                     what: str = "value") -> str | None:
        if isinstance(value, TaggedScalar):
            value = str(value.value)
        if not isinstance(value, str):
            self.err(pos, f"{what} must be a string; got {yaml_type(value)}")
            return None
        if nonempty and not value.strip():
            self.err(pos, f"{what} must not be empty")
            return None
        return str(value)

    def string(self, node: CommentedMap, key: str, *, nonempty: bool = True) -> str | None:
        if key not in node:
            return None
        return self.check_string(node[key], val_pos(node, key), nonempty=nonempty,
                                 what=f"{key!r}")

    def integer(self, node: CommentedMap, key: str) -> int | None:
        if key not in node:
            return None
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(val_pos(node, key), f"{key!r} must be an integer; got {yaml_type(value)}")
            return None
        return int(value)

    def boolean(self, node: CommentedMap, key: str, default: bool | None = None) -> Any:
        if key not in node:
            return default
        value = node[key]
        if not isinstance(value, bool):
            self.err(val_pos(node, key), f"{key!r} must be true or false; got {yaml_type(value)}")
            return INVALID if default is None else default
        return bool(value)

    def choice(self, node: CommentedMap, key: str, options: Sequence[str]) -> str | None:
        if key not in node:
            return None
        value = self.check_string(node[key], val_pos(node, key), what=f"{key!r}")
        if value is None:
            return None
        if value not in options:
            hint = did_you_mean(value, options) or "expected one of: " + ", ".join(options)
            self.err(val_pos(node, key), f"unknown {key} {value!r} ({hint})")
            return None
        return value

    # ---- lists

    def items(self, node: CommentedMap, key: str, *,
              nonempty: bool = False) -> Iterator[tuple[Any, Pos]]:
        """The items of the list at ``key`` with their positions (nothing if absent/null)."""
        if key not in node or (node[key] is None and not nonempty):
            return
        seq = node[key]
        if not is_seq(seq):
            self.err(val_pos(node, key), f"{key!r} must be a list; got {yaml_type(seq)}")
            return
        if nonempty and not seq:
            self.err(val_pos(node, key), f"{key!r} must not be empty")
            return
        for index, item in enumerate(seq):
            yield item, item_pos(seq, index)

    def strings(self, node: CommentedMap, key: str) -> tuple[tuple[str, Pos], ...] | None:
        """A string or a non-empty list of strings at ``key``, each with its position."""
        value = node[key]
        if isinstance(value, (str, TaggedScalar)):
            text = self.check_string(value, val_pos(node, key), what=f"{key!r}")
            return None if text is None else ((text, val_pos(node, key)),)
        if not is_seq(value):
            self.err(val_pos(node, key), f"{key!r} must be a string or a list of strings; got "
                     f"{yaml_type(value)}")
            return None
        out = []
        for item, pos in self.items(node, key, nonempty=True):
            text = self.check_string(item, pos, what=f"each item of {key!r}")
            if text is None:
                return None
            out.append((text, pos))
        return tuple(out) if out else None

    # ---- recipe-specific values

    def check_pointer(self, value: Any, pos: Pos, *, allow_root: bool = True) -> str | None:
        if isinstance(value, TaggedScalar):
            value = str(value.value)
        problem = pointer_error(value)
        if problem is None and value == "" and not allow_root:
            problem = "this operation needs a path inside the document, not \"\" (the root)"
        if problem:
            self.err(pos, problem)
            return None
        return str(value)

    def pointer(self, node: CommentedMap, key: str, *, allow_root: bool = True) -> str | None:
        if key not in node:
            return None
        return self.check_pointer(node[key], val_pos(node, key), allow_root=allow_root)

    def scopes(self, node: CommentedMap) -> tuple[str, ...]:
        """The ``in:`` scopes (default: the root only). ``/`` means the root."""
        if "in" not in node:
            return ("",)
        items = self.strings(node, "in")
        if items is None:
            return ("",)
        out: list[str] = []
        for text, pos in items:
            scope = self.check_pointer(normalize_scope(text), pos)
            if scope is not None:
                if scope in out:
                    self.err(pos, f"scope {text!r} is listed twice")
                out.append(scope)
        return tuple(dict.fromkeys(out)) or ("",)

    def check_filename(self, value: Any, pos: Pos) -> str | None:
        if isinstance(value, TaggedScalar):
            value = str(value.value)
        if not isinstance(value, str):
            self.err(pos, f"a file name must be a string; got {yaml_type(value)}")
            return None
        problem = filename_error(value)
        if problem:
            self.err(pos, problem)
            return None
        return str(value)

    def filename(self, node: CommentedMap, key: str) -> str | None:
        if key not in node:
            return None
        return self.check_filename(node[key], val_pos(node, key))

    def json_value(self, node: Any, pos: Pos) -> Any:
        """``node`` as a plain JSON value, or INVALID (problem recorded)."""
        if node is None or isinstance(node, bool):
            return node
        if isinstance(node, int):
            return int(node)
        if isinstance(node, float):
            if not math.isfinite(node):
                self.err(pos, "NaN and infinities are not JSON values")
                return INVALID
            return float(node)
        if isinstance(node, TaggedScalar):
            return str(node.value)
        if isinstance(node, str):
            return str(node)
        if is_map(node):
            out: dict[str, Any] = {}
            ok = True
            for key, child in node.items():
                if not isinstance(key, str):
                    self.err(key_pos(node, key), "JSON object keys must be strings; got "
                             f"{yaml_type(key)} (quote it)")
                    ok = False
                    continue
                value = self.json_value(child, val_pos(node, key))
                ok = ok and value is not INVALID
                out[str(key)] = value
            return out if ok else INVALID
        if is_seq(node):
            values = [self.json_value(child, item_pos(node, i)) for i, child in enumerate(node)]
            return INVALID if any(v is INVALID for v in values) else values
        self.err(pos, f"{yaml_type(node)} is not a JSON value (quote it to make a string)")
        return INVALID
