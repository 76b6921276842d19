"""Ctrl-C at a chosen instant: run ``modelpatch`` as a user would (its own process group, the
console script), send SIGINT to the whole group after ``delay`` seconds (as a terminal's Ctrl-C
does: the command and any worker it started), and report how it ended.

A run passes when it exits 0 or 130 (never killed by the signal itself: the command handles it),
prints no traceback, and leaves no staging directory or lock file in the directories it names
(``Outcome.problems``).

Also a command-line tool: ``python tests/interrupt_harness.py N -- modelpatch ARGS...`` runs the
command N times at random instants over its own uninterrupted duration and prints the counts
(the figures of the CHANGELOG's interrupt entry came from it).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

MODELPATCH = str(Path(sys.executable).with_name("modelpatch"))
LEFTOVERS = (".modelpatch-staging-", ".modelpatch.lock", ".modelpatch-replaced-")


@dataclass
class Outcome:
    delay: float
    returncode: int
    stderr: str
    leftovers: list[str] = field(default_factory=list)
    stdout: str = ""
    signal: int | None = None           # the signal that ended the process, if one did

    @property
    def problems(self) -> list[str]:
        found = []
        if self.signal is not None:
            found.append(f"killed by signal {self.signal}")
        elif self.returncode not in (0, 130):
            found.append(f"exit {self.returncode}")
        if "Traceback" in self.stderr or "terminate called" in self.stderr:
            found.append("traceback")
        if self.leftovers:
            found.append(f"left {self.leftovers}")
        return found

    def kind(self) -> str:
        if self.problems:
            return "; ".join(self.problems)
        return "interrupted (130)" if self.returncode == 130 else "finished (0)"


def leftovers(*dirs: Path) -> list[str]:
    found = []
    for d in dirs:
        for root, dirnames, files in os.walk(d):
            for name in dirnames + files:
                if any(mark in name for mark in LEFTOVERS):
                    found.append(os.path.join(root, name))
    return sorted(found)


def interrupt(argv: list[str], delay: float, *, watch: list[Path], cwd: Path | None = None,
              env: dict | None = None, timeout: float = 120) -> Outcome:
    """Run ``argv``, Ctrl-C its process group after ``delay`` s, wait for it to end."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env=env, start_new_session=True)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # A worker still exiting may hold its lock a moment longer than the command
    with_children_gone(proc.pid)
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return Outcome(delay, code, err.decode(errors="replace"), leftovers(*watch),
                   out.decode(errors="replace"),
                   -proc.returncode if proc.returncode < 0 else None)


def with_children_gone(pgid: int, limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


def main(args: list[str]) -> int:
    runs, argv = int(args[0]), args[2:]
    start = time.monotonic()
    subprocess.run(argv, capture_output=True, check=False)
    duration = time.monotonic() - start
    counts: dict[str, int] = {}
    rng = random.Random(0)
    watch = [Path(a).parent for a in argv[1:] if os.path.sep in a]
    for i in range(runs):
        if "-o" in argv:
            target = Path(argv[argv.index("-o") + 1])
            shutil.rmtree(target, ignore_errors=True)
        outcome = interrupt(argv, rng.uniform(0, duration), watch=watch)
        counts[outcome.kind()] = counts.get(outcome.kind(), 0) + 1
        if outcome.problems:
            print(f"{outcome.delay:.3f}s: {outcome.kind()}: "
                  f"{outcome.stderr.strip().splitlines()[-1:]}", flush=True)
        for leftover in outcome.leftovers:
            p = Path(leftover)
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    print(f"{runs} runs over {duration:.2f} s:", counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
