"""The library reads a MODEL as the commands do (``patcher.model_ref``): ``api.apply`` and
``api.apply_into_cache`` of ``hf://ORG/NAME`` download it and apply there, as ``apply hf://``
does; ``api.apply_in_place`` refuses it in one line. None takes ``hf://`` for a local path."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import json

import pytest
from hub_fixtures import hub, own_digest_cache  # noqa: F401

from patcher import api
from patcher.errors import InputError


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


def test_api_apply_in_place_refuses_a_hub_model(hub_kimi, tmp_path):
    with pytest.raises(InputError) as info:
        api.apply_in_place("sm120-fp16-kv", "hf://alice/kimi", endpoint=hub_kimi.endpoint)
    assert "hf://alice/kimi is a hub repository" in str(info.value)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "hf:").exists()
