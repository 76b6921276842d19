"""Progress of modelpatch's own long steps: tqdm bars with totals and ETA on
a terminal, a plain line at most every few seconds elsewhere, nothing with -q."""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from patcher.cli import progress
from patcher.cli.progress import LineMeter, Meters

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^modelpatch: (?P<step>hashing|copying|writing|verifying) +(?P<pct>\d+)% "
                  r"[\d.]+ (B|KiB|MiB) of (?P<total>[\d.]+ (B|KiB|MiB))"
                  r"(?P<rate>, [\d.]+ (B|KiB|MiB|GiB)/s)?(?P<done>, done)?$")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_at_most_every_interval_and_a_last_one(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()
    meter = LineMeter("hashing", out, every=5)
    meter.set_total(4 << 20)
    for _ in range(3):                       # 3 MiB within 2 s: nothing yet
        meter.update(1 << 20)
        clock.now += 1
    assert out.getvalue() == ""
    clock.now += 4
    meter.update(1 << 20)                    # 7 s after the start: one line
    meter.close()
    lines = out.getvalue().splitlines()
    # The rate counts from the first bytes (1 MiB at 100 s): 3 MiB in the 7 s since.
    assert lines == ["modelpatch: hashing 100% 4.00 MiB of 4.00 MiB, 438.86 KiB/s",
                     "modelpatch: hashing 100% 4.00 MiB of 4.00 MiB, 438.86 KiB/s, done"]


def test_no_rate_before_a_second_of_bytes(monkeypatch):
    """The first bytes may come long after the step began (a tensor computed before its first
    write): a rate, and so an ETA, only once measured over bytes that came after them."""
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()
    meter = LineMeter("writing", out, every=0)
    meter.set_total(9 << 20)
    clock.now += 30                          # set-up: nothing written for 30 s
    meter.update(3 << 10)
    clock.now += 0.5
    meter.update(1 << 20)
    clock.now += 1
    meter.update(1 << 20)
    assert out.getvalue().splitlines() == [
        "modelpatch: writing   0% 3.00 KiB of 9.00 MiB",
        "modelpatch: writing  11% 1.00 MiB of 9.00 MiB",
        "modelpatch: writing  22% 2.00 MiB of 9.00 MiB, 1.33 MiB/s"]


def test_terminal_bar_shows_an_eta_only_once_a_rate_is_known(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    term = FakeTerminal()
    with Meters(quiet=False, stream=term) as meters:
        meter = meters.meter("writing")
        meter.set_total(9 << 20)
        clock.now += 30
        meter.update(3 << 10)
        meter.bar.refresh()
        first = term.getvalue().rsplit("\r", 1)[-1]
        clock.now += 2
        meter.update(4 << 20)
        meter.bar.refresh()
        later = term.getvalue().rsplit("\r", 1)[-1]
    assert re.search(r"3\.00k/9\.00M \[\d\d:\d\d\]$", first), first
    assert re.search(r"4\.00M/9\.00M \[\d\d:\d\d<00:02, 2\.00MB/s\]$", later), later
    assert term.getvalue().endswith("\r\x1b[K")      # cleared, the cursor at the start


def test_a_step_shorter_than_the_interval_prints_nothing(monkeypatch):
    out = io.StringIO()
    meter = LineMeter("writing", out, every=5)
    meter.set_total(10)
    meter.update(10)
    meter.close()
    assert out.getvalue() == ""


@pytest.mark.parametrize("value, expected", [("0", 0.0), ("2.5", 2.5), ("x", 5.0), ("-1", 5.0)])
def test_interval_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv(progress.INTERVAL_ENV, value)
    assert progress.interval() == expected


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_bar_has_a_total_and_log_lines_go_through_tqdm(monkeypatch):
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("modelpatch: %(message)s"))
    logging.root.addHandler(console)
    try:
        with Meters(quiet=False) as meters:
            bar = meters.meter("hashing")
            idle = meters.meter("writing")       # no work: no bar at all
            bar.set_total(4 << 20)
            bar.update(1 << 20)
            logging.getLogger("modelpatch").warning("warning: careful")
            assert console not in logging.root.handlers     # redirected meanwhile
            bar.update(3 << 20)
            del idle
        assert console in logging.root.handlers
    finally:
        logging.root.removeHandler(console)
    text = term.getvalue()
    assert re.search(r"hashing: +25%\|.*\| 1\.00M/4\.00M \[", text), text
    assert "writing" not in text
    # tqdm.write cleared the bar before the warning and put the warning on a line of its own.
    assert re.search(r"\r\s*\rmodelpatch: warning: careful\n", text), repr(text)


def test_quiet_meters_print_nothing():
    out = FakeTerminal()
    with Meters(quiet=True, stream=out) as meters:
        m = meters.meter("hashing")
        m.set_total(5)
        m.update(5)
    assert out.getvalue() == ""


@pytest.fixture
def kimi(kimi_dir, tmp_path) -> Path:
    dst = tmp_path / "kimi"
    shutil.copytree(kimi_dir, dst, symlinks=True)
    return dst


def _env(tmp_path: Path, **extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), MODELPATCH_CACHE_DIR=str(tmp_path / "cache"),
               **extra)
    env.pop("COLUMNS", None)
    return env


def _modelpatch(*args) -> list[str]:
    return [sys.executable, "-m", "patcher.cli", *map(str, args)]


def test_non_tty_apply_and_verify_print_plain_lines(kimi, tmp_path):
    env = _env(tmp_path, **{progress.INTERVAL_ENV: "0"})
    out = tmp_path / "v"
    result = subprocess.run(_modelpatch("apply", "sm120-fp16-kv", kimi, "-o", out), env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    hashing = [m for m in map(LINE.match, lines) if m and m["step"] == "hashing"]
    assert hashing and hashing[-1]["pct"] == "100" and hashing[-1]["done"] == ", done"
    assert hashing[-1]["total"] == "4.24 MiB"          # the total: every unknown base file
    assert "\r" not in result.stderr and "\x1b" not in result.stderr
    verify = subprocess.run(_modelpatch("verify", out), env=env, capture_output=True,
                            text=True, timeout=120)
    assert any((m := LINE.match(line)) and m["step"] == "verifying" for line in
               verify.stderr.splitlines()), verify.stderr
    quiet = subprocess.run(_modelpatch("verify", "-q", out), env=env, capture_output=True,
                           text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_tty_apply_shows_bars_with_their_total(kimi, tmp_path):
    """On a real terminal (a pseudo-terminal here) the hashing bar counts bytes toward its
    total; it no longer stays at 0.00B, and a step of a few megabytes shows no ETA of hours."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(_modelpatch("apply", "sm120-fp16-kv", kimi, "-o", tmp_path / "v"),
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:                      # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, text
    assert re.search(r"hashing: +\d+%\|.*\| [\d.]+\w?/4\.24M \[\d\d:\d\d", text), repr(text)
    assert "0.00B" not in text and not re.search(r"<\d+:\d\d:\d\d", text), repr(text)
