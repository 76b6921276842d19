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


def test_pull_force_replaces_an_earlier_pull_and_downloads_only_what_changed(hub, variant,
                                                                             tmp_path):
    assert run("publish", variant, "alice/v", "--base-model", "org/kimi", "--endpoint",
               hub.endpoint, token="write-alice").returncode == 0
    out = tmp_path / "pulled"
    pull = ["pull", "alice/v", "-o", out, "--endpoint", hub.endpoint]
    assert run(*pull, token="read-alice").returncode == 0
    again = run(*pull, token="read-alice")
    assert again.returncode == 2 and again.stderr.splitlines() == [
        f"modelpatch: error: {out}: output already exists (--force replaces it)"], again.stderr
    (out / "config.json").chmod(0o644)
    (out / "config.json").write_text("{}")                       # the user broke it
    forced = run(*pull, "--force", token="read-alice")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout == f"{out}\n"
    assert api.verify(out).ok
    assert "0 files (0 B) to download" not in forced.stderr      # config.json came again
    assert re_search(r"\d+ files \(\S+ \w+\) reused from local files", forced.stderr)
    assert not [p for p in tmp_path.iterdir() if ".modelpatch-" in p.name]   # nothing aside


def test_pull_force_never_replaces_a_directory_pull_did_not_write(hub, variant, tmp_path):
    assert run("publish", variant, "alice/v", "--base-model", "org/kimi", "--endpoint",
               hub.endpoint, token="write-alice").returncode == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    refused = run("pull", "alice/v", "-o", mine, "--force", "--endpoint", hub.endpoint,
                  token="read-alice")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "is not a modelpatch variant" in refused.stderr
    assert (mine / "notes.txt").read_text() == "keep me"


def test_pull_into_a_missing_parent_is_bad_usage_as_for_apply(hub, tmp_path):
    out = tmp_path / "no" / "such" / "dir"
    result = run("pull", "alice/v", "-o", out, "--endpoint", hub.endpoint)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"modelpatch: error: {out.parent}: the output's parent directory does not exist"]


def re_search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


def test_doctor_fix_command_for_a_hub_model_runs_as_printed(hub, kimi_dir, tmp_path):
    """The printed fix names the commit doctor read and the hub it read it on; pasted into a
    shell without HF_ENDPOINT it applies the recipe to that very commit."""
    from remote_fixtures import store_model

    store_model(hub.root, "alice/kimi", kimi_dir)
    commit = hub.api("read-alice").model_info("alice/kimi").sha
    report = run("doctor", "hf://alice/kimi", "--endpoint", hub.endpoint, "--engine",
                 "vllm==0.15.1", "--gpu", "sm120", token="read-alice")
    assert report.returncode == 1, report.stderr
    fixes = [line.split("fix: ", 1)[1].split("  (or doctor --fix)")[0]
             for line in report.stdout.splitlines() if "fix: modelpatch apply sm120" in line]
    assert fixes == [f"modelpatch apply sm120-fp16-kv hf://alice/kimi@{commit} "
                     f"--endpoint {hub.endpoint}"], report.stdout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_TOKEN": "read-alice"}
    env.pop("HF_ENDPOINT", None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "modelpatch").write_text(f'#!/bin/sh\nexec {sys.executable} -m patcher.cli "$@"\n')
    (bin_dir / "modelpatch").chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    pasted = subprocess.run(["sh", "-c", fixes[0]], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert pasted.returncode == 0, pasted.stderr
    assert api.verify(pasted.stdout.strip()).ok


def test_apply_of_a_hub_model_it_cannot_reach_is_one_line(tmp_path, monkeypatch):
    """huggingface_hub's paragraph ("we cannot find the appropriate snapshot folder") becomes
    the line every other command gives for an unreachable hub."""
    from hub_fixtures import configure_hf_client

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    nobody = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", nobody)
    monkeypatch.chdir(tmp_path)
    for command in (["apply", "sm120-fp16-kv", "hf://alice/kimi"],
                    ["doctor", "hf://alice/kimi", "--fix"]):
        result = run(*command)
        assert result.returncode == 3, result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert f"cannot reach the hub at {nobody} (ConnectError" in result.stderr, result.stderr
        assert "snapshot folder" not in result.stderr
