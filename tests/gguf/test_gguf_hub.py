"""A GGUF variant through the embedded hub: publish, pull, verify, and the model card."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import pytest
from click.testing import CliRunner
from gguf_fixtures import needs_gguf, read_back, tiny_dir
from hub_fixtures import hub  # noqa: F401

from patcher import api
from patcher.cli import main

pytestmark = needs_gguf


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def test_publish_pull_verify_a_gguf_variant(hub, tmp_path, monkeypatch):
    root = tiny_dir(tmp_path)
    variant = api.apply("gguf-context", root, out=tmp_path / "tiny-ctx").output
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    result = CliRunner().invoke(main, ["publish", str(variant), "alice/tiny-ctx-GGUF",
                                       "--endpoint", hub.endpoint])
    assert result.exit_code == 0, result.output
    pulled = tmp_path / "pulled"
    result = CliRunner().invoke(main, ["pull", "alice/tiny-ctx-GGUF", "-o", str(pulled),
                                       "--endpoint", hub.endpoint])
    assert result.exit_code == 0, result.output
    assert api.verify(pulled).ok
    assert (pulled / "tiny.gguf").read_bytes() == (variant / "tiny.gguf").read_bytes()
    assert read_back(pulled / "tiny.gguf")[0]["llama.context_length"] == 8192
    card = (pulled / ".modelpatch" / "hub" / "README.md").read_text()
    assert "gguf-context" in card
    assert "- GGUF metadata `llama.context_length`: set to `8192`" in card
    assert "- GGUF metadata `llama.rope.scaling.type`: set to `\"yarn\"`" in card
