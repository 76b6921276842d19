"""What publish and pull say, as a user at a shell sees it (child processes, so stderr is a
real file): results only after the hub took them, one line when it refuses."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hub_fixtures import hub  # noqa: F401

from patcher import api


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))
    monkeypatch.delenv("TQDM_POSITION", raising=False)


@pytest.fixture
def variant(kimi_dir, tmp_path) -> Path:
    base = tmp_path / "kimi"
    shutil.copytree(kimi_dir, base)
    return api.apply("sm120-fp16-kv", base, out=tmp_path / "kimi-fixed").output


def run(*args, token: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "patcher.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=120)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_publish_says_what_it_uploaded_only_once_the_hub_took_it(hub, variant):
    publish = ["publish", variant, "alice/v", "--base-model", "org/kimi", "--endpoint"]
    refused = run(*publish, hub.endpoint, token="bad-token")
    assert refused.returncode == 3, refused.stderr
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "modelpatch: error: alice/v: create_repo: the hub answered HTTP 401 (check HF_TOKEN or "
        "`hf auth login` for this endpoint)"], refused.stderr
    nobody = f"http://127.0.0.1:{_closed_port()}"
    unreachable = run(*publish, nobody, token="write-alice")
    assert unreachable.returncode == 3, unreachable.stderr
    assert len(unreachable.stderr.splitlines()) == 1, unreachable.stderr
    assert "uploaded" not in unreachable.stderr and "cannot reach the hub" in unreachable.stderr
    done = run(*publish, hub.endpoint, token="write-alice")
    assert done.returncode == 0, done.stderr
    assert "uploaded, to alice/v" in done.stderr and done.stdout.startswith("alice/v@main ")
