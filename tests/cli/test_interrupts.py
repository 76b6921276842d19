"""Ctrl-C at random instants (``interrupt_harness``) of every command that writes or reads a
model: apply, in-place apply, revert, pull, publish, verify and doctor --fix (pull and publish
against the embedded hub). Every run exits 0 or 130, prints no traceback, leaves no staging
directory or lock file, and leaves the base as it was: an interrupted run did nothing, a run
that exited 0 printed its result. The instants span each command's own uninterrupted duration
(start-up, planning, rewrite, commit); the default run samples a few of them, the slow sweep
56 a command."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from fs_snapshot import diff, snapshot
from hub_fixtures import hub  # noqa: F401
from interrupt_harness import MODELPATCH, interrupt

COMMANDS = ["apply", "in-place", "revert", "pull", "publish", "verify", "doctor-fix"]
MANIFEST = "modelpatch.provenance.json"
SWEEP = 56
# Before 0.05 s the interpreter itself is starting (``import re`` in the console script),
# before any code of ours can take the signal; Python's own handler is in place then.
EARLIEST = 0.05


@dataclass
class Scenario:
    argv: list[str]
    watch: list[Path]
    env: dict
    reset: Callable[[], None] = lambda: None
    # Problems with the directories once a run ended with ``code``: [] when consistent.
    check: Callable[[int, str], list[str]] = lambda code, out: []
    result: bool = True           # the command prints its result on stdout
    notes: list[str] = field(default_factory=list)


def _run(argv: list[str], env: dict) -> float:
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    return time.monotonic() - start


def _untouched(root: Path, before: dict) -> list[str]:
    changed = diff(before, snapshot(root))
    return [f"{root.name} changed: {changed[:3]}"] if changed else []


def _output(out: Path, code: int) -> list[str]:
    """An output is there, complete, exactly when the run succeeded; never half of one."""
    if out.exists() and not (out / MANIFEST).is_file():
        return [f"{out.name} exists without its manifest"]
    if code == 0 and not out.exists():
        return [f"exit 0 but no {out.name}"]
    return []


def _scenario(command: str, tmp_path: Path, models: dict[str, Path], hub) -> Scenario:
    env = dict(os.environ, MODELPATCH_CACHE_DIR=str(tmp_path / "digest-cache"))
    base = tmp_path / "base"
    shutil.copytree(models["deepseek"], base)
    before = snapshot(base)
    out = tmp_path / "out"
    apply = [MODELPATCH, "apply", "fp8-block-to-bf16", str(base), "-o", str(out)]

    def clear(path: Path) -> Callable[[], None]:
        return lambda: shutil.rmtree(path, ignore_errors=True)

    if command == "apply":
        return Scenario(apply, [tmp_path], env, clear(out),
                        lambda code, _: _untouched(base, before) + _output(out, code))
    if command == "in-place":
        def reset() -> None:
            shutil.rmtree(base)
            shutil.copytree(models["deepseek"], base)

        def check(code: int, _out: str) -> list[str]:
            if code == 130 and not diff(before, snapshot(base)):
                return []                                  # rolled back: the original
            verified = subprocess.run([MODELPATCH, "verify", "-q", str(base)], env=env,
                                      capture_output=True, text=True)
            return [] if verified.returncode == 0 else [f"in place: neither the original nor "
                                                        f"a verified patch: {verified.stdout}"]
        return Scenario([MODELPATCH, "apply", "fp8-block-to-bf16", str(base), "--in-place"],
                        [tmp_path], env, reset, check)
    if command in ("revert", "verify", "publish"):
        subprocess.run(apply, check=True, capture_output=True, env=env)
        variant = snapshot(out)
        if command == "verify":
            return Scenario([MODELPATCH, "verify", str(out)], [tmp_path], env,
                            check=lambda code, _: _untouched(out, variant))
        if command == "revert":
            reverted = tmp_path / "reverted"

            def rebuilt(code: int, _out: str) -> list[str]:
                if not reverted.exists():
                    return ["exit 0 but no reverted base"] if code == 0 else []
                return _untouched(out, variant) + [f"the rebuilt base differs: {d}" for d in
                                                   diff(before, snapshot(reverted))[:3]]
            return Scenario([MODELPATCH, "revert", str(out), "-o", str(reverted)], [tmp_path],
                            env, clear(reverted), rebuilt)
        env.update(HF_ENDPOINT=hub.endpoint, HF_TOKEN="write-alice")
        return Scenario([MODELPATCH, "publish", str(out), "alice/variant"], [tmp_path], env,
                        check=lambda code, _: _untouched(out, variant))
    if command == "pull":
        subprocess.run(apply, check=True, capture_output=True, env=env)
        env.update(HF_ENDPOINT=hub.endpoint, HF_TOKEN="write-alice")
        subprocess.run([MODELPATCH, "publish", "-q", str(out), "alice/variant"], check=True,
                       capture_output=True, env=env)
        env.update(HF_TOKEN="read-alice")
        pulled = tmp_path / "pulled"
        return Scenario([MODELPATCH, "pull", "alice/variant", "-o", str(pulled)], [tmp_path],
                        env, clear(pulled), lambda code, _: _output(pulled, code))
    if command == "doctor-fix":
        kimi = tmp_path / "kimi"
        shutil.copytree(models["kimi"], kimi)
        kimi_before = snapshot(kimi)
        fixed = tmp_path / "fixed"
        # On SM70 the NVFP4 weights and the FP8 KV cache block: two recipes, the second a
        # rewrite of every shard stacked on the first's variant.
        return Scenario([MODELPATCH, "doctor", str(kimi), "--engine", "vllm==0.15.1", "--gpu",
                         "sm70", "--fix", "-o", str(fixed)], [tmp_path], env, clear(fixed),
                        lambda code, _: _untouched(kimi, kimi_before) + _output(fixed, code))
    raise AssertionError(command)


def _sweep(scenario: Scenario, delays: list[float]) -> list[tuple]:
    failures = []
    for delay in delays:
        scenario.reset()
        outcome = interrupt(scenario.argv, delay, watch=scenario.watch, env=scenario.env)
        problems = outcome.problems + scenario.check(outcome.returncode, outcome.stdout)
        if outcome.returncode == 130 and outcome.stdout.strip():
            problems.append(f"exit 130 after printing its result: {outcome.stdout.strip()!r}")
        if outcome.returncode == 0 and scenario.result and not outcome.stdout.strip():
            problems.append("exit 0 without a result")
        if problems:
            failures.append((round(delay, 3), problems, outcome.stderr[-600:]))
    return failures


def _delays(command: str, scenario: Scenario, count: int) -> list[float]:
    """``count`` instants over the command's uninterrupted duration (measured once, reset
    after), the first at start-up."""
    duration = _run(scenario.argv, scenario.env)
    scenario.reset()
    rng = random.Random(command)
    return [EARLIEST + (duration * 1.1 - EARLIEST) * rng.random() for _ in range(count)]


@pytest.fixture
def models(deepseek_fp8_dir: Path, kimi_dir: Path) -> dict[str, Path]:
    return {"deepseek": deepseek_fp8_dir, "kimi": kimi_dir}


@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_sampled(command: str, models, tmp_path: Path, hub) -> None:
    scenario = _scenario(command, tmp_path, models, hub)
    fractions = [0.1, 0.5, 0.9] if command == "apply" else [0.3, 0.8]
    duration = _run(scenario.argv, scenario.env)
    scenario.reset()
    failures = _sweep(scenario, [EARLIEST + f * duration for f in fractions])
    assert not failures, failures


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_sweep(command: str, models, tmp_path: Path, hub) -> None:
    scenario = _scenario(command, tmp_path, models, hub)
    failures = _sweep(scenario, _delays(command, scenario, SWEEP))
    assert not failures, (f"{len(failures)} of {SWEEP} runs", failures)
