"""``base_model`` of a variant: read from what the base says it is (a Hugging
Face cache path, the base's manifest), or given with ``--base-model``; never the directory's
name. A ``huggingface_hub --local-dir`` download records its commit but not its repository."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_fixtures import hub  # noqa: F401

from patcher import api
from patcher.cli import main
from patcher.integrity.manifest import read_manifest
from patcher.model.base_identity import LOCAL_DIR_METADATA, identify

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.fixture
def kimi(kimi_dir, tmp_path) -> Path:
    dst = tmp_path / "kimi"
    shutil.copytree(kimi_dir, dst)
    return dst


def recorded(variant: Path):
    return read_manifest(variant).predicate["buildDefinition"]["externalParameters"] \
        .get("base_model")


def local_dir_download(model: Path) -> Path:
    """``model`` as ``hf download --local-dir`` leaves it: one metadata file per file."""
    meta = model / LOCAL_DIR_METADATA
    meta.mkdir(parents=True)
    for path in model.iterdir():
        if path.is_file():
            (meta / f"{path.name}.metadata").write_text(f"{COMMIT}\n\"etag\"\n1712656091.1\n")
    return model


def test_a_plain_directory_is_not_named_after_itself(kimi, tmp_path):
    assert identify(kimi).repo_id is None
    variant = api.apply("sm120-fp16-kv", kimi, out=tmp_path / "v").output
    assert recorded(variant) is None


def test_a_local_dir_download_is_recognised_but_not_identified(kimi):
    identity = identify(local_dir_download(kimi))
    assert identity.repo_id is None
    assert "--local-dir download of commit 0123456789ab" in identity.source
    assert "--base-model ORG/NAME" in identity.hint("kimi")


def test_a_cache_snapshot_names_its_repository_and_the_manifest_records_it(kimi_dir, tmp_path):
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(kimi_dir, tmp_path / "hf", "nvidia/Kimi-K2.5-NVFP4")
    variant = api.apply("sm120-fp16-kv", snap, out=tmp_path / "v").output
    assert recorded(variant) == "nvidia/Kimi-K2.5-NVFP4"


def test_base_model_option_is_recorded_and_inherited_by_a_variant_of_the_variant(kimi,
                                                                                tmp_path):
    result = CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(kimi), "-o",
                                       str(tmp_path / "v"), "--base-model", "acme/kimi-base"])
    assert result.exit_code == 0, result.output
    assert recorded(tmp_path / "v") == "acme/kimi-base"
    again = api.apply("drop-kv-scales", tmp_path / "v", out=tmp_path / "v2").output
    assert recorded(again) == "acme/kimi-base"            # from the base's manifest


@pytest.mark.parametrize("bad", ["kimi", "a/b/c", "../x", "org/na me", "org/--x"])
def test_a_malformed_base_model_is_one_line_exit_2(kimi, tmp_path, bad):
    result = CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(kimi), "-o",
                                       str(tmp_path / "v"), "--base-model", bad])
    assert result.exit_code == 2 and "Traceback" not in result.output + result.stderr
    assert "not a hub repository id ORG/NAME" in result.stderr
    assert not (tmp_path / "v").exists()


def card_of(hub, repo: str, tmp_path: Path) -> str:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo, "README.md", endpoint=hub.endpoint, token="write-alice",
                                cache_dir=tmp_path / "dl")).read_text()


def test_publish_names_the_base_it_knows_and_says_how_to_set_one_it_does_not(
        hub, kimi, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    local_dir_download(kimi)
    variant = api.apply("sm120-fp16-kv", kimi, out=tmp_path / "v").output
    with caplog.at_level(logging.WARNING, logger="modelpatch"):
        api.publish(variant, "alice/unknown", endpoint=hub.endpoint)
    card = card_of(hub, "alice/unknown", tmp_path)
    assert "base_model" not in card and "hub repository not recorded" in card
    hint = " ".join(r.getMessage() for r in caplog.records)
    assert "commit 0123456789ab" in hint and "--base-model ORG/NAME" in hint

    result = CliRunner().invoke(main, ["publish", str(variant), "alice/given", "--endpoint",
                                       hub.endpoint, "--base-model", "moonshotai/Kimi-K2.5"])
    assert result.exit_code == 0, result.output
    assert "base_model: moonshotai/Kimi-K2.5" in card_of(hub, "alice/given", tmp_path)

    recorded_variant = api.apply("sm120-fp16-kv", kimi, out=tmp_path / "r",
                                 base_model="nvidia/Kimi-K2.5-NVFP4").output
    api.publish(recorded_variant, "alice/recorded", endpoint=hub.endpoint)
    assert "base_model: nvidia/Kimi-K2.5-NVFP4" in card_of(hub, "alice/recorded", tmp_path)
