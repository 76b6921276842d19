"""Ctrl-C at random instants (``interrupt_harness``): every run exits 0 or 130, prints no
traceback, and leaves no staging directory or lock file. The default run samples a few
instants of ``apply``; the slow sweep covers start-up to commit of apply, in-place apply,
revert and verify. Instants start at 0.1 s: before that the interpreter itself is starting
(``import re`` in the console script), before any code of ours can take the signal."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from interrupt_harness import MODELPATCH, interrupt


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _check(argv: list[str], delays: list[float], watch: list[Path], reset) -> None:
    failures = []
    for delay in delays:
        reset()
        outcome = interrupt(argv, delay, watch=watch)
        if outcome.problems:
            failures.append((delay, outcome.kind(), outcome.stderr[-600:]))
    assert not failures, failures


def test_ctrl_c_during_apply_sampled(deepseek_fp8_dir: Path, tmp_path: Path) -> None:
    base = _copy(deepseek_fp8_dir, tmp_path / "base")
    out = tmp_path / "out"
    _check([MODELPATCH, "apply", "fp8-block-to-bf16", str(base), "-o", str(out)],
           [0.12, 0.3, 0.9], [tmp_path], lambda: shutil.rmtree(out, ignore_errors=True))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["apply", "in-place", "revert", "verify"])
def test_ctrl_c_sweep(command: str, deepseek_fp8_dir: Path, tmp_path: Path) -> None:
    rng = random.Random(command)
    delays = [rng.uniform(0.1, 2.5) for _ in range(56)]
    base = _copy(deepseek_fp8_dir, tmp_path / "base")
    out = tmp_path / "out"
    apply = [MODELPATCH, "apply", "fp8-block-to-bf16", str(base), "-o", str(out)]
    if command == "apply":
        _check(apply, delays, [tmp_path], lambda: shutil.rmtree(out, ignore_errors=True))
        return
    import subprocess
    subprocess.run(apply, check=True, capture_output=True)
    if command == "verify":
        _check([MODELPATCH, "verify", str(out)], delays, [tmp_path], lambda: None)
    elif command == "revert":
        reverted = tmp_path / "reverted"
        _check([MODELPATCH, "revert", str(out), "-o", str(reverted)], delays, [tmp_path],
               lambda: shutil.rmtree(reverted, ignore_errors=True))
    else:
        _check([MODELPATCH, "apply", "fp8-block-to-bf16", str(out), "--in-place",
                "--allow-noop"], delays[:20], [tmp_path], lambda: None)
