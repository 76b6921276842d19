"""Where recipes come from: a file path, or the name of a built-in recipe in ``recipes/``."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from .errors import InputError


def builtin_recipe_dir() -> Path:
    """The directory of built-in recipes (``patcher/builtin_recipes``, a link to ``recipes/``)."""
    return Path(__file__).resolve().parent / "builtin_recipes"


def builtin_recipe_names() -> list[str]:
    """Names (file stems) of the built-in recipes, sorted."""
    directory = builtin_recipe_dir()
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.iterdir()
                  if p.suffix in (".yaml", ".yml") and p.is_file())


def resolve_recipe(name_or_path: str | os.PathLike) -> Path:
    """The recipe file for a path or a built-in recipe name.

    An existing file wins; otherwise a name (no ``/``) is looked up in ``builtin_recipe_dir()``.

    Raises:
        InputError: neither; the message lists the built-in names.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    text = os.fspath(name_or_path)
    names = builtin_recipe_names()
    if "/" not in text and os.sep not in text:
        for suffix in (".yaml", ".yml"):
            candidate = builtin_recipe_dir() / (Path(text).stem + suffix)
            if (Path(text).suffix in ("", suffix)) and candidate.is_file():
                return candidate
    close = difflib.get_close_matches(Path(text).stem, names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else None
    available = ", ".join(names) if names else "none"
    raise InputError(f"no recipe file or built-in recipe named {text!r} "
                     f"(built-in recipes: {available})", hint=hint)
