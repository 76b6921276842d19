"""publish / pull / hf:// through the embedded hub on 127.0.0.1 with the real client."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_fixtures import TOKENS, configure_hf_client, hub, running_hub  # noqa: F401

from patcher import api
from patcher.cli import main
from patcher.integrity.manifest import read_manifest


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.fixture
def variant(kimi_dir, tmp_path) -> Path:
    base = tmp_path / "kimi"
    shutil.copytree(kimi_dir, base)
    return api.apply("sm120-fp16-kv", base, out=tmp_path / "kimi-fixed").output


def cli(*args, env_token: str | None = None, monkeypatch=None):
    if monkeypatch is not None:
        if env_token:
            monkeypatch.setenv("HF_TOKEN", env_token)
        else:
            monkeypatch.delenv("HF_TOKEN", raising=False)
    return CliRunner().invoke(main, [str(a) for a in args])


def error_line(result) -> str:
    """The error line, after whatever progress bars came before it."""
    return result.stderr.splitlines()[-1]


def test_round_trip_publish_pull_verify(hub, variant, tmp_path, monkeypatch):
    result = cli("publish", variant, "alice/kimi-fixed", "--endpoint", hub.endpoint,
                 env_token="write-alice", monkeypatch=monkeypatch)
    assert result.exit_code == 0, result.output
    pulled = tmp_path / "pulled"
    result = cli("pull", "alice/kimi-fixed", "-o", pulled, "--endpoint", hub.endpoint)
    assert result.exit_code == 0, result.output
    assert api.verify(pulled).ok
    manifest = read_manifest(variant)
    for rel, (sha, size) in manifest.subjects.items():
        data = (pulled / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha and len(data) == size
    # No revert data travels; the hub's card is kept aside, where verify does not look.
    assert [p.name for p in (pulled / ".modelpatch").iterdir()] == ["hub"]
    assert not (pulled / ".cache").exists()

    info = hub.api("write-alice").model_info("alice/kimi-fixed")
    assert info.private
    commits = hub.api("write-alice").list_repo_commits("alice/kimi-fixed")
    assert "sm120-fp16-kv" in commits[0].title and "kimi" in commits[0].title
    card = (pulled / ".modelpatch" / "hub" / "README.md").read_text()
    assert "base_model" not in card and "- modelpatch" in card    # a plain dir: not guessed
    assert "/quantization_config/kv_cache_scheme" in card


def test_card_keeps_existing_text_and_replaces_its_section(hub, variant, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    client = hub.api("write-alice")
    client.create_repo("alice/v", private=True)
    client.upload_file(path_or_fileobj=b"---\nlicense: mit\n---\n# My model\nKeep me.\n",
                       path_in_repo="README.md", repo_id="alice/v")
    api.publish(variant, "alice/v", endpoint=hub.endpoint)
    api.publish(variant, "alice/v", endpoint=hub.endpoint)       # a second time: replaced
    card = Path(client.hf_hub_download("alice/v", "README.md")).read_text()
    assert "license: mit" in card and "Keep me." in card
    assert card.count("## Patched with modelpatch") == 1


def test_private_repo_invisible_without_token_and_wrong_token_refused(hub, variant, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/secret", endpoint=hub.endpoint)
    monkeypatch.delenv("HF_TOKEN")
    result = cli("pull", "alice/secret", "-o", tmp_path / "a", "--endpoint", hub.endpoint)
    assert result.exit_code == 3 and "not found or not visible" in result.stderr
    monkeypatch.setenv("HF_TOKEN", "wrong-token")
    result = cli("pull", "alice/secret", "-o", tmp_path / "b", "--endpoint", hub.endpoint)
    assert result.exit_code == 3
    assert "wrong-token" not in result.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_pull_sets_aside_the_hubs_gitattributes_and_stale_staging(hub, variant, tmp_path,
                                                                    monkeypatch):
    """huggingface.co puts a .gitattributes in every new repository; it is not the variant's.
    A pull killed earlier left a staging directory: the next pull removes it."""
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    client = hub.api("write-alice")
    client.create_repo("alice/ga", private=True)
    client.upload_file(path_or_fileobj=b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
                       path_in_repo=".gitattributes", repo_id="alice/ga")
    api.publish(variant, "alice/ga", endpoint=hub.endpoint)
    stale = tmp_path / ".p.modelpatch-staging-killed"
    (stale / "sub").mkdir(parents=True)
    result = cli("pull", "alice/ga", "-o", tmp_path / "p", "--endpoint", hub.endpoint)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / ".modelpatch" / "hub" / ".gitattributes").is_file()
    assert not (tmp_path / "p" / ".gitattributes").exists() and not stale.exists()
    assert api.verify(tmp_path / "p").ok


def test_a_variant_of_a_cache_snapshot_names_the_hub_repo_as_its_base(hub, kimi_dir, tmp_path,
                                                                      monkeypatch):
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(kimi_dir, tmp_path / "hf", "nvidia/Kimi-K2.5-NVFP4")
    variant = api.apply("sm120-fp16-kv", snap, out=tmp_path / "v").output
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/kimi-from-cache", endpoint=hub.endpoint)
    from huggingface_hub import hf_hub_download

    client = hub.api("write-alice")
    card = hf_hub_download("alice/kimi-from-cache", "README.md", endpoint=hub.endpoint,
                           token="write-alice", cache_dir=tmp_path / "dl")
    assert "base_model: nvidia/Kimi-K2.5-NVFP4" in Path(card).read_text()
    title = client.list_repo_commits("alice/kimi-from-cache")[0].title
    assert title == "modelpatch: sm120-fp16-kv applied to nvidia/Kimi-K2.5-NVFP4"


def test_tampered_blob_makes_pull_fail_and_leaves_nothing(hub, variant, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/t", endpoint=hub.endpoint)
    shard = read_manifest(variant).subjects["model-00003-of-00004.safetensors"].sha256
    blob = hub.root / "blobs" / "sha256" / shard[:2] / shard
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    result = cli("pull", "alice/t", "-o", tmp_path / "p", "--endpoint", hub.endpoint)
    assert result.exit_code == 1
    # The repository and the file are named, not the staging directory (gone by now).
    assert error_line(result).startswith("modelpatch: error: alice/t: downloaded files differ "
                                         "from the hub's digests: "
                                         "model-00003-of-00004.safetensors")
    assert "staging" not in result.stderr and str(tmp_path) not in result.stderr
    assert not (tmp_path / "p").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".p")]


def test_pull_errors_name_the_repo_not_the_staging_directory(hub, variant, tmp_path,
                                                             monkeypatch):
    """A file the hub serves faithfully but the manifest does not list, a repository without a
    manifest, and a malformed manifest: each error names the repository (and the file)."""
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    client = hub.api("write-alice")
    api.publish(variant, "alice/m", endpoint=hub.endpoint)
    client.upload_file(path_or_fileobj=b'{"changed": true}\n', path_in_repo="config.json",
                       repo_id="alice/m")
    client.create_repo("alice/plain", private=True)
    client.upload_file(path_or_fileobj=b"{}", path_in_repo="config.json", repo_id="alice/plain")
    client.create_repo("alice/bad", private=True)
    client.upload_file(path_or_fileobj=b"not json", path_in_repo="modelpatch.provenance.json",
                       repo_id="alice/bad")
    for repo, code, start in (
            ("alice/m", 1, "alice/m: downloaded files do not match the provenance manifest: "),
            ("alice/plain", 2, "alice/plain: not a modelpatch variant: no provenance manifest"),
            ("alice/bad", 2, "alice/bad: modelpatch.provenance.json: ")):
        out = tmp_path / repo.split("/")[1]
        result = cli("pull", repo, "-o", out, "--endpoint", hub.endpoint)
        assert result.exit_code == code, result.output
        assert error_line(result).startswith(f"modelpatch: error: {start}"), result.stderr
        assert "staging" not in result.stderr and str(tmp_path) not in result.stderr
        assert not out.exists()
    assert "(first: config.json: " in error_line(cli("pull", "alice/m", "-o", tmp_path / "m2",
                                                     "--endpoint", hub.endpoint))
    assert not [p for p in tmp_path.iterdir() if ".modelpatch-staging-" in p.name]


def test_refused_token_says_to_check_hf_token(hub, variant, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/secret", endpoint=hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", "wrong-token")
    for args in (["pull", "alice/secret", "-o", tmp_path / "p"],
                 ["publish", variant, "alice/other"]):
        result = cli(*args, "--endpoint", hub.endpoint)
        assert result.exit_code == 3
        assert "HTTP 401 (check HF_TOKEN or `hf auth login` for this endpoint)" in result.stderr
        assert "wrong-token" not in result.output and len(result.stderr.splitlines()) == 1
    monkeypatch.setenv("HF_TOKEN", "read-alice")          # a valid token without write access
    result = cli("publish", variant, "alice/other", "--endpoint", hub.endpoint)
    assert result.exit_code == 3
    assert "HTTP 403 (the token lacks the permission: check HF_TOKEN" in result.stderr
    assert not (tmp_path / "p").exists()


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:]!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("command, endpoint, env", [
    ("pull", "notaurl", False),
    ("pull", "ftp://127.0.0.1/", True),
    ("pull", "http://", False),
    ("pull", "http://127.0.0.1:notaport", True),
    ("publish", "notaurl", False),
    ("publish", "127.0.0.1:8080", True),
    ("apply", "notaurl", True),
])
def test_malformed_endpoint_is_bad_usage_before_any_request(command, endpoint, env, request,
                                                            tmp_path, monkeypatch):
    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    monkeypatch.chdir(tmp_path)
    args = {"pull": ["pull", "alice/x", "-o", tmp_path / "out"],
            "apply": ["apply", "sm120-fp16-kv", "hf://team/kimi"]}.get(command)
    if args is None:
        args = ["publish", request.getfixturevalue("variant"), "alice/x"]
    request.getfixturevalue("no_network")
    if env:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    else:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
        args += ["--endpoint", endpoint]
    before = set(tmp_path.iterdir())
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"modelpatch: error: hub endpoint {endpoint!r} is not an http:// or "
                             f"https:// URL (check --endpoint / HF_ENDPOINT, e.g. "
                             f"https://huggingface.co)\n")
    assert set(tmp_path.iterdir()) == before                  # no output, no staging


def test_malformed_endpoint_never_shows_its_credentials(tmp_path, monkeypatch, no_network):
    from patcher.errors import InputError

    with pytest.raises(InputError, match=r"'ftp://\*\*\*@127\.0\.0\.1/'") as caught:
        api.pull("alice/x", tmp_path / "out", endpoint="ftp://user:s3cret@127.0.0.1/")
    assert "s3cret" not in str(caught.value)


def test_huggingface_hubs_own_bars_never_show(hub, variant, tmp_path, monkeypatch, capfd):
    """modelpatch draws the progress: huggingface_hub's bars stay off during publish and pull,
    even where they would show (TQDM_POSITION=-1 forces them on a non-terminal), and are as
    they were afterwards; progress=False (the CLI's -q) also drops the line saying what is
    transferred. A trailing slash on the endpoint is harmless."""
    from huggingface_hub.utils import are_progress_bars_disabled

    monkeypatch.setenv("HF_TOKEN", "write-alice")
    monkeypatch.setenv("TQDM_POSITION", "-1")
    capfd.readouterr()
    api.publish(variant, "alice/bars", endpoint=hub.endpoint, progress=False)
    api.pull("alice/bars", tmp_path / "quiet", endpoint=hub.endpoint, progress=False)
    assert capfd.readouterr().err == ""
    assert not are_progress_bars_disabled()                     # restored afterwards
    grown = []
    api.publish(variant, "alice/bars", endpoint=hub.endpoint + "/", revision="b")
    api.pull("alice/bars", tmp_path / "loud", endpoint=hub.endpoint + "/",
             on_progress=grown.append, on_total=grown.append)
    err = capfd.readouterr().err
    assert "Upload" not in err and "Fetching" not in err and "it/s" not in err, err
    assert not are_progress_bars_disabled()
    total, *steps = grown                  # the download's own count: every byte, once
    assert steps and sum(steps) == total
    assert api.verify(tmp_path / "quiet").ok and api.verify(tmp_path / "loud").ok


def test_publishing_twice_stores_no_duplicate_blobs(hub, variant, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/twice", endpoint=hub.endpoint)
    blobs = sorted(p.name for p in (hub.root / "blobs").rglob("*") if p.is_file())
    api.publish(variant, "alice/twice", endpoint=hub.endpoint, revision="v2")
    assert sorted(p.name for p in (hub.root / "blobs").rglob("*") if p.is_file()) == blobs


def test_publish_refuses_a_variant_that_no_longer_verifies(hub, variant, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    (variant / "extra.bin").write_bytes(b"x")
    result = cli("publish", variant, "alice/x", "--endpoint", hub.endpoint)
    assert result.exit_code == 1 and "does not verify" in result.stderr
    assert not hub.api("write-alice").repo_exists("alice/x")


def test_apply_to_hf_model_resolves_through_the_cache(hub, kimi_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    client = hub.api("write-alice")
    client.create_repo("team/kimi", private=True)
    client.upload_folder(folder_path=str(kimi_dir), repo_id="team/kimi")
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.chdir(tmp_path)
    from huggingface_hub import constants

    result = cli("apply", "sm120-fp16-kv", "hf://team/kimi@main", "-q")
    assert result.exit_code == 0, result.output
    out = Path(result.stdout.strip())
    assert out == tmp_path / "kimi-sm120-fp16-kv" and api.verify(out).ok
    # The cache holds blobs named by their digests, and the snapshot was not modified.
    blobs = list((Path(constants.HF_HUB_CACHE) / "models--team--kimi" / "blobs").iterdir())
    for blob in blobs:
        if len(blob.name) == 64:
            assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name


def test_quiet_publish_pull_and_apply_show_no_progress_bars(hub, variant, kimi_dir, tmp_path,
                                                            monkeypatch, caplog):
    """-q (before or after the command) silences every progress line; without it pull says what
    it reuses and downloads, and huggingface_hub's bars never show."""
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    monkeypatch.setenv("TQDM_POSITION", "-1")      # bars on although stderr is not a terminal
    monkeypatch.chdir(tmp_path)
    client = hub.api("write-alice")
    client.create_repo("team/kimi", private=True)
    client.upload_folder(folder_path=str(kimi_dir), repo_id="team/kimi")
    for args in (["-q", "publish", variant, "alice/q"], ["publish", "-q", variant, "alice/q"],
                 ["-q", "pull", "alice/q", "-o", tmp_path / "a"],
                 ["pull", "-q", "alice/q", "-o", tmp_path / "b"]):
        result = cli(*args, "--endpoint", hub.endpoint)
        assert result.exit_code == 0, result.output
        assert result.stderr == "", args
    with caplog.at_level(logging.INFO, logger="modelpatch"):
        result = cli("pull", "alice/q", "-o", tmp_path / "c", "--endpoint", hub.endpoint)
    assert result.exit_code == 0 and "Fetching" not in result.stderr
    assert any("reused from local files" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    result = cli("apply", "sm120-fp16-kv", "hf://team/kimi", "-q", "-o", tmp_path / "v")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert api.verify(tmp_path / "a").ok and api.verify(tmp_path / "v").ok


@pytest.mark.slow
def test_large_file_streams_through_publish_and_pull(tmp_path, monkeypatch):
    """A 600 MB shard goes through publish and pull in child processes (server included);
    the largest child's peak RSS stays far below the file size."""
    import torch
    from safetensors.torch import save_file

    base = tmp_path / "big"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({
        "architectures": ["X"], "model_type": "x",
        "quantization_config": {"quant_method": "modelopt", "kv_cache_scheme":
                                {"num_bits": 8, "type": "float"}}}))
    save_file({"w": torch.zeros(300 * 1024 * 1024 // 2, dtype=torch.bfloat16)},
              base / "model.safetensors", metadata={"format": "pt"})
    variant = api.apply("sm120-fp16-kv", base, out=tmp_path / "v").output
    size = (variant / "model.safetensors").stat().st_size

    home = tmp_path / "hf-home"
    env = dict(os.environ, HF_HUB_DISABLE_XET="1", HF_HOME=str(home), HF_TOKEN="write-alice",
               MODELPATCH_CACHE_DIR=str(tmp_path / "dc"))
    env.pop("HF_HUB_OFFLINE", None)
    root = tmp_path / "hub"
    root.mkdir()
    (root / "tokens.json").write_text(json.dumps({"tokens": TOKENS}))
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", RSS_WRAPPER, sys.executable, "-m",
                               "patcher.cli", "hub", "serve", "--root", str(root), "--port",
                               str(port)], env=env, stdout=subprocess.PIPE, text=True)
    peaks = {}
    try:
        endpoint = f"http://127.0.0.1:{port}"
        _wait_for(endpoint)
        for args in (["publish", str(variant), "alice/big", "--endpoint", endpoint],
                     ["pull", "alice/big", "-o", str(tmp_path / "pulled"), "--endpoint",
                      endpoint]):
            peaks[args[0]] = peak_rss([sys.executable, "-m", "patcher.cli", "-q", *args], env=env)
    finally:
        server.terminate()
        peaks["server"] = int(server.communicate(timeout=60)[0].split()[-1])
    assert api.verify(tmp_path / "pulled").ok
    for who, peak in peaks.items():
        assert peak < size / 2, f"{who}: peak RSS {peak >> 20} MiB for a {size >> 20} MiB file"


# Runs a command and prints its peak RSS in bytes. A child forked straight from pytest would
# count pytest's own pages (ru_maxrss includes the image before exec); a fresh, small
# interpreter in between measures only the command. SIGTERM is passed on to the command.
RSS_WRAPPER = """
import resource, signal, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, lambda *_: child.terminate())
code = child.wait()
assert code in (0, -15), code
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def peak_rss(cmd: list[str], env: dict) -> int:
    out = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *cmd], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return int(out.split()[-1])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(endpoint: str) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(endpoint + "/api/whoami-v2", timeout=1)
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
        else:
            return
    raise RuntimeError("hub did not start")


def test_the_card_of_stacked_patches_names_every_recipe(hub, kimi_dir, tmp_path, monkeypatch):
    from huggingface_hub import hf_hub_download

    base = tmp_path / "kimi"
    shutil.copytree(kimi_dir, base)
    api.apply_in_place("sm120-fp16-kv", base)
    api.apply_in_place("drop-kv-scales", base)
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(base, "alice/stacked", endpoint=hub.endpoint)
    card = Path(hf_hub_download("alice/stacked", "README.md", endpoint=hub.endpoint,
                                token="write-alice", cache_dir=tmp_path / "dl")).read_text()
    assert "recipes `sm120-fp16-kv`" in card and "then `drop-kv-scales`" in card
    assert "### `sm120-fp16-kv`" in card and "/quantization_config/kv_cache_scheme" in card
    assert "### `drop-kv-scales`" in card and "tensors dropped" in card
    assert "k_proj.k_scale`" in card
    assert "modelpatch-recipe:sm120-fp16-kv" in card and "modelpatch-recipe:drop-kv-scales" in card
