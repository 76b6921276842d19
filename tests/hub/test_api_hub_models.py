"""The library reads a MODEL as the commands do (``patcher.model_ref``): ``api.apply`` and
``api.apply_into_cache`` of ``hf://ORG/NAME`` download it and apply there, as ``apply hf://``
does, and ``api.apply_in_place`` patches its snapshot as ``apply --in-place hf://`` does. None
takes ``hf://`` for a local path."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import json

import pytest
from hub_fixtures import hub, own_digest_cache  # noqa: F401

from patcher import api


@pytest.fixture
def hub_kimi(hub, kimi_dir, tmp_path, monkeypatch):
    from remote_fixtures import store_model

    store_model(hub.root, "alice/kimi", kimi_dir)
    monkeypatch.setenv("HF_TOKEN", "read-alice")
    monkeypatch.chdir(tmp_path)
    return hub


def test_api_apply_of_a_hub_model_downloads_it_and_writes_here(hub_kimi, tmp_path):
    result = api.apply("sm120-fp16-kv", "hf://alice/kimi", endpoint=hub_kimi.endpoint)
    assert result.output == tmp_path / "kimi-sm120-fp16-kv"
    assert api.verify(result.output).ok
    statement = json.loads((result.output / "modelpatch.provenance.json").read_text())
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["base_model"] == \
        "alice/kimi"
    assert not (tmp_path / "hf:").exists()


def test_api_apply_into_cache_of_a_hub_model(hub_kimi):
    result = api.apply_into_cache("sm120-fp16-kv", "hf://alice/kimi", "fixed",
                                  endpoint=hub_kimi.endpoint)
    assert result.output.parent.name == "snapshots"
    assert (result.output.parent.parent / "refs" / "fixed").is_file()


def test_api_apply_in_place_of_a_hub_model_patches_its_snapshot_as_the_command_does(
        hub_kimi, kimi_dir, tmp_path):
    """``apply --in-place hf://`` patches the downloaded snapshot (revertibly); so does the
    library, never a ``./hf:/`` directory."""
    result = api.apply_in_place("sm120-fp16-kv", "hf://alice/kimi", endpoint=hub_kimi.endpoint)
    snapshot = result.output
    assert snapshot.parent.name == "snapshots" and "models--alice--kimi" in str(snapshot)
    assert api.verify(snapshot).ok
    changed = [f for f in kimi_dir.iterdir() if f.is_file()
               and (snapshot / f.name).read_bytes() != f.read_bytes()]
    assert changed
    api.revert(snapshot)
    assert not (snapshot / "modelpatch.provenance.json").exists()
    assert all((snapshot / f.name).read_bytes() == f.read_bytes() for f in changed)
    assert not (tmp_path / "hf:").exists()
