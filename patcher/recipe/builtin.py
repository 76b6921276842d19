"""Where recipes come from: a file path, or the name of a built-in recipe in ``recipes/``."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from ..errors import InputError


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
