"""``doctor --fix``: which recipes fix a report's findings, with which params. The command
(``patcher.cli.doctor_command``) applies them through the API, then diagnoses the result:

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

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .report import DoctorReport


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
