"""The ``doctor`` report as typed, frozen data: what ``api.doctor`` returns and the command
renders. ``to_json()`` is the ``--json`` document, key for key.

A report holds findings (blockers first), the rules that could not run for want of a fact the
user did not give (``--engine``, ``--gpu``), the target, and after ``doctor --fix`` what was
applied and the report of the result (``fix``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .target import Target


@dataclass(frozen=True)
class Fix:
    """The recipe that fixes a finding, and the params it is applied with (a rule's own, or
    the model's through the rule's ``params_from``)."""

    recipe: str
    params: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Fix:
        return cls(data["recipe"], data.get("params"))

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe,
                **({} if self.params is None else {"params": dict(self.params)})}


@dataclass(frozen=True)
class Finding:
    """A rule that holds for the model on the target."""

    rule: str
    severity: str
    """``blocker``, ``warning`` or ``info``."""
    summary: str
    details: Any
    """What the rule's ``details`` pointer finds in the model's facts (None: nothing)."""
    details_from: str | None
    evidence: tuple[Mapping[str, str], ...]
    """Where the engine says so: each ``{"source": ..., "versions": ...}``."""
    fix: Fix | None
    source: str
    """The rule file."""

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": self.severity, "summary": self.summary,
                "details": self.details, "details_from": self.details_from,
                "evidence": [dict(e) for e in self.evidence],
                "fix": None if self.fix is None else self.fix.to_json(), "source": self.source}


@dataclass(frozen=True)
class NotChecked:
    """A rule left unchecked: it needs these facts of the target (``engine``,
    ``engine_version``, ``gpu``), never reported as passed."""

    rule: str
    needs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "needs": list(self.needs)}


@dataclass(frozen=True)
class FixOutcome:
    """What ``doctor --fix`` applied, where the result is, and the result's own report."""

    recipes: tuple[str, ...]
    output: str
    after: DoctorReport

    def to_json(self) -> dict[str, Any]:
        return {"recipes": list(self.recipes), "output": self.output,
                "after": self.after.to_json()}


@dataclass(frozen=True)
class DoctorReport:
    """The report of ``doctor``: ``model`` (the directory as given, absolute, or the hub
    repository read), ``target``, ``findings`` (blockers, then warnings, then info),
    ``not_checked``, ``note`` (a GGUF model: which rules read it), ``remote`` (an
    ``hf://`` model: what reading it transferred, with the commit read and the endpoint) and
    ``fix`` (after ``--fix``)."""

    model: str
    target: Target
    findings: tuple[Finding, ...]
    not_checked: tuple[NotChecked, ...] = ()
    note: str | None = None
    remote: Mapping[str, Any] | None = None
    fix: FixOutcome | None = None

    @property
    def blockers(self) -> int:
        return sum(f.severity == "blocker" for f in self.findings)

    @property
    def ok(self) -> bool:
        """No blocker (after ``--fix``: none left in the result)."""
        return (self.fix.after if self.fix is not None else self).blockers == 0

    def fixes(self) -> list[Fix]:
        """The fixes of the findings that have one, in the findings' order."""
        return [f.fix for f in self.findings if f.fix is not None]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model, "target": self.target.facts(),
            "findings": [f.to_json() for f in self.findings],
            "not_checked": [n.to_json() for n in self.not_checked], "blockers": self.blockers}
        if self.note is not None:
            out["note"] = self.note
        if self.remote is not None:
            out["remote"] = dict(self.remote)
        if self.fix is not None:
            out["fix"] = self.fix.to_json()
        return out
