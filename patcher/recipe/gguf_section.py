"""The ``gguf:`` section of a recipe::

    gguf:
      requires:                       # guards on the GGUF metadata
        - {key: "{arch}.rope.scaling.type", one_of: [none, linear, yarn], missing_ok: true}
      metadata:
        - {set: tokenizer.chat_template, from: template.jinja}     # file beside the recipe
        - {set: tokenizer.chat_template, from: "{template}", sha256: "{pin}"}  # any from: source
        - {set: tokenizer.chat_template, from_model: chat_template.jinja}
        - {set: tokenizer.ggml.eos_token_id, value: 2}             # type: the key's own
        - {set: "{arch}.context_length", value: 32768, type: uint32}
        - {set: tokenizer.ggml.eos_token_id, from_model: generation_config.json,
           path: /eos_token_id, first: true}                       # a JSON value, first item
        - {drop: general.url, missing_ok: true}
        - {drop: "tokenizer.chat_template.*"}                      # every key under the prefix
        - {rename: general.name, to: general.basename}
      tensors:
        - {select: {glob: "blk.*.nextn.*"}, drop: true}
        - {select: {regex: "^output\\.", layers: "0-3"}, rename: {pattern: "x", to: "y"}}
      strip_nextn: true               # drop the MTP/nextn blocks, fix the block count

A select matches a tensor when every one of its keys does (``layers`` reads the block number of
``blk.N.*`` names). ``type`` is a GGUF value type in lower case (``uint32``, ``float32``,
``string``, ``bool``...) or ``array[uint32]``; without it a key keeps its type, and a new key's type
is inferred.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from . import checks as rc
from .tensor_ops.parse import check_regex, check_replacement

TYPES = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5,
         "float32": 6, "bool": 7, "string": 8, "uint64": 10, "int64": 11, "float64": 12}
SECTION_KEYS = ("requires", "metadata", "tensors", "strip_nextn")
META_KEYS = {"set": ("set", "value", "type", "from", "sha256", "from_model", "from_key", "path",
                     "first",
                     "token", "multiply"),
             "drop": ("drop", "missing_ok"), "rename": ("rename", "to", "missing_ok")}
SET_SOURCES = ("value", "from", "from_model", "from_key")     # a set takes exactly one
GUARD_KEYS = ("key", "equals", "one_of", "exists", "missing_ok", "message")
GUARD_REQUIRED = ("key",)
TENSOR_KEYS = ("select", "drop", "rename")
SELECT_KEYS = ("glob", "regex", "layers")
RENAME_KEYS = ("pattern", "to")                 # both needed
_TYPE_RE = re.compile(r"array\[(\w+)\]|(\w+)")
_LAYERS = re.compile(r"(\d+)?(-)?(\d+)?|last:(\d+)")


@dataclass(frozen=True)
class GType:
    vtype: int
    item_type: int | None = None


@dataclass(frozen=True)
class MetaOp:
    kind: str                         # set / drop / rename
    key: str
    loc: str
    value: Any = None
    gtype: GType | None = None
    source: tuple | None = None       # ("recipe"|"model", file, json pointer or None, first)
    from_key: str | None = None       # the value of another metadata key (before this op)
    token: bool = False               # the value is a token's text: store its id
    multiply: float | None = None     # numbers: times this
    to: str | None = None
    missing_ok: bool = False
    # from: (patcher.recipe.sources): the text read at load (a file beside the recipe) or at
    # bind (``fetch``, pinned by ``sha256``), and where it came from for the manifest
    content: Any = None
    fetch: Any = None
    sha256: Any = None
    content_source: dict | None = None


@dataclass(frozen=True)
class Guard:
    key: str
    loc: str
    equals: Any = None
    one_of: tuple | None = None
    exists: bool | None = None
    missing_ok: bool = False
    message: str | None = None


@dataclass(frozen=True)
class Select:
    glob: str | None
    regex: Any
    layers: tuple[int | None, int | None, int | None] | None   # (first, last, last_n)


@dataclass(frozen=True)
class TensorOp:
    select: Select
    loc: str
    drop: bool = False
    rename: tuple[Any, str] | None = None


@dataclass(frozen=True)
class GGUFSection:
    requires: tuple[Guard, ...]
    metadata: tuple[MetaOp, ...]
    tensors: tuple[TensorOp, ...]
    strip_nextn: bool
    loc: str


def merge_sections(sections: list[GGUFSection | None]) -> GGUFSection | None:
    """The ``gguf:`` sections of recipes applied together (``include:``, several recipes given)
    as one: guards, metadata and tensor ops in the recipes' order (each op sees the metadata as
    the ones before it leave it), the nextn blocks stripped if any recipe strips them."""
    given = [s for s in sections if s is not None]
    if len(given) <= 1:
        return given[0] if given else None
    strips = [s for s in given if s.strip_nextn]
    return GGUFSection(requires=tuple(g for s in given for g in s.requires),
                       metadata=tuple(m for s in given for m in s.metadata),
                       tensors=tuple(t for s in given for t in s.tensors),
                       strip_nextn=bool(strips), loc=(strips or given)[0].loc)


def parse_section(v: rc.Validator, root: Any) -> GGUFSection | None:
    node = root.get("gguf")
    if node is None:
        return None
    pos = rc.val_pos(root, "gguf")
    if not rc.is_map(node):
        v.err(pos, f"gguf: must be a mapping with metadata/tensors/requires/strip_nextn; got "
              f"{rc.yaml_type(node)}")
        return None
    v.check_keys(node, SECTION_KEYS, "gguf")
    strip = v.boolean(node, "strip_nextn", default=False)
    return GGUFSection(
        requires=tuple(g for n, p in v.items(node, "requires") if (g := _guard(v, n, p))),
        metadata=tuple(m for n, p in v.items(node, "metadata") if (m := _meta(v, n, p))),
        tensors=tuple(t for n, p in v.items(node, "tensors") if (t := _tensor_op(v, n, p))),
        strip_nextn=strip is True, loc=v.loc(pos))


def parse_type(text: str) -> GType | None:
    m = _TYPE_RE.fullmatch(text.strip().lower())
    if not m:
        return None
    if m[1] is not None:
        return GType(9, TYPES[m[1]]) if m[1] in TYPES else None
    return GType(TYPES[m[2]]) if m[2] in TYPES else None


def _meta(v: rc.Validator, node: Any, pos) -> MetaOp | None:
    if not rc.is_map(node):
        v.err(pos, f"a gguf metadata op is a mapping with set, drop or rename; got "
              f"{rc.yaml_type(node)}")
        return None
    kinds = [k for k in node if k in META_KEYS]
    if len(kinds) != 1:
        v.err(pos, "a gguf metadata op has exactly one of set, drop, rename")
        return None
    kind = kinds[0]
    v.check_keys(node, META_KEYS[kind], f"gguf {kind}")
    key, loc = v.string(node, kind), v.loc(pos)
    if key is None:
        return None
    if kind == "drop":
        return MetaOp("drop", key, loc, missing_ok=v.boolean(node, "missing_ok", False) is True)
    if kind == "rename":
        to = v.string(node, "to")
        return None if to is None else MetaOp(
            "rename", key, loc, to=to, missing_ok=v.boolean(node, "missing_ok", False) is True)
    gtype = None
    if "type" in node:
        text = v.string(node, "type")
        gtype = parse_type(text) if text else None
        if gtype is None and text:
            v.err(rc.val_pos(node, "type"), f"unknown GGUF type {text!r} (one of "
                  f"{', '.join(TYPES)}, or array[TYPE])")
            return None
    sources = [k for k in SET_SOURCES if k in node]
    if len(sources) != 1:
        v.err(pos, "a gguf set takes exactly one of value, from (a file beside the recipe), "
              "from_model (a file in the model), from_key (another metadata key)")
        return None
    if "sha256" in node and sources[0] != "from":
        v.err(rc.key_pos(node, "sha256"), "sha256: pins the content of 'from:'")
        return None
    value, source = None, None
    multiply = node.get("multiply")
    if multiply is not None and (isinstance(multiply, bool) or not isinstance(
            multiply, (int, float)) or not 0 < multiply < float("inf")):
        v.err(rc.val_pos(node, "multiply"), "multiply must be a positive number")
        return None
    extra = dict(token=v.boolean(node, "token", False) is True,
                 multiply=None if multiply is None else float(multiply))
    if sources[0] == "from_key":
        name = v.string(node, "from_key")
        return None if name is None else MetaOp("set", key, loc, gtype=gtype, from_key=name,
                                                **extra)
    if sources[0] == "value":
        value = v.json_value(node["value"], rc.val_pos(node, "value"))
        if value is rc.INVALID:
            return None
    elif sources[0] == "from":
        from .sources import parse_from

        found = parse_from(v, node, pos)
        pointer = v.pointer(node, "path") if "path" in node else None
        if found is None:
            return None
        extra.update(content=found.get("content"), fetch=found.get("fetch"),
                     sha256=found.get("sha256"), content_source=found.get("source"))
        source = ("recipe", str(node["from"]), pointer, v.boolean(node, "first", False) is True)
    else:
        name = v.filename(node, sources[0])
        pointer = v.pointer(node, "path") if "path" in node else None
        if name is None:
            return None
        source = ("model", name, pointer, v.boolean(node, "first", False) is True)
    _check_rope_value(v, node, key, value)
    return MetaOp("set", key, loc, value=value, gtype=gtype, source=source, **extra)


def _check_rope_value(v: rc.Validator, node: Any, key: str, value: Any) -> None:
    """Without gguf-py the recipe still loads (``recipes list``); planning checks again."""
    if key.endswith(".rope.scaling.type") and value is not None:
        try:
            known = rope_types()
        except InputError:
            return
        if value not in known:
            v.err(rc.val_pos(node, "value"), f"unknown rope scaling type {value!r} (gguf-py "
                  f"knows {', '.join(known)})")


def rope_types() -> tuple[str, ...]:
    from ..gguf_py import gguf_constants

    return tuple(t.value for t in gguf_constants().RopeScalingType)


def _guard(v: rc.Validator, node: Any, pos) -> Guard | None:
    if not rc.is_map(node):
        v.err(pos, f"a gguf guard is a mapping with key and equals/one_of/exists; got "
              f"{rc.yaml_type(node)}")
        return None
    v.check_keys(node, GUARD_KEYS, "gguf guard", required=GUARD_REQUIRED)
    key = v.string(node, "key")
    one_of = None
    if "one_of" in node:
        one_of = tuple(v.json_value(n, p) for n, p in v.items(node, "one_of", nonempty=True))
    equals = v.json_value(node["equals"], rc.val_pos(node, "equals")) if "equals" in node \
        else None
    exists = v.boolean(node, "exists") if "exists" in node else None
    if key is None:
        return None
    return Guard(key, v.loc(pos), equals, one_of, exists if exists in (True, False) else None,
                 v.boolean(node, "missing_ok", False) is True, v.string(node, "message"))


def _tensor_op(v: rc.Validator, node: Any, pos) -> TensorOp | None:
    if not rc.is_map(node) or "select" not in node:
        v.err(pos, "a gguf tensor op is a mapping with select and drop or rename")
        return None
    v.check_keys(node, TENSOR_KEYS, "gguf tensor op")
    sel = node["select"]
    if not rc.is_map(sel) or not sel:
        v.err(rc.val_pos(node, "select"), "select: is a mapping of glob, regex, layers")
        return None
    v.check_keys(sel, SELECT_KEYS, "gguf select")
    regex = None
    if "regex" in sel:
        text = v.string(sel, "regex")
        if text and check_regex(v, text, rc.val_pos(sel, "regex")):
            regex = re.compile(text)
    layers = _layers(v, sel) if "layers" in sel else None
    select = Select(v.string(sel, "glob"), regex, layers)
    drop = v.boolean(node, "drop", False) is True
    rename = None
    if "rename" in node:
        ren = node["rename"]
        if not rc.is_map(ren) or any(k not in ren for k in RENAME_KEYS):
            v.err(rc.val_pos(node, "rename"), "rename: is {pattern: REGEX, to: REPLACEMENT}")
            return None
        pattern = v.string(ren, "pattern") or ""
        to = v.string(ren, "to", nonempty=False) or ""
        if not (check_regex(v, pattern, rc.val_pos(ren, "pattern"))
                and check_replacement(v, pattern, to, rc.val_pos(ren, "to"))):
            return None
        rename = (re.compile(pattern), to)
    if drop == (rename is not None):
        v.err(pos, "a gguf tensor op has exactly one of drop: true, rename")
        return None
    return TensorOp(select, v.loc(pos), drop, rename)


def _layers(v: rc.Validator, sel: Any):
    text = str(sel["layers"]).strip()
    m = _LAYERS.fullmatch(text)
    if not text or not m or (m[4] is None and m[1] is None and m[3] is None):
        v.err(rc.val_pos(sel, "layers"), f"layers {text!r}: write N, N-M, N- or last:N "
              "(block numbers; last:N counts back from {arch}.block_count)")
        return None
    if m[4] is not None:
        return (None, None, int(m[4]))
    first = int(m[1]) if m[1] is not None else 0
    last = int(m[3]) if m[3] is not None else (None if m[2] else first)
    return (first, last, None)
