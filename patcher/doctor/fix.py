"""``doctor --fix``: apply the fixing recipes of the findings, then diagnose the result.

One recipe: one ``apply`` (a hash-verified variant). Several: ``api.apply_stacked``, the first
applied out of place and the rest stacked on the variant in place, each a revertible patch with
its own manifest entry (``modelpatch revert`` undoes them one by one), in a scratch directory
renamed to the output once all applied: a fix that refuses leaves nothing, and ``--force``
replaces an earlier such output of the same model. ``--in-place`` stacks them all on the model
and reverts those it applied when one refuses.
An ``hf://`` model is downloaded first, through ``apply hf://``'s path (``api.resolve_model``),
at the commit diagnosed (the command passes ``hf://ORG/NAME@COMMIT``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..model_ref import ModelRef

if TYPE_CHECKING:
    from .report import DoctorReport

#: ``doctor --fix`` writes ``<model>-doctor`` unless ``-o`` names the output.
OUTPUT_SUFFIX = "doctor"


def fixing_recipes(report: DoctorReport) -> list[str]:
    """The fix recipes of the blockers' and warnings' findings, each once, blockers' first
    (findings come sorted). An ``info`` finding's fix is a choice (strip-mtp gives up MTP
    speculative decoding): the report names it, ``--fix`` leaves it to the user."""
    return list(dict.fromkeys(f.fix.recipe for f in report.findings
                              if f.fix is not None and f.severity != "info"))


def nothing_to_fix(report: DoctorReport) -> str:
    """The one line ``--fix`` says when no blocker or warning has a fix (nothing is written)."""
    info = [fix.recipe for fix in report.fixes()]
    if info:
        return (f"--fix: nothing written: only info findings have a fix ({', '.join(info)}), "
                f"a choice left to you (apply it as shown)")
    return "--fix: nothing written: no finding has a fixing recipe"


def fixing_params(report: DoctorReport) -> dict[str, dict]:
    """recipe -> the params its finding gives (the first finding naming it). They are data (a
    rule's, or the model's through ``params_from``), never yours: one that names a local path
    (``model:``, ``file:``) is refused, as in an ``include:`` line."""
    from ..errors import InputError
    from ..recipe.sources import local_source_problem

    params: dict[str, dict] = {}
    for f in report.findings:
        if f.fix is not None and f.fix.params:
            problem = local_source_problem(dict(f.fix.params), "fix.params value")
            if problem:
                raise InputError(f"rule {f.rule}: {problem}; nothing was written",
                                 where=f.source)
            params.setdefault(f.fix.recipe, dict(f.fix.params))
    return params


def apply_fixes(model: str, recipes: list[str], *, out: str | None, in_place: bool,
                endpoint: str | None, progress: bool, force: bool = False,
                params: dict[str, dict] | None = None, sign=None, link: str = "auto") -> Path:
    """Apply ``recipes`` (with ``params``: recipe -> its params) to ``model``; returns the
    directory that holds the result: ``out``, else ``default_output``. ``sign`` (a loaded
    signer): the fixed variant is committed with its ``model.sig``. ``link``: how the variant
    carries the base's unchanged files (as ``apply --link``)."""
    params = params or {}
    from .. import api

    local, ref = model, ModelRef.parse(model)
    if ref.is_hub:
        from ..cli.progress import resolve_with_meter

        local = str(resolve_with_meter(ref, endpoint, quiet=not progress))
        if out is None and not in_place:
            out = f"{ref.name}-{OUTPUT_SUFFIX}"
    if in_place:
        applied = 0
        try:
            for recipe in recipes:
                api.apply_in_place(recipe, local, params=params.get(recipe))
                applied += 1
        except BaseException:
            for _ in range(applied):            # nothing half-fixed: undo the earlier fixes
                api.revert(local)
            raise
        return Path(local)
    return api.apply_stacked(recipes, local, out=out or default_output(local), force=force,
                             params=params, sign=sign, link=link)


def default_output(model: str) -> Path:
    """``<model>-doctor`` beside the model (``DIR/NAME-doctor`` for ``DIR/NAME.gguf``; in the
    current directory for a Hugging Face cache snapshot), however many recipes fix it."""
    from ..execute.engine import default_output as beside_directory
    from ..gguf.single_file import default_output as beside_file

    if model.endswith(".gguf"):
        return beside_file(model, OUTPUT_SUFFIX)
    return beside_directory(Path(model), OUTPUT_SUFFIX)
