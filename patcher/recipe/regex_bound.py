"""CPU-time budgets on matching a recipe's patterns against tensor names (and the elements of
config arrays: ``each:`` map and filter).

Python's ``re`` backtracks, and no static check recognizes every pattern that backtracks for
ever (``.*.*.*Z``, ``^(?:.{0,40}){0,40}Z``, ``(?:\\w?){40}\\w{40}Z``). A linear-time engine
(google-re2) has no wheel for every supported Python. So the loader refuses the shapes it
recognizes, and two budgets bound the rest, both in the process's CPU time (a loaded machine
does not trip them), counted by a virtual-time timer that ticks while names are matched:

- per name: a name still being matched after ``MATCH_CPU_SECONDS`` stops the plan;
- per plan (``plan_wide``): all the matching of one plan together may take at most
  ``PLAN_MATCH_CPU_SECONDS``; once a pattern has run ``PROJECT_AFTER_SECONDS``, a pattern whose
  pace would overrun that over all the names it has to match stops the plan at once, with the
  projection (``.*.*.*.*.*Z`` at 0.2 s a name over a 273k-tensor model: hours, refused in a
  second), instead of only when the budget is spent.

Either stops the plan with exit 2 (``PlanError``), naming the pattern, the recipe line and the
budget. Starting a name costs two attribute writes. ``re`` checks for signals while it
backtracks, so the tick interrupts it.

The timer needs the main thread (Python runs signal handlers there); elsewhere, for a library
caller on another thread, matching runs unbounded.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from ..errors import PlanError

MATCH_CPU_SECONDS = 1.0
PLAN_MATCH_CPU_SECONDS = 30.0
PROJECT_AFTER_SECONDS = 1.0
_TICK_SECONDS = 0.05
TENSOR = "tensor name"


class _Budget:
    """The CPU seconds spent matching names, in one plan (``plan_wide``) or one block."""

    def __init__(self) -> None:
        self.spent = 0.0


_plan: _Budget | None = None


@contextlib.contextmanager
def plan_wide() -> Iterator[None]:
    """Every ``per_name`` block inside (one plan) draws on one ``PLAN_MATCH_CPU_SECONDS``."""
    global _plan
    outer = _plan
    _plan = outer or _Budget()
    try:
        yield
    finally:
        _plan = outer


class _Clock:
    """What is being matched; the timer's ticks count how long the current name has taken,
    and what the block and the plan have spent."""

    def __init__(self, what: str, loc: str, total: int | None, budget: _Budget, kind: str):
        self.what, self.loc, self.total, self.budget = what, loc, total, budget
        self.kind = kind                   # what a name is, for messages: "tensor name"
        self.name = ""
        self.started = self.seen = 0       # names started; the count at the last tick
        self.stalled = 0                   # ticks since the current name started
        self.spent = 0.0                   # CPU seconds this block has matched

    def start(self, name: str) -> None:
        self.name = name
        self.started += 1

    def check(self, _signum, _frame) -> None:
        self.spent += _TICK_SECONDS
        self.budget.spent += _TICK_SECONDS
        self._plan_budget()
        if self.started != self.seen:
            self.seen, self.stalled = self.started, 0
            return
        self.stalled += 1
        if self.stalled * _TICK_SECONDS > MATCH_CPU_SECONDS:
            tensor = self.kind == TENSOR
            raise PlanError(f"{self.what} takes more than {MATCH_CPU_SECONDS:g} s of CPU on one "
                            f"{self.kind}{'' if tensor else f' ({self.name[:80]!r})'}: it "
                            "backtracks catastrophically; rewrite it",
                            where=self.loc, tensor=self.name if tensor else None)

    def _plan_budget(self) -> None:
        budget = f"the plan's regex budget is {PLAN_MATCH_CPU_SECONDS:g} s of CPU"
        if self.budget.spent > PLAN_MATCH_CPU_SECONDS:
            raise PlanError(f"{self.what}: matching {self.kind}s has spent the plan's regex "
                            f"budget ({PLAN_MATCH_CPU_SECONDS:g} s of CPU); the pattern "
                            "backtracks too much; rewrite it", where=self.loc)
        if self.total and self.started and self.spent >= PROJECT_AFTER_SECONDS:
            projected = self.spent * self.total / self.started
            if self.budget.spent - self.spent + projected > PLAN_MATCH_CPU_SECONDS:
                raise PlanError(f"{self.what} would take about {_duration(projected)} of CPU "
                                f"to match {self.total:,} {self.kind}s ({budget}); the pattern "
                                "backtracks too much; rewrite it", where=self.loc)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


@contextlib.contextmanager
def per_name(what: str, loc: str, total: int | None = None, kind: str = TENSOR
             ) -> Iterator[_Clock]:
    """Bound the matching in the block: call ``clock.start(name)`` before each of the
    ``total`` names (the plan-wide budget projects over them); ``kind`` says what they are."""
    clock = _Clock(what, loc, total, _plan or _Budget(), kind)
    if threading.current_thread() is not threading.main_thread():
        yield clock
        return
    previous = signal.signal(signal.SIGVTALRM, clock.check)
    signal.setitimer(signal.ITIMER_VIRTUAL, _TICK_SECONDS, _TICK_SECONDS)
    try:
        yield clock
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, signal.SIG_DFL if previous is None else previous)
