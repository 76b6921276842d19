# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)
"""A signed variant through the hub: ``publish`` uploads ``model.sig`` and names the signers in
the model card, ``pull --key`` verifies the download against it before it reports success."""

from __future__ import annotations

import pytest
from hub_fixtures import hub  # noqa: F401
from signing_helpers import small_model, variant, write_key

from patcher import api
from patcher.errors import VerifyMismatch


def test_publish_uploads_the_signature_and_pull_checks_it(hub, tmp_path, monkeypatch):
    private, public = write_key(tmp_path, "team")
    _, other = write_key(tmp_path, "other")
    mid = variant(small_model(tmp_path / "base"), tmp_path / "mid")
    api.sign(mid, str(private))
    out = api.apply("sampling-defaults", mid, out=tmp_path / "signed", allow_noop=True,
                    require_signed_base=public, sign=str(private)).output
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(out, "alice/signed", endpoint=hub.endpoint, progress=False)

    pulled = api.pull("alice/signed", tmp_path / "pulled", endpoint=hub.endpoint,
                      progress=False, trust=api.trust_of(public)).output
    assert (pulled / "model.sig").read_bytes() == (out / "model.sig").read_bytes()
    card = (pulled / ".modelpatch" / "hub" / "README.md").read_text()
    assert "Signed (OpenSSF Model Signing" in card and "key fingerprint" in card
    assert "The base was signed by" in card and "verified when this variant was made" in card

    with pytest.raises(VerifyMismatch, match="signed by another key"):
        api.pull("alice/signed", tmp_path / "refused", endpoint=hub.endpoint, progress=False,
                 trust=api.trust_of(other))
    assert not (tmp_path / "refused").exists()


def test_publish_refuses_a_signature_over_other_files(hub, tmp_path, monkeypatch):
    private, _ = write_key(tmp_path, "team")
    out = variant(small_model(tmp_path / "base"), tmp_path / "v")
    api.sign(out, str(private))
    stale = (out / "model.sig").read_bytes()
    api.apply_in_place("sampling-defaults", out, params={"temperature": 0.3})
    (out / "model.sig").write_bytes(stale)          # the signature of the files before
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    with pytest.raises(VerifyMismatch, match="does not sign these files"):
        api.publish(out, "alice/stale", endpoint=hub.endpoint, progress=False)


def test_a_base_published_with_its_signature_pulls_verified(hub, tmp_path, monkeypatch):
    from signing_helpers import model_signing

    private, public = write_key(tmp_path, "vendor")
    base = small_model(tmp_path / "base")
    (base / ".gitattributes").unlink()            # the hub adds its own; pull sets it aside
    assert model_signing("sign", "key", base, "--signature", base / "model.sig",
                         "--private_key", private).returncode == 0
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(base, "alice/base", endpoint=hub.endpoint, progress=False, base=True)
    pulled = api.pull("alice/base", tmp_path / "pulled", endpoint=hub.endpoint,
                      progress=False, trust=api.trust_of(public)).output
    assert (pulled / "model.sig").read_bytes() == (base / "model.sig").read_bytes()


def test_pull_with_a_key_refuses_an_unsigned_repository(hub, tmp_path, monkeypatch):
    _, public = write_key(tmp_path, "team")
    out = variant(small_model(tmp_path / "base"), tmp_path / "v")
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(out, "alice/unsigned", endpoint=hub.endpoint, progress=False)
    with pytest.raises(VerifyMismatch, match="no model.sig"):
        api.pull("alice/unsigned", tmp_path / "p", endpoint=hub.endpoint, progress=False,
                 trust=api.trust_of(public))
    assert not (tmp_path / "p").exists()
