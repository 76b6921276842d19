"""The planning of a recipe's GGUF metadata ops (set / drop / rename), typed per GGUF value
type."""

from __future__ import annotations

import json

from ..errors import InputError, PlanError
from ..fsops import read_capped
from ..gguf.format import ARRAY, STRING, KeyValue, encode_value
from ..gguf.metadata import summarize, token_id
from ..recipe.gguf_section import GType, MetaOp
from .changes import GgufMetadata

MAX_VALUE_FILE = 16 << 20
RESERVED = frozenset({"general.alignment"})


def arch_key(key: str, arch: str) -> str:
    return key.replace("{arch}", arch)


def describe(key: str, before: KeyValue | None, after: KeyValue | None) -> str:
    """Diff lines for one key."""
    lines = []
    if before is not None:
        lines.append(f"-{key}: {before.type_name()} {summarize(before)}\n")
    if after is not None:
        lines.append(f"+{key}: {after.type_name()} {summarize(after)}\n")
    return "".join(lines)


def apply_meta_op(op: MetaOp, kv: dict[str, KeyValue], arch: str, recipe, model,
                  lines: list[str], changes: list, file: str) -> None:
    key = arch_key(op.key, arch)
    for name in (key, arch_key(op.to, arch) if op.to else None):
        if name is not None and (name in RESERVED or name.startswith("split.")):
            raise PlanError(f"{name} describes the file's layout, which modelpatch writes "
                            "itself; a recipe cannot edit it", where=op.loc)
    old = kv.get(key)
    if op.kind == "drop" and key.endswith(".*"):
        _drop_all(op, kv, key[:-1], lines, changes, file)
        return
    if op.kind == "drop":
        if old is None:
            if op.missing_ok:
                return
            raise PlanError(f"metadata key {key!r} is not in {file}", where=op.loc,
                            hint="missing_ok: true skips it")
        del kv[key]
        lines.append(describe(key, old, None))
        changes.append(GgufMetadata("drop", key, op.loc, before=_plain(old)))
        return
    if op.kind == "rename":
        to = arch_key(op.to, arch)
        if old is None:
            if op.missing_ok:
                return
            raise PlanError(f"metadata key {key!r} is not in {file}", where=op.loc)
        if to in kv:
            raise PlanError(f"metadata key {to!r} already exists", where=op.loc)
        kv.pop(key)
        kv[to] = KeyValue(to, old.vtype, old.raw, old.item_type, old.count)
        lines.append(f"-{key}\n+{to}\n")
        changes.append(GgufMetadata("rename", key, op.loc, to=to))
        return
    value = _value(op, kv, arch, recipe, model)
    gtype = op.gtype or (GType(old.vtype, old.item_type) if old is not None
                         else GType(4) if op.token else infer(value))
    if gtype.vtype != ARRAY and isinstance(value, list) and op.source and op.source[3]:
        value = value[0] if value else None
    if op.token:
        value = token_id(kv, value, op.loc)
    if op.multiply is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PlanError(f"multiply: {key} is not a number ({value!r})", where=op.loc)
        value = value * op.multiply
        value = int(value) if gtype.vtype not in (6, 12) and value == int(value) else value
    if ".rope.scaling." in key:
        _check_rope_type(kv, arch, key, value, op.loc)
    try:
        raw = encode_value(gtype.vtype, value, gtype.item_type)
    except ValueError as exc:
        raise PlanError(f"{key}: {exc}", where=op.loc) from None
    new = KeyValue(key, gtype.vtype, raw, gtype.item_type,
                   len(value) if gtype.vtype == ARRAY else 1)
    if old is not None and (old.vtype, old.raw) == (new.vtype, new.raw):
        return
    kv[key] = new
    lines.append(describe(key, old, new))
    changes.append(GgufMetadata("set", key, op.loc, before=_plain(old) if old else None,
                                after=_plain(new), type=new.type_name()))


def _drop_all(op: MetaOp, kv: dict[str, KeyValue], prefix: str, lines: list[str],
              changes: list, file: str) -> None:
    """``drop: PREFIX.*``: every key under ``PREFIX.`` (named templates, say)."""
    hits = [k for k in kv if k.startswith(prefix)]
    if not hits and not op.missing_ok:
        raise PlanError(f"no metadata key in {file} starts with {prefix!r}", where=op.loc,
                        hint="missing_ok: true skips it")
    for name in hits:
        old = kv.pop(name)
        lines.append(describe(name, old, None))
        changes.append(GgufMetadata("drop", name, op.loc, before=_plain(old)))


def _value(op: MetaOp, kv: dict[str, KeyValue], arch: str, recipe, model):
    if op.from_key is None:
        return op.value if op.source is None else _sourced(op, recipe, model)
    name = arch_key(op.from_key, arch)
    if name not in kv:
        raise PlanError(f"from_key: {name} is not in the metadata", where=op.loc)
    return kv[name].value


def _check_rope_type(kv: dict[str, KeyValue], arch: str, key: str, value, loc: str) -> None:
    """Rope scaling is only edited in a file whose scaling type gguf-py knows; a new type must
    be one it knows too (llama.cpp ignores or misreads others)."""
    from ..recipe.gguf_section import rope_types

    known = rope_types()
    check_rope_known(kv, arch, loc)
    if key.endswith(".rope.scaling.type") and value not in known:
        raise PlanError(f"unknown rope scaling type {value!r} ({', '.join(known)})", where=loc)


def check_rope_known(kv: dict[str, KeyValue], arch: str, loc: str) -> None:
    from ..recipe.gguf_section import rope_types

    known = rope_types()
    current = kv.get(f"{arch}.rope.scaling.type")
    if current is not None and current.value not in known:
        raise PlanError(f"{arch}.rope.scaling.type is {current.value!r}, a rope type this "
                        f"recipe does not know ({', '.join(known)}): refusing to edit rope "
                        "parameters", where=loc)


def infer(value) -> GType:
    """The GGUF type of a new key from its YAML value."""
    if isinstance(value, list):
        if not value:
            return GType(ARRAY, 4)
        return GType(ARRAY, infer(value[0]).vtype)
    if isinstance(value, bool):
        return GType(7)
    if isinstance(value, int):
        return GType(4 if 0 <= value < 2**32 else 11)
    if isinstance(value, float):
        return GType(6)
    if isinstance(value, str):
        return GType(STRING)
    raise ValueError(f"no GGUF type for {value!r}")


def _plain(kv: KeyValue):
    """The value for the manifest's change log: long values shortened, like the plan."""
    if kv.vtype == ARRAY and kv.count > 8:
        return f"[{kv.count} items]"
    value = kv.value
    if isinstance(value, str) and len(value) > 200:
        return f"{value[:180]}... ({len(value)} chars)"
    return value


def _sourced(op: MetaOp, recipe, model):
    kind, name, pointer, _first = op.source
    if kind == "recipe":
        if op.fetch is not None:
            raise PlanError(f"from: {name}: not read (the recipe is not bound to a model)",
                            where=op.loc)
        if pointer is None or not isinstance(op.content, str):
            return op.content
        return _pointed(op, name, op.content, pointer, name)
    path = model.root / name
    if name not in model.files:
        raise PlanError(f"from_model: {name} is not in the model directory", where=op.loc)
    try:
        data = read_capped(path, MAX_VALUE_FILE)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the value file: {getattr(exc, 'strerror', None) or exc}",
                         where=path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("the value file is not UTF-8", where=path) from None
    return text if pointer is None else _pointed(op, name, text, pointer, path)


def _pointed(op: MetaOp, name: str, text: str, pointer: str, where):
    """The JSON value at ``pointer`` (``path:``) in ``text``, the content of ``name``."""
    from ..config.json_pointer import MISSING, resolve

    try:
        value = resolve(json.loads(text), pointer)
    except ValueError as exc:
        raise InputError(f"not JSON: {exc}", where=where) from None
    if value is MISSING:
        raise PlanError(f"{name} has nothing at {pointer}", where=op.loc)
    return value
