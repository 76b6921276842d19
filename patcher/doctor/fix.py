"""``doctor --fix``: apply the fixing recipes of the findings, then diagnose the result.

One recipe: one ``apply`` (a hash-verified variant). Several: the first is applied out of place
and the rest stacked on the variant in place, each a revertible patch with its own manifest
entry (``modelpatch revert`` undoes them one by one). ``--in-place`` stacks them all on the model.
An ``hf://`` model is downloaded first, through ``apply hf://``'s path (``api.resolve_model``).
"""

from __future__ import annotations

from pathlib import Path

from ..remote.model import is_remote


def fixing_recipes(report: dict) -> list[str]:
    """The fix recipes of the findings, each once, blockers' first (findings come sorted)."""
    return list(dict.fromkeys(f["fix"]["recipe"] for f in report["findings"] if f["fix"]))


def apply_fixes(model: str, recipes: list[str], *, out: str | None, in_place: bool,
                endpoint: str | None, progress: bool) -> Path:
    """Apply ``recipes`` to ``model``; returns the directory that holds the result."""
    from .. import api

    local = model
    if is_remote(model):
        local = str(api.resolve_model(model, endpoint=endpoint, progress=progress))
        if out is None and not in_place:
            name = model[len(api.HF_SCHEME):].split("@")[0].split("/")[-1]
            out = f"{name}-{recipes[0] if len(recipes) == 1 else 'doctor'}"
    if in_place:
        for recipe in recipes:
            api.apply_in_place(recipe, local)
        return Path(local)
    if out is None and len(recipes) > 1:
        out = f"{Path(local)}-doctor"
    result = api.apply(recipes[0], local, out=out)
    for recipe in recipes[1:]:
        api.apply_in_place(recipe, result.output)
    return Path(result.output)
