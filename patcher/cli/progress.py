"""Byte meters for the command line's long steps (hashing, copying, writing, verifying).

On a terminal, each step that has work gets a tqdm bar with its total, and log lines are
written through tqdm (``logging_redirect_tqdm``) so that a warning does not break a bar. A
rate, and the ETA drawn from it, show only once measured: over at least ``RATE_SECONDS`` of
bytes after the step's first (the first bytes may come seconds after the step began, and a
rate over that wait gives ETAs of hours for megabytes). When the meters close, the bars are
cleared and the cursor is put back at the start of an empty line, so that the result printed
next starts there (a bar cleared below another leaves the cursor at its last column). On
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
RATE_SECONDS = 1.0
CLEAR_LINE = "\r\x1b[K"          # to the line's start, and erase it


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
        self.first: tuple[float, int] | None = None     # (when, bytes) at the first bytes
        self.lock = threading.Lock()

    def set_total(self, total: int) -> None:
        with self.lock:
            self.total = total
            self._shown()

    def update(self, n: int) -> None:
        with self.lock:
            self.done += n
            if self.first is None and self.done:
                self.first = (time.monotonic(), self.done)
            self._shown()

    def rate(self, now: float) -> float | None:
        """Bytes a second since the first bytes; None until ``RATE_SECONDS`` of them."""
        if self.first is None or now - self.first[0] < RATE_SECONDS:
            return None
        moved = self.done - self.first[1]
        return moved / (now - self.first[0]) if moved > 0 else None

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
        rate = self.rate(now)
        amount = human_bytes(self.done)
        if self.total:
            amount = f"{min(100, 100 * self.done // self.total):3d}% {amount} of " \
                     f"{human_bytes(self.total)}"
        speed = "" if rate is None else f", {human_bytes(rate)}/s"
        line = f"modelpatch: {self.desc} {amount}{speed}{end}"
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
            # A terminal that reports no size (a bare pseudo-terminal) would hide the bar.
            width = {} if _columns(self.stream) else {"ncols": 80, "nrows": 24}
            self.bar = _bar_class()(self, total=self.total, initial=0, desc=printable(self.desc),
                                    unit="B", unit_scale=True, unit_divisor=1024,
                                    file=self.stream, leave=False, dynamic_ncols=not width,
                                    bar_format=BAR_FORMAT, **width)
        if self.total is not None and self.bar.total != self.total:
            self.bar.total = self.total
            self.bar.refresh()
        if self.done > self.bar.n:
            self.bar.update(self.done - self.bar.n)

    def close(self) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.close()


BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{speed}]"
_BAR_CLASS: list = []


def _bar_class():
    """tqdm's bar, its ETA and rate those of its meter (``Meter.rate``): none until measured."""
    if _BAR_CLASS:
        return _BAR_CLASS[0]
    from tqdm import tqdm

    class Bar(tqdm):
        def __init__(self, meter: Meter, *args, **kwargs):
            self.meter = meter
            super().__init__(*args, **kwargs)

        @property
        def format_dict(self):
            data = super().format_dict
            rate = self.meter.rate(time.monotonic())
            speed = ""
            if rate:
                speed = f", {tqdm.format_sizeof(rate, 'B', 1024)}/s"
                if self.total and self.total > self.n:
                    speed = f"<{tqdm.format_interval((self.total - self.n) / rate)}{speed}"
            data["speed"] = speed
            return data

    _BAR_CLASS.append(Bar)
    return Bar


class Meters(contextlib.ExitStack):
    """The meters of one command: ``with Meters(quiet) as meters: m = meters.meter("hashing")``.
    Closes them all on exit; on a terminal, routes log lines through tqdm meanwhile."""

    def __init__(self, quiet: bool, stream: TextIO | None = None):
        super().__init__()
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.tty = not quiet and _isatty(self.stream)
        self.bars: list[BarMeter] = []

    def __enter__(self) -> "Meters":
        super().__enter__()
        if self.tty:
            import logging

            from tqdm.contrib.logging import logging_redirect_tqdm

            self.enter_context(logging_redirect_tqdm(loggers=[logging.root]))
        return self

    def __exit__(self, *exc) -> bool:
        try:
            return super().__exit__(*exc)
        finally:
            if self.tty and any(m.bar is not None for m in self.bars):
                self.stream.write(CLEAR_LINE)
                self.stream.flush()

    def meter(self, desc: str) -> Meter:
        if self.quiet:
            return Meter(desc)
        made = BarMeter(desc, self.stream) if self.tty else LineMeter(desc, self.stream,
                                                                      interval())
        if self.tty:
            self.bars.append(made)
        self.callback(made.close)
        return made

    def engine_progress(self):
        """An ``engine.Progress`` whose steps report to meters of their own."""
        from ..execute.engine import Progress

        hashing, writing, copying = (self.meter(d) for d in ("hashing", "writing", "copying"))
        return Progress(hashing=hashing.update, writing=writing.update, copying=copying.update,
                        hash_total=hashing.set_total, write_total=writing.set_total,
                        copy_total=copying.set_total)


def resolve_with_meter(model, endpoint: str | None, quiet: bool):
    """``api.resolve_model`` of an ``hf://`` model (text or ``ModelRef``), its download on a
    meter of ours."""
    from .. import api

    with Meters(quiet) as meters:
        return api.resolve_model(model, endpoint=endpoint, progress=not quiet,
                                 on_progress=meters.meter("downloading").update)


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
