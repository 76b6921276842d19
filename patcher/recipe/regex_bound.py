"""A CPU-time bound on matching a recipe's patterns against each tensor name.

Python's ``re`` backtracks, and no static check recognizes every pattern that backtracks for
ever (``.*.*.*Z``, ``^(?:.{0,40}){0,40}Z``, ``(?:\\w?){40}\\w{40}Z``). A linear-time engine
(google-re2) has no wheel for every supported Python. So the loader refuses the shapes it
recognizes, and ``per_name`` bounds the rest: a virtual-time timer (the process's CPU time, so
a loaded machine does not trip it) ticks while names are matched, and a name that is still
being matched after ``MATCH_CPU_SECONDS`` of ticks stops the plan with exit 2, naming the
pattern, the tensor and the recipe line. Starting a name costs two attribute writes. ``re``
checks for signals while it backtracks, so the tick interrupts it.

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
_TICK_SECONDS = 0.05


class _Clock:
    """What is being matched; the timer's ticks count how long the current name has taken."""

    def __init__(self, what: str, loc: str):
        self.what, self.loc = what, loc
        self.name = ""
        self.started = self.seen = 0       # names started; the count at the last tick
        self.stalled = 0                   # ticks since the current name started

    def start(self, name: str) -> None:
        self.name = name
        self.started += 1

    def check(self, _signum, _frame) -> None:
        if self.started != self.seen:
            self.seen, self.stalled = self.started, 0
            return
        self.stalled += 1
        if self.stalled * _TICK_SECONDS > MATCH_CPU_SECONDS:
            raise PlanError(f"{self.what} takes more than {MATCH_CPU_SECONDS:g} s of CPU on one "
                            f"tensor name: it backtracks catastrophically; rewrite it",
                            where=self.loc, tensor=self.name)


@contextlib.contextmanager
def per_name(what: str, loc: str) -> Iterator[_Clock]:
    """Bound the matching in the block: call ``clock.start(name)`` before each name."""
    clock = _Clock(what, loc)
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
