"""publish and pull through Xet against the embedded hub, with the real huggingface_hub and
hf_xet clients: a variant whose shards were rewritten sends only the chunks the hub lacks, pull
rebuilds it from the local base's chunks, and a hub that refuses Xet is spoken to over LFS."""
# ruff: noqa: F811

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from hub_fixtures import TOKENS, configure_hf_client, running_hub  # noqa: F401

from patcher import api


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.fixture
def xet_hub(tmp_path, monkeypatch):
    """The embedded hub, with huggingface_hub free to use Xet (a fresh Xet cache: nothing is
    deduplicated against an earlier test's uploads on this machine)."""
    from huggingface_hub import constants

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet-cache"))
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    with running_hub(tmp_path / "hub", TOKENS) as running:
        yield running


def _refuse_xet(monkeypatch) -> None:
    """The hub's Xet token routes answer as an older hub's do (400: no Xet)."""
    from patcher.hub.server import app as server_app

    async def no_xet(hub, request, p):
        from patcher.hub.request_errors import BadRequest

        raise BadRequest("this hub does not speak Xet")

    routes = [(methods, rx, no_xet if "xet-" in rx.pattern else handler)
              for methods, rx, handler in server_app._COMPILED]
    monkeypatch.setattr(server_app, "_COMPILED", routes)


def _variant(kimi_dir: Path, tmp_path: Path) -> Path:
    base = tmp_path / "kimi"
    shutil.copytree(kimi_dir, base)
    return api.apply("sm120-fp16-kv", base, out=tmp_path / "kimi-fixed").output


def test_a_hub_without_xet_gets_lfs(tmp_path, monkeypatch, kimi_dir, caplog):
    _refuse_xet(monkeypatch)
    from huggingface_hub import constants

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    variant = _variant(kimi_dir, tmp_path)
    with running_hub(tmp_path / "hub", TOKENS) as hub, \
            caplog.at_level(logging.INFO, logger="modelpatch"):
        result = api.publish(variant, "alice/old-hub", endpoint=hub.endpoint)
        pulled = api.pull("alice/old-hub", tmp_path / "pulled", endpoint=hub.endpoint)
    assert result.plan.transport == "lfs" and not result.plan.xet.files
    assert any("uploaded over Git LFS" in r.getMessage() for r in caplog.records)
    assert api.verify(pulled.output).ok
    assert constants.HF_HUB_DISABLE_XET is False          # only for the upload
