"""Byte meters for the command line's long steps (hashing, copying, writing, verifying).

On a terminal, each step that has work gets a tqdm bar with its total and ETA, and log lines
are written through tqdm (``logging_redirect_tqdm``) so that a warning does not break a bar. On
anything else (a pipe, a log file, CI), a step prints a plain line at most every
``MODELPATCH_PROGRESS_INTERVAL`` seconds (default 5), and a last one when it ends if it printed
any: ``modelpatch: hashing 42% 1.10 GiB of 2.60 GiB, 310.20 MiB/s``. Quiet: nothing at all.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from typing import TextIO

from ..display import printable
from ..units import human_bytes

INTERVAL_ENV = "MODELPATCH_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 5.0


def interval() -> float:
    """Seconds between two plain progress lines (``$MODELPATCH_PROGRESS_INTERVAL``, default 5)."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value >= 0 else DEFAULT_INTERVAL


class Meter:
    """Counts the bytes of one step; this base shows nothing (quiet)."""

    def __init__(self, desc: str, stream: TextIO | None = None):
        self.desc, self.stream = desc, stream
        self.done, self.total = 0, None
        self.lock = threading.Lock()

    def set_total(self, total: int) -> None:
        with self.lock:
            self.total = total
            self._shown()

    def update(self, n: int) -> None:
        with self.lock:
            self.done += n
            self._shown()

    def close(self) -> None:
        pass

    def _shown(self) -> None:
        pass


class LineMeter(Meter):
    """Plain lines, at most one every ``every`` seconds, and a last one on close if any."""

    def __init__(self, desc: str, stream: TextIO, every: float):
        super().__init__(desc, stream)
        self.every = every
        self.started = self.last = None
        self.printed = False

    def _shown(self) -> None:
        now = time.monotonic()
        if self.started is None:                # the step begins: its clock starts
            self.started = self.last = now
        if self.done and now - self.last >= self.every:
            self.last = now
            self._print(now)

    def _print(self, now: float, end: str = "") -> None:
        rate = self.done / max(now - self.started, 1e-6)
        amount = human_bytes(self.done)
        if self.total:
            amount = f"{min(100, 100 * self.done // self.total):3d}% {amount} of " \
                     f"{human_bytes(self.total)}"
        line = f"modelpatch: {self.desc} {amount}, {human_bytes(rate)}/s{end}"
        self.stream.write(printable(line) + "\n")
        self.stream.flush()
        self.printed = True

    def close(self) -> None:
        with self.lock:
            if self.printed:
                self._print(time.monotonic(), end=", done")


class BarMeter(Meter):
    """A tqdm bar, created when the step has work (a total or a first byte), so that a step
    with nothing to do shows no empty bar."""

    def __init__(self, desc: str, stream: TextIO):
        super().__init__(desc, stream)
        self.bar = None

    def _shown(self) -> None:
        if self.bar is None:
            if not (self.total or self.done):
                return
            from tqdm import tqdm

            # A terminal that reports no size (a bare pseudo-terminal) would hide the bar.
            width = {} if _columns(self.stream) else {"ncols": 80, "nrows": 24}
            self.bar = tqdm(total=self.total, initial=0, desc=printable(self.desc), unit="B",
                            unit_scale=True, unit_divisor=1024, file=self.stream, leave=False,
                            dynamic_ncols=not width, **width)
        if self.total is not None and self.bar.total != self.total:
            self.bar.total = self.total
            self.bar.refresh()
        if self.done > self.bar.n:
            self.bar.update(self.done - self.bar.n)

    def close(self) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.close()


class Meters(contextlib.ExitStack):
    """The meters of one command: ``with Meters(quiet) as meters: m = meters.meter("hashing")``.
    Closes them all on exit; on a terminal, routes log lines through tqdm meanwhile."""

    def __init__(self, quiet: bool, stream: TextIO | None = None):
        super().__init__()
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.tty = not quiet and _isatty(self.stream)

    def __enter__(self) -> "Meters":
        super().__enter__()
        if self.tty:
            import logging

            from tqdm.contrib.logging import logging_redirect_tqdm

            self.enter_context(logging_redirect_tqdm(loggers=[logging.root]))
        return self

    def meter(self, desc: str) -> Meter:
        if self.quiet:
            return Meter(desc)
        made = BarMeter(desc, self.stream) if self.tty else LineMeter(desc, self.stream,
                                                                      interval())
        self.callback(made.close)
        return made

    def engine_progress(self):
        """An ``engine.Progress`` whose steps report to meters of their own."""
        from ..execute.engine import Progress

        hashing, writing, copying = (self.meter(d) for d in ("hashing", "writing", "copying"))
        return Progress(hashing=hashing.update, writing=writing.update, copying=copying.update,
                        hash_total=hashing.set_total, write_total=writing.set_total,
                        copy_total=copying.set_total)


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return 0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
