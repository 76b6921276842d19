"""The files a recipe names: ``include:`` (a built-in or a recipe file beside the including one,
loaded once each, within the include budgets) and ``files: add ... from:`` (a text file in the
recipe's directory, pinned by its sha256)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import InputError, RecipeError, UnsafeName
from ...names import checked_name
from .. import checks as rc
from ..schema import Include
from .parse import has_templates, range_problem, template_value, type_problem

INCLUDE_KEYS = ("recipe", "params")
INCLUDE_REQUIRED = ("recipe",)

#: Include budgets, for the whole recipe being loaded: how deep includes nest, how many
#: distinct recipe files are read (each once: a file included twice is read once), and how many
#: include items the recipe expands to (binding walks every one).
MAX_INCLUDE_DEPTH = 8
MAX_INCLUDE_FILES = 64
MAX_INCLUDES = 256


def local_name(text: str, what: str) -> str:
    """``text`` (a recipe's ``include:`` or ``from:`` file) as a name relative to the recipe's
    directory: leading ``./`` dropped, then checked by ``patcher.names`` (no absolute path, no
    ``..``, no dot-directory). ``UnsafeName`` otherwise."""
    name = text
    while name.startswith("./"):
        name = name[2:].lstrip("/")
    return checked_name(name, what=what)


def include_path(text: str, including: Path | None, what: str = "the include path") -> Path:
    """The file of ``include: TEXT`` (or of a rule's ``fix.recipe``): a built-in name, else a
    path relative to the including file's directory (the current directory for a recipe given
    as text), never outside it."""
    from ..load import is_builtin_name, resolve_recipe

    if is_builtin_name(text):
        return resolve_recipe(text)
    name = local_name(text, what)
    base = including.parent if including is not None else Path.cwd()
    path = base / name
    if not path.resolve().is_relative_to(base.resolve()):
        raise InputError(f"{text!r} leads outside the directory {base} of "
                         f"{including.name if including else 'the recipe'} (through a symlink)")
    if not path.is_file():
        raise InputError(f"no recipe file {text!r} (looked at {path})")
    return path


def expanded_includes(recipe: Any) -> int:
    """How many include items ``recipe`` expands to, nested ones counted each time they occur
    (what binding walks; at most ``MAX_INCLUDES`` for a loaded recipe, so this is cheap)."""
    return sum(1 + expanded_includes(inc.recipe) for inc in recipe.includes)


MAX_FROM_BYTES = 16 << 20


def read_beside(v: rc.Validator, name: str, pos: rc.Pos) -> tuple[str, dict] | None:
    """``files: add ... from: NAME``: the UTF-8 text of NAME, a file in the recipe's directory
    (or below it; never outside, never through a symlink that leads outside), and
    ``{"from": NAME, "sha256": ...}`` to pin it in the plan and manifest."""
    import hashlib

    from ...fsops import NotRegularFile, TooLarge, read_capped

    if v.recipe_path is None:
        v.err(pos, "from: needs a recipe read from a file (it names a file next to the recipe)")
        return None
    base = Path(v.recipe_path).resolve().parent
    try:
        target = (base / local_name(name, "from:")).resolve()
    except UnsafeName as exc:
        v.err(pos, f"{exc.message}: from: reads only files in the recipe's directory, never "
              "outside the recipe's directory or in a dot-directory")
        return None
    if not target.is_relative_to(base):
        v.err(pos, f"from: {name!r} is outside the recipe's directory {base}")
        return None
    try:
        data = read_capped(target, MAX_FROM_BYTES)
        text = data.decode("utf-8")
    except (FileNotFoundError, IsADirectoryError, NotRegularFile):
        v.err(pos, f"from: no such file {name!r} next to the recipe")
        return None
    except TooLarge:
        v.err(pos, f"from: {name!r} is larger than {MAX_FROM_BYTES >> 20} MiB")
        return None
    except UnicodeDecodeError:
        v.err(pos, f"from: {name!r} is not UTF-8 text")
        return None
    except OSError as exc:
        v.err(pos, f"from: cannot read {name!r}: {exc.strerror or exc}")
        return None
    return text, {"from": name, "sha256": hashlib.sha256(data).hexdigest()}


def parse_include(v: rc.Validator, node: Any, pos: tuple[int, int]) -> Include | None:
    """``include: NAME`` or ``{recipe: NAME, params: {...}}``: the recipe, loaded now."""
    if isinstance(node, str):
        node = {"recipe": node}
        values_node: Any = {}
    elif rc.is_map(node):
        v.check_keys(node, INCLUDE_KEYS, "include", required=INCLUDE_REQUIRED)
        values_node = node.get("params") or {}
    else:
        v.err(pos, f"an include is a recipe name or path, or {{recipe: NAME, params: {{...}}}}; "
              f"got {rc.yaml_type(node)}")
        return None
    name = v.check_string(node.get("recipe"), pos) if "recipe" in node else None
    if name is None:
        return None
    if len(v.including) >= MAX_INCLUDE_DEPTH:
        v.err(pos, f"include {name!r}: includes nest deeper than {MAX_INCLUDE_DEPTH} recipes "
              "(the include depth budget)")
        return None
    try:
        path = include_path(name, v.recipe_path)
        key = str(path.resolve())
        if key in v.including:
            v.err(pos, f"include {name!r} includes itself (through "
                  f"{' -> '.join(Path(p).name for p in v.including)})")
            return None
        included = v.include_cache.get(key)
        if included is None:
            if len(v.include_cache) >= MAX_INCLUDE_FILES:
                v.err(pos, f"include {name!r}: more than {MAX_INCLUDE_FILES} recipe files "
                      "included in all (the include file budget)")
                return None
            from ..load import load_recipe

            included = load_recipe(path, _including=v.including, _cache=v.include_cache)
            v.include_cache[key] = included
    except (RecipeError, InputError) as exc:
        v.err(pos, f"include {name!r}: {exc}")
        return None
    v.include_count += 1 + expanded_includes(included)
    if v.include_count > MAX_INCLUDES:
        v.err(pos, f"include {name!r}: the recipe expands to more than {MAX_INCLUDES} includes "
              "(the include count budget)")
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
        problem = None if has_templates(value) else (
            type_problem(declared[key].type, value) or range_problem(declared[key], value))
        if problem:
            v.err(kpos, f"include {name!r}: parameter {key}: {problem}")
        values[key] = value
    return Include(included, values, v.loc(pos))
