"""``modelpatch recipes list|show|schema``: the built-in recipes and their parameters, and the
recipe JSON Schema. Registered on the main group by ``commands``."""

from __future__ import annotations

import json

import click

from .options import json_option
from .output import echo, echo_json


@click.group()
def recipes() -> None:
    """List and show the built-in recipes; print the recipe JSON Schema."""


@recipes.command("list")
@json_option("Machine-readable list: each recipe's name, description and parameters.")
def recipes_list(as_json: bool) -> None:
    """List the built-in recipes with their descriptions."""
    import shutil

    from ..recipe.load import builtin_recipe_dir, load_recipe
    from .render import shorten

    found = [load_recipe(path) for path in sorted(builtin_recipe_dir().glob("*.yaml"))]
    if as_json:
        echo_json([{"name": r.name, "description": r.description,
                    "params": [_param_json(p) for p in r.params]} for r in found])
        return
    width = shutil.get_terminal_size().columns       # $COLUMNS, the terminal, else 80
    pad = max([22] + [len(r.name) for r in found]) + 1
    for recipe in found:
        echo(f"{recipe.name:<{pad - 1}} {shorten(recipe.description, width - pad)}")
        if recipe.params:
            params = " ".join(f"{p.name}={_param_default(p)}" for p in recipe.params)
            echo(" " * pad + shorten(f"--set {params}", width - pad))


def _param_default(param) -> str:
    from ..recipe.schema import REQUIRED

    return "REQUIRED" if param.default is REQUIRED else json.dumps(param.default)


def _param_json(param) -> dict:
    from ..recipe.schema import REQUIRED

    data = {"name": param.name, "type": param.type, "required": param.default is REQUIRED,
            "default": None if param.default is REQUIRED else param.default,
            "description": param.description}
    for key in ("minimum", "maximum", "exclusive_minimum", "enum"):
        value = getattr(param, key)
        if value is not None:
            data[key] = list(value) if key == "enum" else value
    return data


@recipes.command("show")
@click.argument("name")
@json_option("Machine-readable recipe: name, description, path, sha256, text and parameters.")
def recipes_show(name: str, as_json: bool) -> None:
    """Print the built-in recipe NAME (or a recipe file), then its parameters."""
    from ..recipe.load import load_recipe, resolve_recipe
    from ..recipe.params.parse import range_text

    path = resolve_recipe(name)
    text = path.read_text(encoding="utf-8")
    recipe = load_recipe(path)
    if as_json:
        echo_json({"name": recipe.name, "description": recipe.description, "path": str(path),
                   "sha256": recipe.sha256, "text": text,
                   "params": [_param_json(p) for p in recipe.params]})
        return
    echo(text, nl=False)
    params = recipe.params
    if params:
        echo("\n# Parameters (apply/plan --set NAME=VALUE):")
    for p in params:
        within = range_text(p)
        echo(f"#   {p.name} ({p.type}{' ' + within if within else ''}, default "
             f"{_param_default(p)}): {p.description}")


@recipes.command("schema")
def recipes_schema() -> None:
    """Print the recipe JSON Schema (Draft 2020-12) that editors check recipes with; it is
    built from the checks the loader makes (patcher/schemas/recipe.schema.json is a copy)."""
    from ..recipe.json_schema import schema_text

    echo(schema_text(), nl=False)
