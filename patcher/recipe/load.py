"""Recipes: loading, validation and lookup.

A recipe is a YAML document (see ``recipes/sm120-fp16-kv.yaml`` and
``patcher/schemas/recipe.schema.json``)::

    modelpatch: 1                 # format version
    name: my-fix                  # [a-z0-9][a-z0-9._-]*
    description: what and why
    requires: [condition, ...]    # guards; all must hold
    config: {file.json: [op, ...]}
    files: [{drop: name} | {add: name, content: text}, ...]
    tensors: [{select: {...}, <action>: ...}, ...]
    output: {max_shard_size: 5GB} # reshard the variant (see patcher.tensors.resharding)

``load_recipe`` checks everything it can without a model and reports every problem at once, each
as ``recipe.yaml:LINE:COL: message``. The typed result is defined in ``patcher.recipe.schema``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from . import checks as rc
from ..errors import InputError, RecipeError, YamlProblems
from ..fsops import NotRegularFile, TooLarge, read_capped
from .builtin import (  # noqa: F401  (part of the public recipe API)
    builtin_recipe_dir, builtin_recipe_names, resolve_recipe)
from .guards import check_guards, evaluate_guards  # noqa: F401  (re-exported)
from ..config.arrays import parse_array_op
from .params import (INCLUDE_KEYS, has_templates, include_path, parse_params, template_ops,
                     template_value, type_problem)
from .sources import parse_from
from .schema import (RECIPE_FORMAT_VERSIONS, AddFile, AllOf, AnyOf, Check, ConfigOp, Condition,
                     DropFile, DropOp, FileOp, Include, Not, OutputLayout, PatchOp, Recipe,
                     RenameOp, SetOp)
from .tensor_ops import parse_tensor_op
from .yaml_safe import MAX_RECIPE_BYTES, compose_recipe

__all__ = ["load_recipe", "evaluate_guards", "check_guards", "builtin_recipe_dir",
           "builtin_recipe_names", "resolve_recipe", "Recipe"]

TOP_KEYS = ("modelpatch", "name", "description", "params", "include", "requires", "config",
            "files", "tensors", "output", "gguf")
PREDICATES = ("exists", "equals", "contains", "one_of")
COMBINATORS = ("any_of", "all_of", "not")
LEAF_KEYS = ("file", "path", *PREDICATES, "in", "message")
CONFIG_ACTIONS = ("drop", "set", "rename", "architectures", "model_type", "op")
CONFIG_KEYS = {
    "drop": ("drop", "in", "missing_ok"),
    "set": ("set", "value", "from", "sha256", "in", "create_parents"),
    "rename": ("rename", "to", "in", "missing_ok"),
    "architectures": ("architectures", "in"),
    "model_type": ("model_type", "in"),
    "op": ("op", "path", "value", "from", "in", "missing_ok"),
}
PATCH_OPS = ("add", "remove", "replace", "move", "copy", "test")
FILE_KEYS = {"drop": ("drop", "missing_ok"),
             "add": ("add", "content", "from", "sha256", "overwrite")}


# ------------------------------------------------------------------------------ loading

def load_recipe(path_or_text: str | bytes | os.PathLike, *,
                source_name: str | None = None, _including: tuple[str, ...] = ()) -> Recipe:
    """Load and validate a recipe.

    Args:
        path_or_text: a ``pathlib.Path`` (any ``os.PathLike``) is read as a file; ``bytes`` and a
            ``str`` containing a newline are recipe text; another ``str`` is a file path if such
            a file exists or it ends in ``.yaml``/``.yml``, else recipe text.
        source_name: the name locations start with (default: the path, or ``<recipe>``).
    Returns:
        A frozen ``Recipe``; ``text`` and ``sha256`` identify the exact source.
    Raises:
        RecipeError: the recipe is malformed; ``.errors`` lists every problem found.
        InputError: the file cannot be read.
    Example:
        >>> recipe = load_recipe(resolve_recipe("sm120-fp16-kv"))
    """
    path: Path | None = None
    if isinstance(path_or_text, os.PathLike):
        path = Path(path_or_text)
    elif isinstance(path_or_text, str) and "\n" not in path_or_text and (
            os.path.isfile(path_or_text) or path_or_text.endswith((".yaml", ".yml"))):
        path = Path(path_or_text)
    if path is not None:
        source = source_name or str(path)
        data = _read_capped(path, source)
    elif isinstance(path_or_text, (bytes, bytearray)):
        source = source_name or "<recipe>"
        data = bytes(path_or_text)
    else:
        source = source_name or "<recipe>"
        data = str(path_or_text).encode("utf-8", "surrogatepass")
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(f"recipe is {len(data)} bytes; the limit is {MAX_RECIPE_BYTES} (1 MiB)",
                          where=source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"recipe is not valid UTF-8 (byte {exc.start})", where=source) from None
    try:
        root = compose_recipe(text[1:] if text.startswith("\ufeff") else text)
    except YamlProblems as exc:
        raise recipe_error(source, exc.problems) from None
    v = rc.Validator(source)
    v.recipe_path = path
    v.including = (*_including, str(path.resolve()) if path is not None else source)
    fields = _top_level(v, root)
    if v.problems:
        raise recipe_error(source, v.problems)
    return Recipe(**fields, text=text, sha256=hashlib.sha256(data).hexdigest(), source=source,
                  path=path)


def _read_capped(path: Path, source: str) -> bytes:
    try:
        return read_capped(path, MAX_RECIPE_BYTES)
    except FileNotFoundError:
        raise InputError("no such recipe file", where=source) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a recipe file", where=source) from None
    except NotRegularFile:
        raise InputError("not a regular file", where=source) from None
    except TooLarge as exc:
        raise RecipeError(f"recipe is {exc.size} bytes; the limit is {MAX_RECIPE_BYTES} (1 MiB)",
                          where=source) from None
    except OSError as exc:
        raise InputError(f"cannot read recipe: {exc.strerror or exc}", where=source) from None


def recipe_error(source: str, problems: list[tuple[int, int, str]]) -> RecipeError:
    ordered = sorted(problems, key=lambda p: (p[0], p[1]))
    line, col, message = ordered[0]
    if len(ordered) > 1:
        message += f" (and {len(ordered) - 1} more)"
    err = RecipeError(message, where=f"{source}:{line}:{col}")
    err.errors = [f"{source}:{ln}:{cl}: {msg}" for ln, cl, msg in ordered]
    return err


# ---------------------------------------------------------------------------- top level

def _top_level(v: rc.Validator, root: Any) -> dict[str, Any]:
    if root is None:
        v.err((1, 1), "the recipe is empty")
        return {}
    if not rc.is_map(root):
        v.err(rc.node_pos(root, (1, 1)), "a recipe must be a mapping with keys modelpatch, "
              f"name, description...; got {rc.yaml_type(root)}")
        return {}
    v.check_keys(root, TOP_KEYS, "recipe", required=("modelpatch", "name", "description"))
    version = v.integer(root, "modelpatch")
    if version is not None and version not in RECIPE_FORMAT_VERSIONS:
        v.problems.clear()  # a newer format may mean anything else; report only this
        v.err(rc.val_pos(root, "modelpatch"),
              f"unknown recipe format version {version} (this modelpatch reads version "
              f"{', '.join(map(str, RECIPE_FORMAT_VERSIONS))}; upgrade modelpatch?)")
        return {}
    name = v.string(root, "name")
    if name is not None and not rc.NAME_RE.match(name):
        v.err(rc.val_pos(root, "name"), f"recipe name {name!r} must match "
              "[a-z0-9][a-z0-9._-]* and be at most 100 characters")
    description = v.string(root, "description")
    params = parse_params(v, root)
    v.param_names = {p.name for p in params}
    includes = tuple(i for i in (
        _include(v, node, pos) for node, pos in v.items(root, "include")) if i is not None)
    requires = tuple(c for c in (
        parse_condition(v, node, pos) for node, pos in v.items(root, "requires")) if c is not None)
    config = template_ops(v, _config(v, root), v.param_names)
    files = tuple(f for f in (
        _file_op(v, node, pos) for node, pos in v.items(root, "files")) if f is not None)
    tensors = tuple(t for t in (
        parse_tensor_op(v, node, pos) for node, pos in v.items(root, "tensors")) if t is not None)
    _cross_check(v, root, config, files)
    from ..gguf.recipe_section import parse_section

    return dict(format_version=version, name=name, description=description, requires=requires,
                config=config, files=files, tensors=tensors, output=_output(v, root),
                params=params, includes=includes, gguf=parse_section(v, root))


def _include(v: rc.Validator, node: Any, pos: tuple[int, int]) -> Include | None:
    """``include: NAME`` or ``{recipe: NAME, params: {...}}``: the recipe, loaded now."""
    if isinstance(node, str):
        node = {"recipe": node}
        values_node: Any = {}
    elif rc.is_map(node):
        v.check_keys(node, INCLUDE_KEYS, "include", required=("recipe",))
        values_node = node.get("params") or {}
    else:
        v.err(pos, f"an include is a recipe name or path, or {{recipe: NAME, params: {{...}}}}; "
              f"got {rc.yaml_type(node)}")
        return None
    name = v.check_string(node.get("recipe"), pos) if "recipe" in node else None
    if name is None:
        return None
    try:
        path = include_path(name, v.recipe_path)
        if str(path.resolve()) in v.including:
            v.err(pos, f"include {name!r} includes itself (through "
                  f"{' -> '.join(Path(p).name for p in v.including)})")
            return None
        included = load_recipe(path, _including=v.including)
    except (RecipeError, InputError) as exc:
        v.err(pos, f"include {name!r}: {exc}")
        return None
    if not rc.is_map(values_node):
        v.err(pos, f"include {name!r}: params must be a mapping")
        return None
    declared = {p.name: p for p in included.params}
    values = {}
    for key in values_node:
        kpos = rc.key_pos(values_node, key)
        if key not in declared:
            v.err(kpos, f"include {name!r}: it has no parameter {key!r} (it has: "
                  f"{', '.join(declared) or 'none'})")
            continue
        value = v.json_value(values_node[key], kpos)
        if value is rc.INVALID:
            continue
        value = template_value(v, value, kpos, v.param_names)
        problem = None if has_templates(value) else type_problem(declared[key].type, value)
        if problem:
            v.err(kpos, f"include {name!r}: parameter {key}: {problem}")
        values[key] = value
    return Include(included, values, v.loc(pos))


def _output(v: rc.Validator, root: Any) -> OutputLayout | None:
    node = root.get("output")
    if node is None:
        return None
    if not rc.is_map(node):
        v.err(rc.val_pos(root, "output"), "output: must be a mapping such as "
              f"{{max_shard_size: 5GB}}; got {rc.yaml_type(node)}")
        return None
    v.check_keys(node, ("max_shard_size",), "output")
    size = None
    if "max_shard_size" in node:
        from ..tensors.resharding import parse_shard_size

        try:
            size = parse_shard_size(node["max_shard_size"])
        except ValueError as exc:
            v.err(rc.val_pos(node, "max_shard_size"), str(exc))
    return OutputLayout(size, v.loc(rc.val_pos(root, "output")))


def _cross_check(v: rc.Validator, root: Any, config: dict[str, tuple[ConfigOp, ...]],
                 files: tuple[FileOp, ...]) -> None:
    seen: dict[str, str] = {}
    for op in files:
        line, col = (int(x) for x in op.loc.rsplit(":", 2)[1:])
        if op.path in seen:
            v.err((line, col), f"{op.path!r} already has a file operation at {seen[op.path]}")
        seen.setdefault(op.path, op.loc)
        if op.path in config:
            verb = "dropped" if isinstance(op, DropFile) else "added"
            v.err((line, col), f"{op.path!r} is both {verb} here and patched under config:; "
                  "do one or the other")


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
        v.check_keys(node, (kind, "in", "message"), f"'{kind}' condition",
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
    unknown = v.check_keys(node, LEAF_KEYS, "condition", required=("file", "path"),
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

def _config(v: rc.Validator, root: Any) -> dict[str, tuple[ConfigOp, ...]]:
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
        if not v.check_keys(node, (), "config operation", suggest=all_keys):
            v.err(pos, "a config operation needs one of: " + ", ".join(CONFIG_ACTIONS))
        return None
    if len(actions) > 1:
        v.err(rc.key_pos(node, actions[1]), f"one operation per list item; found "
              f"{actions[0]!r} and {actions[1]!r}")
        return None
    action = actions[0]
    required = {"set": () if "from" in node else ("value",), "rename": ("to",),
                "op": ("path",)}.get(action, ())
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
    needs_value = op in ("add", "replace", "test")
    needs_from = op in ("move", "copy")
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

def _file_op(v: rc.Validator, node: Any, pos: tuple[int, int]) -> FileOp | None:
    if not rc.is_map(node):
        v.err(pos, f"a file operation must be a mapping such as {{drop: name}}; got "
              f"{rc.yaml_type(node)}")
        return None
    actions = [k for k in node if k in FILE_KEYS]
    all_keys = ("drop", "missing_ok", "add", "content", "from", "overwrite")
    if len(actions) != 1:
        if len(actions) > 1:
            v.err(rc.key_pos(node, actions[1]), "one operation per list item; found 'drop' and "
                  "'add'")
        elif not v.check_keys(node, (), "file operation", suggest=all_keys):
            v.err(pos, "a file operation needs 'drop' or 'add'")
        return None
    action = actions[0]
    v.check_keys(node, FILE_KEYS[action], f"'{action}' file operation", suggest=all_keys)
    name = v.filename(node, action)
    loc = v.loc(pos)
    if action == "drop":
        missing_ok = v.boolean(node, "missing_ok", default=True)
        return None if name is None else DropFile(name, missing_ok, loc)
    if ("content" in node) == ("from" in node):
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


# -------------------------------------------------------------------------------- lookup
