"""``modelpatch recipes list|show|schema``: the built-in recipes and their parameters, and the
recipe JSON Schema. Registered on the main group by ``commands``."""

from __future__ import annotations

import json

import click

from .output import echo


@click.group()
def recipes() -> None:
    """List and show the built-in recipes; print the recipe JSON Schema."""


@recipes.command("list")
def recipes_list() -> None:
    """List the built-in recipes with their descriptions."""
    import shutil

    from ..recipe.load import builtin_recipe_dir, load_recipe
    from .render import shorten

    width = shutil.get_terminal_size().columns       # $COLUMNS, the terminal, else 80
    found = [load_recipe(path) for path in sorted(builtin_recipe_dir().glob("*.yaml"))]
    pad = max([22] + [len(r.name) for r in found]) + 1
    for recipe in found:
        echo(f"{recipe.name:<{pad - 1}} {shorten(recipe.description, width - pad)}")
        if recipe.params:
            params = " ".join(f"{p.name}={_param_default(p)}" for p in recipe.params)
            echo(" " * pad + shorten(f"--set {params}", width - pad))


def _param_default(param) -> str:
    from ..recipe.schema import REQUIRED

    return "REQUIRED" if param.default is REQUIRED else json.dumps(param.default)


@recipes.command("show")
@click.argument("name")
def recipes_show(name: str) -> None:
    """Print the built-in recipe NAME (or a recipe file), then its parameters."""
    from ..recipe.load import load_recipe, resolve_recipe
    from ..recipe.params.parse import range_text

    path = resolve_recipe(name)
    echo(path.read_text(encoding="utf-8"), nl=False)
    params = load_recipe(path).params
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
