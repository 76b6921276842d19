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
    """The fix recipes of the blockers' and warnings' findings, each once, blockers' first
    (findings come sorted). An ``info`` finding's fix is a choice (strip-mtp gives up MTP
    speculative decoding): the report names it, ``--fix`` leaves it to the user."""
    return list(dict.fromkeys(f["fix"]["recipe"] for f in report["findings"]
                              if f["fix"] and f["severity"] != "info"))


def fixing_params(report: dict) -> dict[str, dict]:
    """recipe -> the params its finding gives (the first finding naming it)."""
    params: dict[str, dict] = {}
    for f in report["findings"]:
        if f["fix"] and f["fix"].get("params"):
            params.setdefault(f["fix"]["recipe"], f["fix"]["params"])
    return params


def apply_fixes(model: str, recipes: list[str], *, out: str | None, in_place: bool,
                endpoint: str | None, progress: bool,
                params: dict[str, dict] | None = None) -> Path:
    """Apply ``recipes`` (with ``params``: recipe -> its params) to ``model``; returns the
    directory that holds the result."""
    params = params or {}
    from .. import api

    local = model
    if is_remote(model):
        local = str(api.resolve_model(model, endpoint=endpoint, progress=progress))
        if out is None and not in_place:
            name = model[len(api.HF_SCHEME):].split("@")[0].split("/")[-1]
            out = f"{name}-{recipes[0] if len(recipes) == 1 else 'doctor'}"
    if in_place:
        for recipe in recipes:
            api.apply_in_place(recipe, local, params=params.get(recipe))
        return Path(local)
    if out is None and len(recipes) > 1:
        out = f"{Path(local)}-doctor"
    result = api.apply(recipes[0], local, out=out, params=params.get(recipes[0]))
    for recipe in recipes[1:]:
        api.apply_in_place(recipe, result.output, params=params.get(recipe))
    return Path(result.output)
