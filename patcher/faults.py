"""Fault-injection points for the crash and I/O-fault tests, driven by an environment variable.

``MODELPATCH_FAULT`` holds ``ACTION@POINT[#N]`` (several separated by commas). At the N-th time
(default 1st) the named point is reached, the action runs:

- ``kill``: SIGKILL this process (a crash at that instant);
- ``enospc`` / ``eio``: raise ``OSError`` as a full disk or a failing device would.

Points are named by the engine (``file:<path>``, ``hashing``, ``manifest``, ``commit``,
``journal:<step>``...). Without the variable, ``point`` costs one dict lookup.
"""

from __future__ import annotations

import errno
import os
import signal

_ENV = "MODELPATCH_FAULT"
_counts: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[str, int]]:
    faults = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        action, _, rest = item.partition("@")
        point, _, nth = rest.partition("#")
        faults[point] = (action, int(nth or 1))
    return faults


_FAULTS = _parse(os.environ.get(_ENV, ""))


def point(name: str) -> None:
    """Mark an instant where a fault may be injected."""
    if not _FAULTS or name not in _FAULTS:
        return
    action, nth = _FAULTS[name]
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] != nth:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action in ("enospc", "eio"):
        code = errno.ENOSPC if action == "enospc" else errno.EIO
        raise OSError(code, os.strerror(code), f"<injected at {name}>")
    raise ValueError(f"{_ENV}: unknown action {action!r}")
