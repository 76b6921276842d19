"""publish copies a variant's unchanged files server-side from its base repository; pull links
local files with the right sha256 instead of downloading them. Bytes are measured at the
embedded hub (request and response body counters). One hub and one 8-shard base per module."""
# ruff: noqa: F811

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_fixtures import TOKENS, configure_hf_client, running_hub  # noqa: F401

from patcher import api
from patcher.cli.commands import main

RECIPE = "sm120-fp16-kv"          # config-only: every shard is linked into the variant


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The hub, with ``alice/base`` (private, 8 shards) on it and in the local HF cache."""
    from huggingface_hub import snapshot_download

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import synth
    finally:
        sys.path.pop(0)

    tmp = tmp_path_factory.mktemp("dedupe")
    with pytest.MonkeyPatch.context() as mp:
        configure_hf_client(mp, tmp / "hf-home")
        mp.setenv("MODELPATCH_CACHE_DIR", str(tmp / "digest-cache"))
        with running_hub(tmp / "hub", TOKENS) as hub:
            base = tmp / "base"
            synth.generate(base, size_gb=0.05, shards=8, fmt="fp8-block", kv_cache="fp8",
                           sync=False)
            alice = hub.api("write-alice")
            alice.create_repo("alice/base", private=True)
            alice.upload_folder(repo_id="alice/base", folder_path=base)
            snapshot = Path(snapshot_download("alice/base", endpoint=hub.endpoint,
                                              token="write-alice"))
            variant = api.apply(RECIPE, snapshot, out=tmp / "variant").output
            model_bytes = sum(p.stat().st_size for p in base.iterdir())
            shard_bytes = sum(p.stat().st_size for p in base.glob("*.safetensors"))
            yield {"hub": hub, "tmp": tmp, "base": base, "snapshot": snapshot, "variant": variant,
                   "model_bytes": model_bytes, "shard_bytes": shard_bytes, "mp": mp}


def cli(world, *args, token: str | None = "write-alice"):
    if token:
        world["mp"].setenv("HF_TOKEN", token)
    else:
        world["mp"].delenv("HF_TOKEN", raising=False)
    return CliRunner().invoke(main, [str(a) for a in args])


def measured(world, fn):
    """``fn()``'s result and the body bytes (client->hub, hub->client) it moved."""
    before = world["hub"].traffic.snapshot()
    result = fn()
    after = world["hub"].traffic.snapshot()
    return result, after[0] - before[0], after[1] - before[1]


def test_config_only_variant_publishes_and_pulls_under_one_percent(world, caplog):
    hub, variant = world["hub"], world["variant"]
    result, sent, _ = measured(world, lambda: cli(world, "publish", variant, "alice/base-kv",
                                                  "--endpoint", hub.endpoint, "--json"))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["copied_bytes"] == world["shard_bytes"]
    assert sent < 0.01 * world["model_bytes"], sent
    pulled = world["tmp"] / "pulled"
    with caplog.at_level(logging.INFO, logger="modelpatch"):
        result, _, received = measured(world, lambda: cli(world, "pull", "alice/base-kv", "-o",
                                                          pulled, "--endpoint", hub.endpoint))
    assert result.exit_code == 0, result.output
    assert received < 0.01 * world["model_bytes"], received
    assert api.verify(pulled).ok
    assert ": 8 files (" in caplog.text and "reused from local files" in caplog.text


def test_plan_shows_copies_and_uploads_and_changes_nothing(world):
    hub = world["hub"]
    result = cli(world, "publish", world["variant"], "alice/plan-only", "--endpoint",
                 hub.endpoint, "--plan")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("plan: 8 files")
    assert "copied server-side from alice/base@" in lines[0]
    assert sum(line.startswith("  copy ") for line in lines) == 8
    assert any(line.startswith("  upload  config.json") for line in lines)
    assert not hub.api("write-alice").repo_exists("alice/plan-only")


def test_server_without_the_endpoint_falls_back_to_uploading(world, monkeypatch, caplog):
    from patcher.hub.server import app as server

    world["mp"].setenv("HF_TOKEN", "write-alice")
    monkeypatch.setattr(server, "_COMPILED", [r for r in server._COMPILED
                                               if "lfs-files" not in r[1].pattern])
    with caplog.at_level(logging.WARNING, logger="modelpatch"):
        r, sent, _ = measured(world, lambda: api.publish(world["variant"], "alice/kv-no-copy",
                                                         endpoint=world["hub"].endpoint,
                                                         progress=False))
    assert "server-side copy refused (the hub answered HTTP 404" in caplog.text
    assert not r.plan.copies and sent > world["model_bytes"]
    _pull_and_verify(world, "alice/kv-no-copy")


def test_token_unable_to_read_the_base_uploads_everything(world, caplog):
    with caplog.at_level(logging.WARNING, logger="modelpatch"):
        result = cli(world, "publish", world["variant"], "bob/kv", "--endpoint",
                     world["hub"].endpoint, "--json", token="write-bob")
    assert result.exit_code == 0, result.output
    assert "cannot read the base repository alice/base@" in caplog.text
    assert json.loads(result.stdout)["copied_bytes"] == 0
    _pull_and_verify(world, "bob/kv", token="write-bob")


def test_file_changed_on_the_hub_is_uploaded_the_others_copied(world, tmp_path, caplog):
    """A base named only by the manifest's base_model is checked at ``main``: the shard changed
    there since is uploaded, the other seven are still copied."""
    hub, base = world["hub"], world["base"]
    world["mp"].setenv("HF_TOKEN", "write-alice")
    alice = hub.api("write-alice")
    alice.create_repo("alice/moving-base", private=True)
    alice.upload_folder(repo_id="alice/moving-base", folder_path=base)
    local_base = tmp_path / "local-base"
    shutil.copytree(base, local_base)
    variant = api.apply(RECIPE, local_base, out=tmp_path / "v",
                        base_model="alice/moving-base").output
    changed = sorted(p.name for p in base.glob("*.safetensors"))[2]
    alice.upload_file(path_or_fileobj=b"not the shard any more", path_in_repo=changed,
                      repo_id="alice/moving-base")
    with caplog.at_level(logging.WARNING, logger="modelpatch"):
        r = api.publish(variant, "alice/kv-moved", endpoint=hub.endpoint, progress=False)
    assert f"{changed} has another sha256 in alice/moving-base@" in caplog.text
    assert changed in r.plan.uploads and len(r.plan.copies) == 7
    _pull_and_verify(world, "alice/kv-moved")


def _pull_and_verify(world, repo_id: str, token: str = "write-alice") -> None:
    out = world["tmp"] / repo_id.replace("/", "-")
    result = cli(world, "pull", repo_id, "-o", out, "--endpoint", world["hub"].endpoint,
                 token=token)
    assert result.exit_code == 0, result.output
    assert api.verify(out).ok


def _published_variant(world) -> str:
    """``alice/base-kv``, published (with copies) once for the pull tests."""
    if not world["hub"].api("write-alice").repo_exists("alice/base-kv"):
        world["mp"].setenv("HF_TOKEN", "write-alice")
        api.publish(world["variant"], "alice/base-kv", endpoint=world["hub"].endpoint,
                    progress=False)
    return "alice/base-kv"


def test_pull_reuses_a_reuse_dir_without_the_cache(world, tmp_path, monkeypatch):
    from huggingface_hub import constants

    repo = _published_variant(world)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    out = tmp_path / "pulled"
    r, _, received = measured(world, lambda: api.pull(repo, out, endpoint=world["hub"].endpoint,
                                                      progress=False, reuse=[world["base"]]))
    assert r.reused_bytes == world["shard_bytes"] and received < 0.01 * world["model_bytes"]
    assert api.verify(out).ok


def test_pull_never_trusts_a_name_or_a_size(world, tmp_path, monkeypatch, caplog):
    """A cache blob named by a shard's sha256 but holding other bytes, and a --reuse file of the
    right size with other bytes: both are downloaded instead, and the pull verifies."""
    from huggingface_hub import constants

    from patcher.integrity.manifest import read_manifest

    repo = _published_variant(world)
    shards = sorted((rel, entry) for rel, entry in read_manifest(world["variant"]).subjects.items()
                    if rel.endswith(".safetensors"))
    (rel0, (sha0, size0)), (rel1, (_, size1)) = shards[0], shards[1]
    blobs = tmp_path / "cache" / "models--mallory--fake" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / sha0).write_bytes(b"\0" * size0)
    decoys = tmp_path / "decoys"
    decoys.mkdir()
    (decoys / rel1).write_bytes(b"\1" * size1)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "pulled"
    with caplog.at_level(logging.WARNING, logger="modelpatch"):
        r = api.pull(repo, out, endpoint=world["hub"].endpoint, progress=False, reuse=[decoys])
    assert f"does not hold the bytes of {rel0}" in caplog.text
    assert r.reused_bytes == 0 and r.downloaded_bytes > world["shard_bytes"]
    assert api.verify(out).ok


def test_variant_of_a_pulled_variant_copies_from_the_pulled_repository(world, tmp_path):
    repo = _published_variant(world)
    pulled = api.pull(repo, tmp_path / "pulled", endpoint=world["hub"].endpoint,
                      progress=False).output
    recipe = tmp_path / "ctx.yaml"
    recipe.write_text("modelpatch: 1\nname: longer-context\ndescription: d\nconfig:\n"
                      "  config.json:\n    - set: /max_position_embeddings\n      value: 8192\n")
    variant = api.apply(str(recipe), pulled, out=tmp_path / "v2").output
    world["mp"].setenv("HF_TOKEN", "write-alice")
    r, sent, _ = measured(world, lambda: api.publish(variant, "alice/base-kv-ctx",
                                                     endpoint=world["hub"].endpoint,
                                                     progress=False))
    assert r.plan.source.repo_id == repo and r.plan.copy_bytes == world["shard_bytes"]
    assert sent < 0.01 * world["model_bytes"]


def test_apply_hf_publish_downloads_no_shard(world, tmp_path, monkeypatch):
    """``apply RECIPE hf://... --publish``: no shard crosses the network either way, the output
    names the files fetched, and the published variant pulls (into an empty cache) and verifies
    with the same files as a local apply of the same recipe."""
    from huggingface_hub import constants

    from patcher.integrity.manifest import read_manifest

    hub = world["hub"]
    result, sent, received = measured(world, lambda: cli(
        world, "apply", RECIPE, "hf://alice/base", "--publish", "alice/remote-kv",
        "--endpoint", hub.endpoint, "--json"))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert not any(name.endswith(".safetensors") for name in out["fetched"])
    assert "config.json" in out["fetched"] and out["copied_bytes"] == world["shard_bytes"]
    # received: the shards' safetensors headers and the regular files (the 290 KB index above
    # all), 1.3% of this small synthetic model, far less of a real one; never a shard's data
    smallest_shard = min(p.stat().st_size for p in world["base"].glob("*.safetensors"))
    assert sent < 0.01 * world["model_bytes"] and received < 0.02 * world["model_bytes"]
    assert received < smallest_shard / 4
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    pulled = api.pull("alice/remote-kv", tmp_path / "pulled", endpoint=hub.endpoint,
                      progress=False).output
    assert api.verify(pulled).ok
    assert read_manifest(pulled).subjects == read_manifest(world["variant"]).subjects


def test_apply_hf_publish_refuses_a_tensor_recipe(world):
    result = cli(world, "apply", "fp8-block-to-bf16", "hf://alice/base", "--publish",
                 "alice/remote-bf16", "--endpoint", world["hub"].endpoint)
    assert result.exit_code == 2
    assert "--publish from hf:// needs a config-only recipe" in result.stderr
    assert not world["hub"].api("write-alice").repo_exists("alice/remote-bf16")


def test_pull_skips_a_reuse_file_it_cannot_read(world, tmp_path, monkeypatch, caplog):
    """A --reuse candidate that cannot be read (as for a file without read permission, which
    root cannot be shown) is left out with a warning; the others are still reused."""
    from huggingface_hub import constants

    from patcher.errors import OperationFailed
    from patcher.hub.client import reuse

    repo = _published_variant(world)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    unreadable = sorted(world["base"].glob("*.safetensors"))[0]
    real = reuse.sha256_file

    def refuse(paths, **_):
        raise OperationFailed("cannot read: Permission denied", where=str(unreadable))

    def sha256_file(path, **kw):
        if Path(path) == unreadable:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, **kw)

    monkeypatch.setattr(reuse, "hash_files", refuse)
    monkeypatch.setattr(reuse, "sha256_file", sha256_file)
    with caplog.at_level(logging.WARNING, logger="modelpatch"):
        r = api.pull(repo, tmp_path / "pulled", endpoint=world["hub"].endpoint, progress=False,
                     reuse=[world["base"]])
    assert f"cannot read {unreadable} to compare it (Permission denied)" in caplog.text
    assert r.reused_bytes == world["shard_bytes"] - unreadable.stat().st_size
    assert api.verify(r.output).ok


_TWO_RECIPES = {
    "set-temp": "params:\n  temperature: {type: number, default: 1.0, description: t}\n"
                "config:\n  config.json:\n    - {set: /x_temperature, value: \"{temperature}\"}\n",
    "set-label": "params:\n  label: {type: string, default: none, description: l}\n"
                 "config:\n  config.json:\n    - {set: /x_label, value: \"{label}\"}\n",
}


def _comparable(statement: dict) -> dict:
    """A manifest without what only says where and when it was made: the run's details and the
    options of a local executor (how files were carried, workers, device)."""
    predicate = dict(statement["predicate"])
    predicate.pop("runDetails")
    definition = dict(predicate["buildDefinition"])
    external = dict(definition["externalParameters"])
    external["options"] = {k: v for k, v in external["options"].items()
                           if k not in ("link", "jobs", "device")}
    definition["externalParameters"] = external
    predicate["buildDefinition"] = definition
    return {**statement, "predicate": predicate}


def test_apply_hf_publish_records_the_manifest_of_a_local_apply(world, tmp_path, monkeypatch):
    """One manifest builder for every executor: two recipes with ``--set`` values applied
    locally and applied on the hub with ``--publish`` record the same recipe (its parameter
    values and its components), options, change log, subjects and base files."""
    from huggingface_hub import constants

    from patcher.integrity.manifest import read_manifest

    paths = []
    for name, body in _TWO_RECIPES.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"modelpatch: 1\nname: {name}\ndescription: {name}\n{body}")
        paths.append(path)
    sets = ["--set", "set-temp.temperature=0.6", "--set", "set-label.label=hello"]
    local = tmp_path / "local"
    result = cli(world, "apply", *paths, world["snapshot"], "-o", local, *sets)
    assert result.exit_code == 0, result.output
    result = cli(world, "apply", *paths, "hf://alice/base", "--publish", "alice/remote-two",
                 "--endpoint", world["hub"].endpoint, *sets)
    assert result.exit_code == 0, result.output
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    pulled = api.pull("alice/remote-two", tmp_path / "pulled", endpoint=world["hub"].endpoint,
                      progress=False).output
    remote, here = read_manifest(pulled).statement, read_manifest(local).statement
    recipe = remote["predicate"]["buildDefinition"]["externalParameters"]["recipe"]
    assert [c["params"] for c in recipe["components"]] == [{"temperature": 0.6},
                                                             {"label": "hello"}]
    assert _comparable(remote) == _comparable(here)


def test_reuse_never_hard_links_a_file_another_user_owns(tmp_path, monkeypatch):
    """A ``--reuse`` or cache file owned by someone else is copied (or reflinked), never
    hard-linked: its owner's later edits must not change the pulled variant. Files the user
    owns are still hard-linked."""
    import hashlib
    import os

    from patcher.hub.client.reuse import link_into

    source = tmp_path / "theirs.safetensors"
    source.write_bytes(b"shard bytes" * 100)
    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    wanted = {"model.safetensors": (sha, source.stat().st_size)}
    owner = source.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)          # the file is someone else's
    (tmp_path / "staging").mkdir()
    reuse = link_into(tmp_path / "staging", wanted, {sha: source})
    pulled = tmp_path / "staging" / "model.safetensors"
    assert reuse.linked and pulled.read_bytes() == source.read_bytes()
    assert not os.path.samestat(pulled.stat(), source.stat())
    monkeypatch.setattr(os, "getuid", lambda: owner)
    (tmp_path / "staging2").mkdir()
    link_into(tmp_path / "staging2", wanted, {sha: source})
    assert os.path.samestat((tmp_path / "staging2" / "model.safetensors").stat(), source.stat())
