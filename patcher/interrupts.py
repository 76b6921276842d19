"""The one interrupt policy: the main thread owns SIGINT and SIGTERM (and SIGHUP).

``install()`` replaces their handlers with one that raises ``KeyboardInterrupt`` in the main
thread, as Python's own does, except where unwinding would break the process:

- inside an import (a half-imported numpy or torch cannot be imported again: "module 'numpy'
  has no attribute 'matrix'", "cannot load module more than once per process");
- inside a ``deferred()`` block (an import of the tensor stack, a commit).

There the signal is remembered and raised as soon as the import or block is over (a timer
retries every 20 ms until the import is done). SIGTERM and SIGHUP raise
``KeyboardInterrupt("signal N")`` so that the same cleanup runs.

Worker processes never see the signal: ``workers_started()`` blocks it while they are created,
and they inherit the blocked mask; the parent stops them. Threads see a stop flag, never the
exception (Python raises signal exceptions in the main thread only).

``interrupted()`` tells whether an interrupt was raised: any error after it is the interrupt's
doing, and the command line reports it as an interruption (exit 130). ``finish()`` makes a
command whose result is out ignore a late signal, so that it exits 0 instead of dying.

Standard library only.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                if hasattr(signal, name))
RETRY_SECONDS = 0.02

_state = {"depth": 0, "pending": None, "raised": False, "finished": False, "installed": None}


def _in_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _exception(signum: int) -> KeyboardInterrupt:
    """The interrupt to raise for ``signum``; no retry is left armed (a timer that fired once
    the interpreter is shutting down would end it with SIGALRM)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    _state["pending"] = None
    _state["raised"] = True
    return KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(f"signal {signum}")


def _handler(signum, frame) -> None:
    if _state["finished"]:
        return
    if _state["depth"] or _in_import(frame):
        if _state["pending"] is None:
            _state["pending"] = signum
        signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS)
        return
    raise _exception(signum)


def _retry(_signum, frame) -> None:
    pending = _state["pending"]
    if pending is not None:
        _handler(pending, frame)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> bool:
    """Take over the signals (main thread only; elsewhere nothing changes). Returns whether it
    did; ``restore()`` gives the previous handlers back."""
    if not _on_main_thread() or _state["installed"] is not None:
        return False
    previous = {}
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is signal.SIG_IGN:       # nohup, a shell's background job: stays ignored
            continue
        previous[sig] = signal.signal(sig, _handler)
    if hasattr(signal, "SIGALRM"):
        previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, _retry)
    _state.update(depth=0, pending=None, raised=False, finished=False, installed=previous)
    return True


def restore() -> None:
    previous = _state["installed"]
    if previous is None or not _on_main_thread():
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    for sig, old in previous.items():
        signal.signal(sig, old)
    _state.update(installed=None, pending=None, finished=False)


def interrupted() -> bool:
    """Whether an interrupt was raised since ``install()``."""
    return bool(_state["raised"])


def finish() -> None:
    """The result is out: a signal from now on is ignored. Ignored by the process, not only by
    our handler: as the interpreter shuts down it puts the default action back for every
    signal that has a Python handler, and a Ctrl-C in that last instant would kill the process
    after it printed its result (an ignored signal stays ignored)."""
    _state["finished"] = True
    if _state["installed"] is not None and _on_main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig in _state["installed"]:
            if sig in SIGNALS:
                signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block no interrupt breaks: a signal that comes inside is raised when it ends."""
    if not _on_main_thread() or _state["installed"] is None:
        yield
        return
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        pending = _state["pending"]
        if not _state["depth"] and pending is not None and not _state["finished"]:
            raise _exception(pending)


@contextlib.contextmanager
def workers_started() -> Iterator[None]:
    """Start worker processes inside this block: they inherit the signals blocked and never see
    a Ctrl-C meant for this process (which stops them). A signal that comes meanwhile is
    delivered to this process when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextlib.contextmanager
def policy() -> Iterator[None]:
    """The policy in effect inside the block (for a library caller; the command line installs
    it for the whole process), the previous handlers back after it."""
    took = install()
    try:
        yield
    finally:
        if took:
            restore()
