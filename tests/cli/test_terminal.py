"""The main commands as a user sees them on a terminal (a pseudo-terminal 80 and 120 columns
wide, stdout and stderr both on it): once the progress bars are cleared, each line printed is
whole on the screen, the variant path alone on its row, nothing left of a bar, huggingface_hub's
bars never drawn over ours, counts with their nouns in the right number."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hub_fixtures import hub  # noqa: F401
from interrupt_harness import MODELPATCH
from pty_helpers import run_on_terminal

from patcher.cli.render import render_verify
from patcher.units import plural

DEBRIS = re.compile(r"\d+%\||[\d.]+\s?\w?B/s|it/s|Fetching|Download complete|Reconstruct")
RECIPE_LINE = re.compile(r"modelpatch: recipe file \S+ sha256 [0-9a-f]{64}")


@pytest.fixture
def short_dir():
    """A directory with a short path, so that a variant path fits on one row of 80 columns."""
    path = Path(tempfile.mkdtemp(prefix="mpt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _shown(args: list, columns: int, env: dict, code: int = 0) -> list[str]:
    """The lines a command leaves on a terminal ``columns`` wide (rows a wrap continued
    joined), after checking its exit code and that no row holds what is left of a bar."""
    run = run_on_terminal([MODELPATCH, *map(str, args)], columns, env=env)
    text = "\n".join(run.lines)
    assert run.returncode == code, text
    assert not DEBRIS.search(text), text
    return [line for line in run.logical_lines if line]


def _alone(path: Path, run_lines: list[str], columns: int) -> None:
    assert len(str(path)) < columns
    assert run_lines[-1] == str(path), run_lines


@pytest.mark.parametrize("columns", [80, 120])
def test_main_commands_on_a_terminal(columns: int, deepseek_fp8_dir: Path, kimi_dir: Path,
                                     short_dir: Path, hub) -> None:
    env = dict(os.environ, MODELPATCH_CACHE_DIR=str(short_dir / "digests"),
               HF_ENDPOINT=hub.endpoint, HF_TOKEN="write-alice")
    base = short_dir / "base"
    shutil.copytree(deepseek_fp8_dir, base)
    variant = short_dir / "variant"

    # Every shard rewritten: a writing and a hashing bar at once, the second cleared below
    # the first.
    lines = _shown(["apply", "fp8-block-to-bf16", base, "-o", variant], columns, env)
    _alone(variant, lines, columns)
    assert len(lines) == 2 and RECIPE_LINE.fullmatch(lines[0]), lines

    assert _shown(["verify", variant], columns, env) == ["OK  6 files match the manifest"]

    subprocess.run([MODELPATCH, "publish", "-q", variant, "alice/v"], env=env, check=True,
                   capture_output=True)
    pulled = short_dir / "pulled"
    lines = _shown(["pull", "alice/v", "-o", pulled], columns, env)
    assert re.fullmatch(r"modelpatch: pull: alice/v@\w{12}: 0 files \(0 B\) reused from "
                        r"local files, \d+ files \([\d.]+ MiB\) to download", lines[0]), lines
    assert len(lines) == 2, lines
    _alone(pulled, lines, columns)

    kimi = short_dir / "kimi"
    shutil.copytree(kimi_dir, kimi)
    lines = _shown(["doctor", kimi, "--engine", "vllm==0.15.1", "--gpu", "sm120"], columns,
                   env, code=1)
    assert lines[-1] == "2 findings, 1 blocker", lines

    lines = _shown(["inspect", variant], columns, env)
    assert lines[0] == f"model      {variant}" and lines[-1].startswith("index      present")


def test_counts_take_the_noun_in_the_right_number() -> None:
    assert [plural(n, "file") for n in (0, 1, 2)] == ["0 files", "1 file", "2 files"]
    assert plural(1, "patch", "patches") == "1 patch" and plural(3, "patch", "patches") == \
        "3 patches"
    one = {"ok": True, "checked": 1, "cached_files": 0}
    assert render_verify(one) == "OK  1 file matches the manifest"
