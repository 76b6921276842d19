"""Both ways with the reference implementation, the ``model_signing`` package (1.1.x): its
``verify key`` and ``verify certificate`` accept what ``modelpatch sign`` writes, and
``modelpatch verify`` accepts what its ``sign key`` and ``sign certificate`` write, for a plain
directory and for a Hugging Face cache snapshot (symbolic links to blobs, ``--allow_symlinks``).

Producer x verifier x method, as tested here:

| producer      | verifier      | key | certificate | HF snapshot (symlinks) |
|---------------|---------------|-----|-------------|------------------------|
| modelpatch    | model_signing | yes | yes         | -                      |
| model_signing | modelpatch    | yes | yes         | yes (key)              |
| modelpatch    | modelpatch    | yes | yes         | -                      |
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from signing_helpers import model_signing, small_model, variant, write_key, write_pki

from patcher import api
from patcher.errors import VerifyMismatch
from patcher.signing.keys import load_signer
from patcher.signing.verify import Trust

pytest.importorskip("model_signing")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return write_key(tmp_path_factory.mktemp("keys"), "interop")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return write_pki(tmp_path_factory.mktemp("pki"))


def _ok(result):
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result


def test_model_signing_verifies_a_key_signature_by_modelpatch(tmp_path, keys):
    out = variant(small_model(tmp_path / "base"), tmp_path / "variant")
    api.sign(out, str(keys[0]))
    _ok(model_signing("verify", "key", out, "--signature", out / "model.sig",
                      "--public_key", keys[1]))
    target = out / "weights.bin"
    os.chmod(target, 0o644)
    target.write_bytes(b"changed")                  # and it refuses a changed file
    assert model_signing("verify", "key", out, "--signature", out / "model.sig",
                         "--public_key", keys[1]).returncode != 0


def test_model_signing_verifies_a_certificate_signature_by_modelpatch(tmp_path, pki):
    out = variant(small_model(tmp_path / "base"), tmp_path / "variant")
    api.sign(out, load_signer(pki["key"], cert=pki["leaf"], chain=pki["chain"]))
    _ok(model_signing("verify", "certificate", out, "--signature", out / "model.sig",
                      "--certificate_chain", pki["root"]))
    report = api.verify_signature(out, Trust.load(cert_chain=pki["root"]))
    assert report.signer.startswith("certificate CN=pki platform team")


@pytest.mark.parametrize("method", ["key", "certificate"])
def test_bundles_are_the_json_sigstore_models_writes_byte_for_byte(tmp_path, keys, pki, method):
    # modelpatch writes the bundle without sigstore_models (its import outweighs signing): the
    # models model_signing writes with must read it and write back the very same bytes.
    from sigstore_models.bundle.v1 import Bundle

    out = variant(small_model(tmp_path / "base"), tmp_path / "variant")
    signer = (load_signer(keys[0]) if method == "key" else
              load_signer(pki["key"], cert=pki["leaf"], chain=pki["chain"]))
    api.sign(out, signer)
    data = (out / "model.sig").read_text("utf-8")
    assert Bundle.from_json(data).to_json() == data


def test_modelpatch_verifies_a_key_signature_by_model_signing(tmp_path, keys):
    model = small_model(tmp_path / "plain")
    _ok(model_signing("sign", "key", model, "--signature", model / "model.sig",
                      "--private_key", keys[0]))
    report = api.verify_signature(model, str(keys[1]))
    assert report.checked and report.files.ok
    (model / "sub" / "new.txt").write_text("unsigned\n")
    with pytest.raises(VerifyMismatch, match="sub/new.txt"):
        api.verify_signature(model, str(keys[1]))
    assert api.verify_signature(model, str(keys[1]), ignore_unsigned=True).files.ok


def test_modelpatch_verifies_a_certificate_signature_by_model_signing(tmp_path, pki):
    model = small_model(tmp_path / "plain")
    _ok(model_signing("sign", "certificate", model, "--signature", model / "model.sig",
                      "--private_key", pki["key"], "--signing_certificate", pki["leaf"],
                      "--certificate_chain", pki["chain"]))
    assert api.verify_signature(model, Trust.load(cert_chain=pki["root"])).files.ok
    from patcher.signing.verify import claimed
    line = claimed(model).line()
    assert "certificate CN=pki platform team" in line and "pass --cert-chain" in line
    assert "verified" not in line
    with pytest.raises(VerifyMismatch, match="does not chain"):
        api.verify_signature(model, Trust.load(cert_chain=write_pki(tmp_path, "x")["root"]))


def _hf_snapshot(root: Path) -> Path:
    """``models--org--name`` with files in ``blobs/`` and a snapshot of relative symlinks."""
    repo = root / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / ("a" * 40)
    blobs.mkdir(parents=True)
    (snap / "sub").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    for rel, data in {"config.json": b'{"model_type": "llama"}\n',
                      "model.safetensors": os.urandom(8192),
                      "sub/tokenizer.json": b'{"v": 1}\n'}.items():
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        depth = "../" * (rel.count("/") + 2)
        os.symlink(f"{depth}blobs/{digest}", snap / rel)
    return snap


def test_modelpatch_verifies_a_signed_hf_cache_snapshot(tmp_path, keys):
    snap = _hf_snapshot(tmp_path)
    sig = tmp_path / "snapshot.sig"
    _ok(model_signing("sign", "key", snap, "--signature", sig, "--private_key", keys[0],
                      "--allow_symlinks"))
    os.symlink(sig, snap / "model.sig")         # where modelpatch looks for it
    report = api.verify_signature(snap, str(keys[1]))
    assert report.files.ok and report.files.checked == 3


def test_symlinks_fail_unless_the_signature_allows_them(tmp_path, keys):
    model = small_model(tmp_path / "plain")
    _ok(model_signing("sign", "key", model, "--signature", model / "model.sig",
                      "--private_key", keys[0]))
    os.symlink("config.json", model / "alias.json")
    with pytest.raises(VerifyMismatch, match="alias.json: a symbolic link"):
        api.verify_signature(model, str(keys[1]))
