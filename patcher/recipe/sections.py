"""The ``requires:``, ``config:`` and ``files:`` sections of a recipe: validation of their
items into the typed conditions and operations of ``patcher.recipe.schema``.

The key tables below are also what ``patcher.recipe.json_schema`` builds the JSON Schema from."""

from __future__ import annotations

from typing import Any

from . import checks as rc
from .config_arrays import parse_array_op
from .schema import (
    PATCH_OP_OPERAND,
    AddFile,
    AllOf,
    AnyOf,
    Check,
    Condition,
    ConfigOp,
    DropFile,
    DropOp,
    FileOp,
    Not,
    PatchOp,
    RenameOp,
    SetOp,
)
from .sources import parse_from

PREDICATES = ("exists", "equals", "contains", "one_of")
COMBINATORS = ("any_of", "all_of", "not")
COMBINATOR_KEYS = ("in", "message")              # beside the combinator itself
LEAF_KEYS = ("file", "path", *PREDICATES, "in", "message")
LEAF_REQUIRED = ("file", "path")
CONFIG_ACTIONS = ("drop", "set", "rename", "architectures", "model_type", "op")
CONFIG_KEYS = {
    "drop": ("drop", "in", "missing_ok"),
    "set": ("set", "value", "from", "sha256", "in", "create_parents"),
    "rename": ("rename", "to", "in", "missing_ok"),
    "architectures": ("architectures", "in"),
    "model_type": ("model_type", "in"),
    "op": ("op", "path", "value", "from", "in", "missing_ok"),
}
CONFIG_REQUIRED = {"rename": ("to",), "op": ("path",)}
SET_SOURCES = ("value", "from")                 # set: takes exactly one
PATCH_OPS = tuple(PATCH_OP_OPERAND)
FILE_KEYS = {"drop": ("drop", "missing_ok"),
             "add": ("add", "content", "from", "sha256", "overwrite")}
ADD_SOURCES = ("content", "from")               # files: add takes exactly one


# ---------------------------------------------------------------------------- conditions

def parse_condition(v: rc.Validator, node: Any, pos: tuple[int, int]) -> Condition | None:
    if not rc.is_map(node):
        v.err(pos, f"a condition must be a mapping such as {{file: config.json, path: /x, "
              f"exists: true}}; got {rc.yaml_type(node)}")
        return None
    loc = v.loc(pos)
    combos = [k for k in node if k in COMBINATORS]
    if len(combos) > 1:
        v.err(rc.key_pos(node, combos[1]), f"a condition has one of any_of, all_of, not; "
              f"found {combos[0]!r} and {combos[1]!r} (nest them instead)")
        return None
    if combos:
        kind = combos[0]
        v.check_keys(node, (kind, *COMBINATOR_KEYS), f"'{kind}' condition",
                     suggest=(*LEAF_KEYS, *COMBINATORS))
        scopes = v.scopes(node)
        message = v.string(node, "message")
        if kind == "not":
            child = node[kind]
            inner = parse_condition(v, child, rc.val_pos(node, kind))
            return None if inner is None else Not(inner, scopes, message, loc)
        children = [parse_condition(v, n, p) for n, p in v.items(node, kind, nonempty=True)]
        if any(c is None for c in children):
            return None
        cls = AnyOf if kind == "any_of" else AllOf
        return cls(tuple(children), scopes, message, loc)
    unknown = v.check_keys(node, LEAF_KEYS, "condition", required=LEAF_REQUIRED,
                           suggest=(*LEAF_KEYS, *COMBINATORS))
    file = v.filename(node, "file")
    path = v.pointer(node, "path")
    scopes = v.scopes(node)
    message = v.string(node, "message")
    preds = [k for k in node if k in PREDICATES]
    if not preds:
        if not unknown:
            v.err(pos, "a condition needs one of exists, equals, contains, one_of "
                  "(or any_of, all_of, not)")
        return None
    if len(preds) > 1:
        v.err(rc.key_pos(node, preds[1]), f"a condition has one predicate; found {preds[0]!r} "
              f"and {preds[1]!r} (combine them with all_of)")
        return None
    pred = preds[0]
    if pred == "exists":
        expected = v.boolean(node, "exists")
    elif pred == "one_of":
        values = [v.json_value(n, p) for n, p in v.items(node, "one_of", nonempty=True)]
        expected = rc.INVALID if not values or any(x is rc.INVALID for x in values) else values
    else:
        expected = v.json_value(node[pred], rc.val_pos(node, pred))
    if file is None or path is None or expected is rc.INVALID:
        return None
    return Check(file, path, pred, expected, scopes, message, loc)


# ---------------------------------------------------------------------------- config ops

def parse_config(v: rc.Validator, root: Any) -> dict[str, tuple[ConfigOp, ...]]:
    if "config" not in root:
        return {}
    section = root["config"]
    if section is None:
        return {}
    if not rc.is_map(section):
        v.err(rc.val_pos(root, "config"), "config: must map file names to lists of operations, "
              f"e.g. {{config.json: [{{drop: /x}}]}}; got {rc.yaml_type(section)}")
        return {}
    out: dict[str, tuple[ConfigOp, ...]] = {}
    in_step: list[tuple[str, ConfigOp]] = []
    for key in section:
        name = v.check_filename(key, rc.key_pos(section, key))
        ops = []
        for n, p in v.items(section, key):
            array = [k for k in ("each", "append") if rc.is_map(n) and k in n]
            if len(array) == 1 and not any(k in n for k in CONFIG_ACTIONS):
                made = parse_array_op(v, n, array[0], name, p)
                ops.extend(op for _, op in made[:1])
                in_step.extend(made[1:])
            else:
                ops.append(_config_op(v, n, p))
        if name is not None:
            out[name] = tuple(op for op in ops if op is not None)
    for file, op in in_step:
        out[file] = out.get(file, ()) + (op,)
    return out


def _config_op(v: rc.Validator, node: Any, pos: tuple[int, int]) -> ConfigOp | None:
    if not rc.is_map(node):
        v.err(pos, "a config operation must be a mapping such as {drop: /x}; got "
              f"{rc.yaml_type(node)}")
        return None
    actions = [k for k in node if k in CONFIG_ACTIONS]
    all_keys = tuple(dict.fromkeys(k for keys in CONFIG_KEYS.values() for k in keys))
    if not actions:
        if not v.check_keys(node, all_keys, "config operation"):   # only keys of no action
            v.err(pos, "a config operation needs one of: " + ", ".join(CONFIG_ACTIONS))
        return None
    if len(actions) > 1:
        v.err(rc.key_pos(node, actions[1]), f"one operation per list item; found "
              f"{actions[0]!r} and {actions[1]!r}")
        return None
    action = actions[0]
    required = CONFIG_REQUIRED.get(action, ())
    if action == "set" and not any(k in node for k in SET_SOURCES):
        required = SET_SOURCES[:1]
    v.check_keys(node, CONFIG_KEYS[action], f"'{action}' operation", required=required,
                 suggest=all_keys)
    loc = v.loc(pos)
    scopes = v.scopes(node)
    if action == "drop":
        path = v.pointer(node, "drop", allow_root=False)
        missing_ok = v.boolean(node, "missing_ok", default=False)
        return None if path is None else DropOp(path, scopes, missing_ok, loc)
    if action == "set" and "from" in node:
        return _set_from(v, node, pos, scopes, loc)
    if action == "set":
        path = v.pointer(node, "set", allow_root=False)
        value = v.json_value(node["value"], rc.val_pos(node, "value")) if "value" in node \
            else rc.INVALID
        create_parents = v.boolean(node, "create_parents", default=True)
        if path is None or value is rc.INVALID:
            return None
        return SetOp(path, value, scopes, loc, create_parents=create_parents)
    if action == "rename":
        path = v.pointer(node, "rename", allow_root=False)
        to = v.pointer(node, "to", allow_root=False)
        missing_ok = v.boolean(node, "missing_ok", default=False)
        if path is None or to is None:
            return None
        if to == path or to.startswith(path + "/"):
            v.err(rc.val_pos(node, "to"), f"cannot rename {path} to {to} (inside itself)")
            return None
        return RenameOp(path, to, scopes, missing_ok, loc)
    if action == "architectures":
        archs = [v.check_string(n, p) for n, p in v.items(node, "architectures", nonempty=True)]
        if not archs or None in archs:
            return None
        return SetOp("/architectures", archs, scopes, loc, label="architectures")
    if action == "model_type":
        model_type = v.string(node, "model_type")
        return None if model_type is None else SetOp("/model_type", model_type, scopes, loc,
                                                     label="model_type")
    return _patch_op(v, node, scopes, loc)


def _patch_op(v: rc.Validator, node: Any, scopes: tuple[str, ...], loc: str) -> PatchOp | None:
    op = v.choice(node, "op", PATCH_OPS)
    path = v.pointer(node, "path")
    if op is None or path is None:
        return None
    needs_value = PATCH_OP_OPERAND[op] == "value"
    needs_from = PATCH_OP_OPERAND[op] == "from"
    for key, needed in (("value", needs_value), ("from", needs_from)):
        if needed and key not in node:
            v.err(v.pos_of(node), f"'{op}' needs '{key}'")
            return None
        if not needed and key in node:
            v.err(rc.key_pos(node, key), f"'{op}' takes no '{key}'")
            return None
    value = v.json_value(node["value"], rc.val_pos(node, "value")) if needs_value else None
    from_path = v.pointer(node, "from") if needs_from else None
    if value is rc.INVALID or (needs_from and from_path is None):
        return None
    if op == "move" and from_path is not None and path.startswith(from_path + "/"):
        v.err(rc.val_pos(node, "path"), f"cannot move {from_path} into its own child {path}")
        return None
    if "missing_ok" in node and op not in PatchOp.MISSING_OK_OPS:
        v.err(rc.key_pos(node, "missing_ok"), f"'{op}' takes no 'missing_ok' (only "
              f"{', '.join(PatchOp.MISSING_OK_OPS)} read a path that may be missing)")
        return None
    missing_ok = v.boolean(node, "missing_ok", default=False)
    return PatchOp(op, path, value, from_path, scopes, loc, missing_ok)


def _set_from(v: rc.Validator, node: Any, pos: tuple[int, int], scopes: tuple[str, ...],
              loc: str) -> SetOp | None:
    """``set: /path`` with ``from:`` (a file's text, or ``#/pointer``'s JSON value)."""
    if "value" in node:
        v.err(rc.key_pos(node, "value"), "'set' takes 'value' or 'from', not both")
        return None
    path = v.pointer(node, "set", allow_root=False)
    found = parse_from(v, node, pos)
    if path is None or found is None:
        return None
    create_parents = v.boolean(node, "create_parents", default=True)
    return SetOp(path, found.pop("content", None), scopes, loc, create_parents=create_parents,
                 **found)


# ------------------------------------------------------------------------------ file ops

def parse_file_op(v: rc.Validator, node: Any, pos: tuple[int, int]) -> FileOp | None:
    if not rc.is_map(node):
        v.err(pos, f"a file operation must be a mapping such as {{drop: name}}; got "
              f"{rc.yaml_type(node)}")
        return None
    actions = [k for k in node if k in FILE_KEYS]
    all_keys = tuple(dict.fromkeys(k for keys in FILE_KEYS.values() for k in keys))
    if len(actions) != 1:
        if len(actions) > 1:
            v.err(rc.key_pos(node, actions[1]), "one operation per list item; found 'drop' and "
                  "'add'")
        elif not v.check_keys(node, all_keys, "file operation"):
            v.err(pos, "a file operation needs 'drop' or 'add'")
        return None
    action = actions[0]
    v.check_keys(node, FILE_KEYS[action], f"'{action}' file operation", suggest=all_keys)
    name = v.filename(node, action)
    loc = v.loc(pos)
    if action == "drop":
        missing_ok = v.boolean(node, "missing_ok", default=True)
        return None if name is None else DropFile(name, missing_ok, loc)
    if sum(k in node for k in ADD_SOURCES) != 1:
        v.err(pos, "files: add needs one of 'content' (the text) and 'from' (a file next to the "
              "recipe)")
        return None
    overwrite = v.boolean(node, "overwrite", default=False)
    if "from" in node:
        found = parse_from(v, node, rc.val_pos(node, "from"))
        if name is None or found is None:
            return None
        return AddFile(name, found.pop("content", None), overwrite, loc, **found)
    if "sha256" in node:
        v.err(rc.key_pos(node, "sha256"), "sha256: pins the content of 'from:'; "
              "it takes no 'content:'")
        return None
    content = v.string(node, "content", nonempty=False)
    return None if name is None or content is None else AddFile(name, content, overwrite, loc)
