"""``apply --into-cache NAME``: a variant kept as a revision of the Hugging Face cache repository
its base was downloaded into. The base snapshot is made by huggingface_hub itself (a download
from the embedded hub), and the revision is checked with huggingface_hub's own cache scanner,
offline loaders and revision deletion, and with transformers' ``from_pretrained``."""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_fixtures import hub  # noqa: F401

from patcher.cli import main

REPO = "alice/tiny"
RECIPE = """\
modelpatch: 1
name: head-fp16
description: the output head in float16, and a sampling default
config:
  generation_config.json:
    - {set: /temperature, value: 0.6}
tensors:
  - {select: {glob: lm_head.weight}, cast: float16}
"""


def _cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def cached(hub, tiny_bf16_dir, tmp_path, monkeypatch):  # noqa: F811
    """(the base snapshot huggingface_hub downloaded, the cache directory, the recipe)."""
    from huggingface_hub import constants, snapshot_download

    hub.api("write-alice").create_repo(REPO)
    hub.api("write-alice").upload_folder(repo_id=REPO, folder_path=str(tiny_bf16_dir))
    cache = tmp_path / "cache"
    snapshot = Path(snapshot_download(REPO, endpoint=hub.endpoint, token=False,
                                      cache_dir=cache))
    recipe = tmp_path / "head-fp16.yaml"
    recipe.write_text(RECIPE)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")       # as a user serving from the cache would
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return snapshot, cache, recipe


def _blobs(cache: Path) -> set[str]:
    return {p.name for p in (cache / "models--alice--tiny" / "blobs").iterdir()}


def test_a_variant_in_the_cache_is_a_revision_huggingface_hub_and_transformers_load(cached):
    import torch
    from huggingface_hub import scan_cache_dir, snapshot_download
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    base, cache, recipe = cached
    blobs_before = _blobs(cache)
    result = _cli("apply", recipe, base, "--into-cache", "head-fp16")
    assert result.exit_code == 0, result.output
    variant = Path(result.output.strip().splitlines()[-1])
    repo = cache / "models--alice--tiny"
    assert variant.parent == repo / "snapshots" and (repo / "refs" / "head-fp16").read_text() \
        == variant.name
    assert [p.name for p in repo.iterdir() if p.name.startswith(".modelpatch-")] == []

    # huggingface_hub's scanner sees two revisions, one per ref, and no warning
    report = scan_cache_dir(cache)
    assert report.warnings == []
    (scanned,) = report.repos
    refs = {r.commit_hash: set(r.refs) for r in scanned.revisions}
    assert refs == {base.name: {"main"}, variant.name: {"head-fp16"}}

    # unchanged files share the base's blobs; changed ones are new blobs named as the cache does
    shards = sorted(p.name for p in base.glob("*.safetensors"))
    head_shard = next(s for s in shards if "lm_head.weight" in safe_open(
        base / s, "pt").keys())
    for name in shards:
        same = os.path.realpath(variant / name) == os.path.realpath(base / name)
        assert same == (name != head_shard), name
    new_blobs = _blobs(cache) - blobs_before
    assert os.path.basename(os.path.realpath(variant / head_shard)) in new_blobs
    assert all(len(b) in (40, 64) for b in new_blobs)

    # offline loaders resolve the revision by name
    assert Path(snapshot_download(REPO, revision="head-fp16", cache_dir=cache,
                                  local_files_only=True)) == variant
    assert GenerationConfig.from_pretrained(REPO, revision="head-fp16",
                                            cache_dir=cache).temperature == 0.6
    assert AutoConfig.from_pretrained(REPO, revision="head-fp16", cache_dir=cache)
    patched = AutoModelForCausalLM.from_pretrained(REPO, revision="head-fp16", cache_dir=cache,
                                                   dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(REPO, cache_dir=cache, dtype=torch.float32)
    expected = original.lm_head.weight.detach().to(torch.float16).to(torch.float32)
    assert torch.equal(patched.lm_head.weight.detach(), expected)

    # verify and revert work on the cache revision
    assert _cli("verify", variant).exit_code == 0
    out = base.parents[3] / "reverted"
    assert _cli("revert", variant, "-o", out).exit_code == 0
    for path in base.rglob("*"):
        if path.is_file():
            assert filecmp.cmp(path, out / path.relative_to(base), shallow=False), path

    # deleting the revision through huggingface_hub leaves the base whole
    before = {p.relative_to(base): p.read_bytes() for p in base.rglob("*") if p.is_file()}
    report.delete_revisions(variant.name).execute()
    assert not variant.exists()
    assert {p.relative_to(base): p.read_bytes() for p in base.rglob("*") if p.is_file()} \
        == before
    assert scan_cache_dir(cache).warnings == []


def test_into_cache_refuses_what_it_cannot_do_and_leaves_nothing(cached, tmp_path):
    base, cache, recipe = cached
    repo = cache / "models--alice--tiny"

    def state():
        return sorted(str(p.relative_to(repo)) for p in repo.rglob("*"))

    before = state()
    plain = tmp_path / "plain"
    shutil.copytree(base, plain)
    cases = [
        (("apply", recipe, plain, "--into-cache", "x"), 2, "Hugging Face cache snapshot"),
        (("apply", recipe, base, "--into-cache", "../../escape"), 2, "--into-cache name"),
        (("apply", recipe, base, "--into-cache", "main"), 2, "already has a revision 'main'"),
        (("apply", recipe, base, "--into-cache", "x", "-o", tmp_path / "o"), 2, "excludes"),
        # a recipe that refuses the model: nothing is written into the cache
        (("apply", "nvfp4-to-bf16", base, "--into-cache", "x"), 1, ""),
    ]
    for args, code, text in cases:
        result = _cli(*args)
        assert result.exit_code == code, (args, result.output)
        assert text in result.output
        assert state() == before, args


def test_force_points_an_existing_name_at_the_new_variant(cached):
    base, cache, recipe = cached
    first = _cli("apply", recipe, base, "--into-cache", "v")
    assert first.exit_code == 0
    again = _cli("apply", recipe, base, "--into-cache", "v")
    assert again.exit_code == 2 and "--force" in again.output
    forced = _cli("apply", recipe, base, "--into-cache", "v", "--force")
    assert forced.exit_code == 0, forced.output
    ref = cache / "models--alice--tiny" / "refs" / "v"
    assert ref.read_text() == Path(forced.output.strip().splitlines()[-1]).name
