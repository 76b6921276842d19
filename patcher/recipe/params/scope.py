"""Which recipe a ``--set`` value goes to, when several recipes are applied together.

- ``--set RECIPE.NAME=VALUE`` gives parameter ``NAME`` of the recipe named ``RECIPE`` (one of
  those given on the command line; a parameter name has no dot, so the last dot splits).
- ``--set NAME=VALUE`` gives ``NAME`` to every recipe given that declares it, when they all
  declare it with the same type (the same kind of value, such as ``architectures`` of
  ``text-only`` and ``no-remote-code``). Declared with different types, the plain name is
  ambiguous and refused, naming the recipes and the scoped spelling to use.
- A scoped value wins over a plain one for its recipe, and takes that recipe out of the plain
  name's ambiguity check: ``--set yarn.factor=2 --set factor=x`` gives ``x`` to the others.
  A name no recipe declares is refused.

Included recipes take their values from their ``include:`` line, never from ``--set``.
"""

from __future__ import annotations

from typing import Any

from ...errors import InputError
from ..checks import did_you_mean


def split_values(recipes: list, values: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``{NAME: value}`` per recipe of ``recipes`` (``Recipe`` objects, in order)."""
    out: list[dict[str, Any]] = [{} for _ in recipes]
    scoped = {k: v for k, v in values.items() if "." in k}
    for key, value in values.items():
        if key not in scoped:
            for index in _declaring(recipes, key, scoped):
                out[index][key] = value
    for key, value in scoped.items():
        recipe_name, _, name = key.rpartition(".")
        targets = [i for i, r in enumerate(recipes) if r.name == recipe_name]
        if not targets:
            raise InputError(f"--set {key}: no recipe named {recipe_name!r} was given (given: "
                             f"{', '.join(r.name for r in recipes)})")
        for index in targets:
            declared = [p.name for p in recipes[index].params]
            if name not in declared:
                raise InputError(f"recipe {recipe_name!r} has no parameter {name!r} (it has: "
                                 f"{', '.join(declared) or 'none'})",
                                 hint=did_you_mean(name, declared))
            out[index][name] = value
    return out


def _declaring(recipes: list, name: str, scoped: dict[str, Any]) -> list[int]:
    """The recipes a plain ``--set NAME`` goes to (those declaring it that no ``RECIPE.NAME``
    in ``scoped`` already gives it to); InputError if none or ambiguous."""
    found = [(i, p) for i, r in enumerate(recipes) for p in r.params if p.name == name]
    unscoped = [(i, p) for i, p in found if f"{recipes[i].name}.{name}" not in scoped]
    if not found:
        if len(recipes) == 1:
            declared = [p.name for p in recipes[0].params]
            raise InputError(f"recipe {recipes[0].name!r} has no parameter {name!r} (it has: "
                             f"{', '.join(declared) or 'none'})",
                             hint=did_you_mean(name, declared))
        declared = sorted({p.name for r in recipes for p in r.params})
        raise InputError(f"no recipe given has a parameter {name!r} (they have: "
                         f"{', '.join(declared) or 'none'})", hint=did_you_mean(name, declared))
    if len({p.type for _, p in unscoped}) > 1:
        kinds = ", ".join(f"{recipes[i].name} declares it as {p.type} ({p.description})"
                          for i, p in unscoped)
        raise InputError(f"--set {name}: ambiguous: {kinds}",
                         hint="name the recipe: " + " or ".join(
                             f"--set {recipes[i].name}.{name}=VALUE" for i, _ in unscoped))
    return [i for i, _ in unscoped]
