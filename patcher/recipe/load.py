"""Recipes: loading, validation and lookup (a file path, or the name of a built-in recipe in
``recipes/``).

A recipe is a YAML document (see ``recipes/sm120-fp16-kv.yaml``, and the JSON Schema that
``patcher.recipe.json_schema`` builds from the key tables here and in the section modules)::

    modelpatch: 1                 # format version
    name: my-fix                  # [a-z0-9][a-z0-9._-]*
    description: what and why
    requires: [condition, ...]    # guards; all must hold
    config: {file.json: [op, ...]}
    files: [{drop: name} | {add: name, content: text}, ...]
    tensors: [{select: {...}, <action>: ...}, ...]
    output: {max_shard_size: 5GB} # reshard the variant (see patcher.plan.resharding)

``load_recipe`` checks everything it can without a model and reports every problem at once, each
as ``recipe.yaml:LINE:COL: message``. The typed result is defined in ``patcher.recipe.schema``.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import InputError, RecipeError, YamlProblems
from ..fsops import NotRegularFile, TooLarge, read_capped
from . import checks as rc
from .guards import check_guards, evaluate_guards  # noqa: F401  (re-exported)
from .params.include import parse_include
from .params.parse import parse_params, template_ops
from .schema import RECIPE_FORMAT_VERSIONS, ConfigOp, DropFile, FileOp, OutputLayout, Recipe
from .sections import parse_condition, parse_config, parse_file_op
from .tensor_ops.parse import parse_tensor_op
from .yaml_safe import MAX_RECIPE_BYTES, compose_recipe

__all__ = ["load_recipe", "load_recipes", "evaluate_guards", "check_guards", "builtin_recipe_dir",
           "builtin_recipe_names", "resolve_recipe", "Recipe"]

TOP_KEYS = ("modelpatch", "name", "description", "params", "include", "requires", "config",
            "files", "tensors", "output", "gguf")
REQUIRED_TOP_KEYS = ("modelpatch", "name", "description")
OUTPUT_KEYS = ("max_shard_size",)


# ------------------------------------------------------------------------------ loading

def load_recipe(path_or_text: str | bytes | os.PathLike, *,
                source_name: str | None = None, _including: tuple[str, ...] = (),
                _cache: dict | None = None) -> Recipe:
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
        # a built-in is named by its real file (recipes/NAME.yaml), as plan and recipes show do
        shown = path.resolve() if path.parent == builtin_recipe_dir() else path
        source = source_name or str(shown)
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
    v.include_cache = _cache if _cache is not None else {}     # shared by every include
    fields = _top_level(v, root)
    if v.problems:
        raise recipe_error(source, v.problems)
    return Recipe(**fields, text=text, sha256=hashlib.sha256(data).hexdigest(), source=source,
                  path=path)


def load_recipes(recipe: str | os.PathLike | Recipe | list | tuple) -> Recipe:
    """A recipe from a path, a built-in name, or an already loaded ``Recipe``; a list of those
    is one recipe applying each in order (``recipe.params.bind.combine``)."""
    if isinstance(recipe, (list, tuple)):
        if not recipe:
            raise InputError("no recipe given")
        from .params.bind import combine

        loaded = [load_recipes(r) for r in recipe]
        names = [r.name for r in loaded]
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise InputError(f"recipe {twice!r} given twice (each recipe applies once)")
        return combine(loaded)
    return recipe if isinstance(recipe, Recipe) else load_recipe(resolve_recipe(recipe))


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
    v.check_keys(root, TOP_KEYS, "recipe", required=REQUIRED_TOP_KEYS)
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
    declared = root.get("params")       # a parameter with a problem is still no unknown {name}
    v.param_names = {p.name for p in params} | (
        {n for n in declared if isinstance(n, str)} if rc.is_map(declared) else set())
    includes = tuple(i for i in (
        parse_include(v, node, pos) for node, pos in v.items(root, "include")) if i is not None)
    requires = tuple(c for c in (
        parse_condition(v, node, pos) for node, pos in v.items(root, "requires")) if c is not None)
    config = template_ops(v, parse_config(v, root), v.param_names)
    files = tuple(f for f in (
        parse_file_op(v, node, pos) for node, pos in v.items(root, "files")) if f is not None)
    tensors = tuple(t for t in (
        parse_tensor_op(v, node, pos) for node, pos in v.items(root, "tensors")) if t is not None)
    _cross_check(v, root, config, files)
    from .gguf_section import parse_section

    return dict(format_version=version, name=name, description=description, requires=requires,
                config=config, files=files, tensors=tensors, output=_output(v, root),
                params=params, includes=includes, gguf=parse_section(v, root))


def _output(v: rc.Validator, root: Any) -> OutputLayout | None:
    node = root.get("output")
    if node is None:
        return None
    if not rc.is_map(node):
        v.err(rc.val_pos(root, "output"), "output: must be a mapping such as "
              f"{{max_shard_size: 5GB}}; got {rc.yaml_type(node)}")
        return None
    v.check_keys(node, OUTPUT_KEYS, "output")
    size = None
    if "max_shard_size" in node:
        from ..units import parse_shard_size

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


# -------------------------------------------------------------------------------- lookup


def builtin_recipe_dir() -> Path:
    """The directory of built-in recipes (``patcher/builtin_recipes``, a link to ``recipes/``)."""
    return Path(__file__).resolve().parent.parent / "builtin_recipes"


def builtin_recipe_names() -> list[str]:
    """Names (file stems) of the built-in recipes, sorted."""
    directory = builtin_recipe_dir()
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.iterdir()
                  if p.suffix in (".yaml", ".yml") and p.is_file())


def is_builtin_name(text: str) -> bool:
    """A bare word (no ``/``, no ``.yaml``/``.yml`` suffix) names a built-in recipe, always:
    a file of that name in the current directory (a cloned model repo can ship one) never
    shadows it. Anything else is a path."""
    return not ("/" in text or os.sep in text or text.endswith((".yaml", ".yml")))


def resolve_recipe(name_or_path: str | os.PathLike) -> Path:
    """The recipe file for a built-in recipe name or a path (see ``is_builtin_name``; a
    ``pathlib.Path`` is always a path).

    Raises:
        InputError: no such built-in recipe, or no such file; the message lists the built-ins.
    """
    text = os.fspath(name_or_path)
    names = builtin_recipe_names()
    if is_builtin_name(text) and not isinstance(name_or_path, os.PathLike):
        if text in names:
            return next(builtin_recipe_dir() / (text + suffix) for suffix in (".yaml", ".yml")
                        if (builtin_recipe_dir() / (text + suffix)).is_file())
        what = f"no built-in recipe named {text!r}"
        if Path(text).is_file():
            what += f" (to run the file {text!r}, write ./{text})"
    else:
        path = Path(text)
        if path.is_file():
            return path
        builtin = builtin_recipe_dir() / text
        if "/" not in text and os.sep not in text and builtin.is_file():
            return builtin      # "sm120-fp16-kv.yaml", no such file here: the built-in's name
        what = f"no recipe file {text!r}"
    close = difflib.get_close_matches(Path(text).stem, names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else None
    available = ", ".join(names) if names else "none"
    raise InputError(f"{what} (built-in recipes: {available})", hint=hint)
