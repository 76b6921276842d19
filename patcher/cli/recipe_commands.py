"""``modelpatch recipes list|show``: the built-in recipes and their parameters. Registered on the
main group by ``commands``."""

from __future__ import annotations

import json

import click


@click.group()
def recipes() -> None:
    """List and show the built-in recipes."""


@recipes.command("list")
def recipes_list() -> None:
    """List the built-in recipes with their descriptions."""
    import shutil

    from ..recipe.load import builtin_recipe_dir, load_recipe
    from .render import shorten

    width = shutil.get_terminal_size().columns       # $COLUMNS, the terminal, else 80
    for path in sorted(builtin_recipe_dir().glob("*.yaml")):
        recipe = load_recipe(path)
        click.echo(f"{recipe.name:<22} {shorten(recipe.description, width - 23)}")
        if recipe.params:
            params = " ".join(f"{p.name}={_param_default(p)}" for p in recipe.params)
            click.echo(" " * 23 + shorten(f"--set {params}", width - 23))


def _param_default(param) -> str:
    from ..recipe.schema import REQUIRED

    return "REQUIRED" if param.default is REQUIRED else json.dumps(param.default)


@recipes.command("show")
@click.argument("name")
def recipes_show(name: str) -> None:
    """Print the built-in recipe NAME (or a recipe file), then its parameters."""
    from ..recipe.load import load_recipe, resolve_recipe

    path = resolve_recipe(name)
    click.echo(path.read_text(encoding="utf-8"), nl=False)
    params = load_recipe(path).params
    if params:
        click.echo("\n# Parameters (apply/plan --set NAME=VALUE):")
    for p in params:
        click.echo(f"#   {p.name} ({p.type}, default {_param_default(p)}): {p.description}")
