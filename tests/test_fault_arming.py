"""``MODELPATCH_FAULT`` (patcher/faults.py) acts only inside the test suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE = "from patcher import faults; faults.point('commit'); print('survived')"


def _run(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CODE], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_a_kill_fault_is_ignored_outside_a_test():
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["MODELPATCH_FAULT"] = "kill@commit"
    result = _run(env)
    assert (result.returncode, result.stdout.strip()) == (0, "survived")


def test_a_kill_fault_acts_under_pytest():
    assert os.environ.get("PYTEST_CURRENT_TEST")          # what the commands a test starts see
    result = _run(dict(os.environ, MODELPATCH_FAULT="kill@commit"))
    assert result.returncode == -signal.SIGKILL and "survived" not in result.stdout
