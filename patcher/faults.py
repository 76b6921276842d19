"""Fault-injection points for the crash and I/O-fault tests, driven by environment variables.

``MODELPATCH_FAULT`` holds ``ACTION@POINT[#N]`` (several separated by commas). At the N-th time
(default 1st) this process reaches the named point, the action runs:

- ``kill``: SIGKILL this process (a crash at that instant). Reached in a worker process of a
  pool, it kills the main modelpatch process first, then the worker;
- ``enospc`` / ``eio``: raise ``OSError`` as a full disk or a failing device would;
- ``die-if:PATH``: SIGKILL this process alone (a worker dying under a cluster scheduler) if
  ``PATH`` exists, removing it first: whichever process removes it dies, so the retried task
  runs through. A test arms it by creating ``PATH``;
- ``sleep:SECONDS``: pause there;
- ``wait:PATH``: pause there until ``PATH`` exists (at most ten minutes). Tests use it to hold
  a lock at a known instant for exactly as long as they need.

``MODELPATCH_FAULT_TRACE`` names a file to which every point reached is appended, one name a
line (worker processes included): the crash tests run a command once with it to enumerate the
instants they then kill at.

Points are named by the engine and the journal: ``file:<path>``, ``hashing``, ``manifest``,
``commit``, ``tensor:<name>``, ``inplace:<stage>``, ``revert:<stage>``, ``journal:<stage>``,
``journal:<action>:<path>`` (before a journal step) and ``journal:<action>:<path>:taken`` (after
it, before the journal records it). Without either variable, ``point`` costs one test.

The faults are armed only inside the test suite: ``MODELPATCH_FAULT`` is ignored unless
``PYTEST_CURRENT_TEST`` is set too (pytest sets it while a test runs, and the commands a test
starts inherit it), so a stray variable in a user's environment can never kill modelpatch or
its parent process.
"""

from __future__ import annotations

import errno
import os
import signal
import time

_ENV = "MODELPATCH_FAULT"
_TRACE_ENV = "MODELPATCH_FAULT_TRACE"
_counts: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[str, int]]:
    faults = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        action, _, rest = item.partition("@")
        point, sep, nth = rest.rpartition("#")
        if not sep or not nth.isdigit():
            point, nth = rest, ""
        faults[point] = (action, int(nth or 1))
    return faults


_FAULTS = _parse(os.environ.get(_ENV, "")) if os.environ.get("PYTEST_CURRENT_TEST") else {}
_TRACE = os.environ.get(_TRACE_ENV) or None


def point(name: str) -> None:
    """Mark an instant where a fault may be injected."""
    if _TRACE is not None:
        _trace(name)
    if not _FAULTS or name not in _FAULTS:
        return
    action, nth = _FAULTS[name]
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] != nth:
        return
    if action == "kill":
        import multiprocessing

        parent = multiprocessing.parent_process()   # set in pool workers only
        if parent is not None and parent.pid == os.getppid():
            os.kill(parent.pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    if action.startswith("die-if:"):
        try:
            os.unlink(action.partition(":")[2])
        except FileNotFoundError:
            _counts[name] -= 1          # not armed: a later pass may be the armed one
            return
        os.kill(os.getpid(), signal.SIGKILL)
    if action in ("enospc", "eio"):
        code = errno.ENOSPC if action == "enospc" else errno.EIO
        raise OSError(code, os.strerror(code), f"<injected at {name}>")
    if action.startswith("sleep:"):
        time.sleep(float(action.partition(":")[2]))
        return
    if action.startswith("wait:"):
        deadline = time.monotonic() + 600
        while not os.path.exists(action.partition(":")[2]) and time.monotonic() < deadline:
            time.sleep(0.01)
        return
    raise ValueError(f"{_ENV}: unknown action {action!r}")


def _trace(name: str) -> None:
    # One write(2) of one line with O_APPEND: lines from concurrent processes never interleave.
    fd = os.open(_TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (name.replace("\n", " ") + "\n").encode())
    finally:
        os.close(fd)
