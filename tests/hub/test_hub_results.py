"""What publish and pull say, as a user at a shell sees it (child processes, so stderr is a
real file): results only after the hub took them, one line when it refuses."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest
from hub_fixtures import hub, own_digest_cache, variant  # noqa: F401

from patcher import api


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
    assert "uploaded over Git LFS, to alice/v" in done.stderr
    assert done.stdout.startswith("alice/v@main ")


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


def test_a_base_published_with_base_is_pulled_and_checked_file_by_file(hub, kimi_dir, tmp_path):
    """publish --base puts a plain model on the hub with its sha256 digests; pull checks every
    file against them (a tampered blob is refused) and gives back the base itself."""
    import hashlib
    import json

    from patcher.integrity.verify import list_files

    published = run("publish", "--base", kimi_dir, "alice/kimi", "--endpoint", hub.endpoint,
                    token="write-alice")
    assert published.returncode == 0, published.stderr
    assert published.stdout.startswith("alice/kimi@main ")
    out = tmp_path / "pulled"
    pulled = run("pull", "alice/kimi", "-o", out, "--endpoint", hub.endpoint, token="read-alice")
    assert pulled.returncode == 0, pulled.stderr
    assert list_files(out).keys() == list_files(kimi_dir).keys()
    for rel in list_files(kimi_dir):
        assert (out / rel).read_bytes() == (kimi_dir / rel).read_bytes(), rel
    record = json.loads((out / ".modelpatch/hub/modelpatch.base.json").read_text())
    config = (kimi_dir / "config.json").read_bytes()
    assert {"name": "config.json", "digest": {"sha256": hashlib.sha256(config).hexdigest()},
            "annotations": {"size": len(config)}} in record["subject"]
    # a variant of the hub's base: the record is the hub repository's, never the model's
    variant = run("apply", "sm120-fp16-kv", "hf://alice/kimi", "--publish", "alice/kimi-sm120",
                  "--endpoint", hub.endpoint, token="write-alice")
    assert variant.returncode == 0, variant.stderr
    files = hub.api("read-alice").list_repo_files("alice/kimi-sm120")
    assert "modelpatch.base.json" not in files and "modelpatch.provenance.json" in files
    again = run("pull", "alice/kimi-sm120", "-o", tmp_path / "v", "--endpoint", hub.endpoint,
                token="read-alice")
    assert again.returncode == 0, again.stderr
    assert api.verify(tmp_path / "v").ok

    # the hub serves other bytes under the recorded name: nothing appears at the output
    other = tmp_path / "other"
    shutil.copytree(kimi_dir, other)
    (other / "config.json").write_text(json.dumps({"model_type": "other"}))
    ok = run("publish", "--base", other, "alice/swap", "--endpoint", hub.endpoint,
             token="write-alice")
    assert ok.returncode == 0, ok.stderr
    client = hub.api("write-alice")
    client.upload_file(path_or_fileobj=json.dumps(record).encode(),
                       path_in_repo="modelpatch.base.json", repo_id="alice/swap")
    refused = run("pull", "alice/swap", "-o", tmp_path / "swap", "--endpoint", hub.endpoint,
                  token="read-alice")
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.splitlines()[-1].startswith(
        "modelpatch: error: alice/swap: downloaded files do not match the base's digest record: "
        "1 modified, 0 missing, 0 extra (first: config.json"), refused.stderr
    assert not (tmp_path / "swap").exists()


def test_publish_base_refuses_a_variant_and_base_model(hub, variant, kimi_dir):
    plain = run("publish", kimi_dir, "alice/x", "--endpoint", hub.endpoint, token="write-alice")
    assert plain.returncode == 2, plain.stderr
    assert plain.stderr.splitlines() == [
        f"modelpatch: error: {kimi_dir}: no provenance manifest: not a modelpatch variant "
        f"(--base publishes a plain model (a base) with the sha256 of its files)"]
    as_base = run("publish", "--base", variant, "alice/x", "--endpoint", hub.endpoint,
                  token="write-alice")
    assert as_base.returncode == 2, as_base.stderr
    assert "a modelpatch variant, not a base: publish it without --base" in as_base.stderr
    both = run("publish", "--base", variant, "alice/x", "--base-model", "a/b", "--endpoint",
               hub.endpoint, token="write-alice")
    assert both.returncode == 2


def test_hub_serve_refuses_a_missing_root_unless_init(tmp_path):
    typo = tmp_path / "hbu"
    refused = run("hub", "serve", "--root", typo, "--port", "0")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        f"modelpatch: error: {typo}: no hub here: the directory does not exist (check --root, "
        f"or add --init to create a new, empty hub)"]
    assert not typo.exists()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen([sys.executable, "-m", "patcher.cli", "hub", "serve", "--root",
                               typo, "--init", "--port", "0"], env=env,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        while line and "serving" not in line:
            line = server.stderr.readline()
        assert "serving" in line and typo.is_dir()
    finally:
        server.terminate()
        server.communicate(timeout=60)


@pytest.mark.parametrize("endpoint, words", [
    ("https://huggingface.co", []),
    ("https://hf.co", []),
    ("http://localhost:8080", ["--endpoint", "http://localhost:8080"]),
    ("https://huggingface.co.evil.example", ["--endpoint", "https://huggingface.co.evil.example"]),
])
def test_a_hub_model_is_named_by_its_commit_and_its_endpoint(endpoint, words):
    from patcher.remote.model import command_words

    report = {"repo_id": "org/name", "commit": "a" * 40, "endpoint": endpoint}
    assert command_words(report) == [f"hf://org/name@{'a' * 40}", *words]


def test_publishing_a_base_again_removes_the_files_it_no_longer_has(hub, kimi_dir, tmp_path):
    """The commit holds exactly what its record lists, so the pull of it verifies."""
    base = tmp_path / "base"
    shutil.copytree(kimi_dir, base)
    publish = ["publish", "--base", base, "alice/kimi", "--endpoint", hub.endpoint]
    assert run(*publish, token="write-alice").returncode == 0
    (base / "docs" / "deploy_guidance.md").unlink()
    again = run(*publish, token="write-alice")
    assert again.returncode == 0, again.stderr
    assert "docs/deploy_guidance.md" not in hub.api("read-alice").list_repo_files("alice/kimi")
    out = tmp_path / "pulled"
    pulled = run("pull", "alice/kimi", "-o", out, "--endpoint", hub.endpoint, token="read-alice")
    assert pulled.returncode == 0, pulled.stderr
    assert (out / "config.json").is_file() and not (out / "docs").exists()
