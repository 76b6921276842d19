"""The repository passes ruff as pyproject.toml configures it (pyflakes, import order, line
length), so CI enforces it like any other test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: it is in the test extras (pip install -e '.[test]')")
    return [found]


def test_ruff_finds_nothing():
    result = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
