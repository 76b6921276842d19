"""``modelpatch sign`` and ``verify --key``: a signature made from the manifest's digests, and
every way verification fails, each in one line with exit code 1."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from signing_helpers import small_model, variant, write_key

from patcher import api
from patcher.cli import main
from patcher.errors import InputError, VerifyMismatch
from patcher.signing.parse import read_bundle


@pytest.fixture
def keys(tmp_path):
    return write_key(tmp_path, "mine")


@pytest.fixture
def signed(tmp_path, keys) -> Path:
    out = variant(small_model(tmp_path / "base"), tmp_path / "variant")
    api.sign(out, str(keys[0]))
    return out


def run(*args):
    from click.testing import CliRunner

    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result, code: int, *needles: str) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exc_info)
    assert result.exc_info[0] is SystemExit, result.exc_info
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("modelpatch: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_a_signature_lists_every_file_from_the_manifest(signed):
    bundle = read_bundle(signed / "model.sig")
    manifest = json.loads((signed / "modelpatch.provenance.json").read_text())
    listed = {s["name"]: s["digest"]["sha256"] for s in manifest["subject"]}
    assert bundle.method == "key"
    # every subject but .gitattributes (OMS leaves git's files out), plus the manifest itself
    assert set(bundle.resources) == (set(listed) - {".gitattributes"}) | {
        "modelpatch.provenance.json"}
    assert all(bundle.resources[n] == listed[n] for n in listed if n != ".gitattributes")
    ser = bundle.statement["predicate"]["serialization"]
    assert ser["method"] == "files" and ser["hash_type"] == "sha256"
    assert ser["allow_symlinks"] is False
    assert {".modelpatch", "model.sig", ".git", ".gitattributes"} <= set(ser["ignore_paths"])
    assert bundle.model_name == "variant"
    assert (signed / "model.sig").stat().st_mode & 0o777 == 0o444


def test_verify_with_the_key_checks_the_signature_then_the_files(signed, keys):
    result = run("verify", signed, "--key", keys[1])
    assert result.exit_code == 0, result.output
    assert "signature verified" in result.stdout and "signed files match" in result.stdout


def test_verify_without_a_key_never_says_verified(signed):
    result = run("verify", signed)
    assert result.exit_code == 0, result.output
    assert "signed by key fingerprint" in result.stdout
    assert "(not checked: pass --key)" in result.stdout
    assert "verified" not in result.stdout


def test_another_key_is_named_in_one_line(signed, tmp_path):
    _, other = write_key(tmp_path, "other")
    one_error_line(run("verify", signed, "--key", other), 1, "signed by another key")


def test_an_added_file_fails_unless_unsigned_files_are_ignored(signed, keys):
    (signed / "notes.txt").write_text("added\n")
    one_error_line(run("verify", signed, "--key", keys[1]), 1, "notes.txt", "not signed")
    result = run("verify", signed, "--key", keys[1], "--ignore-unsigned-files")
    assert result.exit_code == 0, result.output


def test_a_changed_digest_and_a_missing_file_are_named(signed, keys):
    target = signed / "sub" / "tokenizer.json"
    os.chmod(target, 0o644)
    target.write_text('{"v": 2}\n')
    one_error_line(run("verify", signed, "--key", keys[1]), 1, "sub/tokenizer.json",
                   "sha256 differs")
    target.unlink()
    one_error_line(run("verify", signed, "--key", keys[1]), 1, "sub/tokenizer.json", "missing")


def test_a_tampered_payload_fails_the_signature(signed, keys):
    doc = json.loads((signed / "model.sig").read_bytes())
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "0" * 64
    statement["subject"][0]["digest"]["sha256"] = "0" * 64
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    sig = signed / "model.sig"
    os.chmod(sig, 0o644)
    sig.write_text(json.dumps(doc))
    line = one_error_line(run("verify", signed, "--key", keys[1]), 1, "model.sig")
    assert "root digest" in line or "does not verify" in line


@pytest.mark.parametrize("text, needle", [
    ("not json", "not JSON"),
    ('{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}', "is missing"),
    ("[]", "expected an object"),
])
def test_a_bundle_that_is_not_oms_is_named(signed, keys, text, needle):
    sig = signed / "model.sig"
    os.chmod(sig, 0o644)
    sig.write_text(text)
    one_error_line(run("verify", signed, "--key", keys[1]), 1, "not an OMS v1.0 bundle", needle)
    one_error_line(run("verify", signed), 1, "not an OMS v1.0 bundle")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_private_key_others_can_read_is_refused(tmp_path, keys, mode):
    out = variant(small_model(tmp_path / "b"), tmp_path / "v")
    os.chmod(keys[0], mode)
    one_error_line(run("sign", out, "--key", keys[0]), 2, "accessible by others", "chmod 600")
    assert not (out / "model.sig").exists()


def test_the_key_is_never_shown_nor_written(tmp_path, keys, caplog):
    out = variant(small_model(tmp_path / "b"), tmp_path / "v")
    secret = keys[0].read_bytes()
    body = b"".join(secret.splitlines()[1:-1])
    result = run("--debug", "sign", out, "--key", keys[0])
    assert result.exit_code == 0, result.output
    for text in (result.output.encode(), caplog.text.encode(), (out / "model.sig").read_bytes()):
        assert body not in text and b"PRIVATE KEY" not in text
    from patcher.signing.keys import load_signer
    assert "PRIVATE" not in repr(load_signer(keys[0]))


def test_key_types_outside_the_oms_registry_are_refused(tmp_path):
    out = variant(small_model(tmp_path / "b"), tmp_path / "v")
    key = tmp_path / "ed.pem"
    key.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    os.chmod(key, 0o600)
    one_error_line(run("sign", out, "--key", key), 2, "unsupported key type")


@pytest.mark.parametrize("curve", [ec.SECP384R1(), ec.SECP521R1()])
def test_p384_and_p521_sign_and_verify(tmp_path, curve):
    private, public = write_key(tmp_path, "k", curve)
    out = variant(small_model(tmp_path / "b"), tmp_path / "v")
    api.sign(out, str(private))
    assert api.verify_signature(out, str(public)).checked


def test_an_encrypted_key_takes_its_passphrase_from_the_environment(tmp_path, monkeypatch):
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "enc.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(b"s3cret")))
    os.chmod(path, 0o600)
    out = variant(small_model(tmp_path / "b"), tmp_path / "v")
    monkeypatch.delenv("MODELPATCH_KEY_PASSWORD", raising=False)
    one_error_line(run("sign", out, "--key", path), 2, "encrypted", "MODELPATCH_KEY_PASSWORD")
    monkeypatch.setenv("MODELPATCH_KEY_PASSWORD", "s3cret")
    assert run("sign", out, "--key", path).exit_code == 0


def test_sign_refuses_a_directory_that_differs_from_its_manifest(tmp_path, keys):
    out = variant(small_model(tmp_path / "b"), tmp_path / "v")
    (out / "extra.bin").write_bytes(b"x")
    one_error_line(run("sign", out, "--key", keys[0], "--full"), 1, "not signed", "extra")
    assert not (out / "model.sig").exists()


def test_sign_reads_no_model_byte_once_verified(tmp_path, keys, monkeypatch):
    """After a full verify, signing takes every digest from the manifest: nothing is hashed."""
    out = variant(small_model(tmp_path / "b"), tmp_path / "v")
    old = os.stat(out / "config.json").st_mtime - 60   # older than the cache's racy window
    for path in out.rglob("*"):
        if path.is_file() and ".modelpatch" not in path.parts:
            os.utime(path, (old, old))
    api.verify(out)                                 # records verified digests
    import patcher.integrity.verify as verify_module

    def no_hashing(paths, **kw):
        assert not list(paths), "sign rehashed a file"
        return {}

    monkeypatch.setattr(verify_module, "hash_files_stat", no_hashing)
    api.sign(out, str(keys[0]))
    assert (out / "model.sig").exists()


def test_apply_signs_as_the_last_step_of_the_commit(tmp_path, keys, monkeypatch):
    base = small_model(tmp_path / "b")
    import patcher.signing.sign as sign_module

    def fail(*a, **k):
        raise InputError("signing failed on purpose")

    monkeypatch.setattr(sign_module, "write_new_signature", fail)
    with pytest.raises(InputError):
        api.apply("sampling-defaults", base, out=tmp_path / "v", sign=str(keys[0]))
    assert not (tmp_path / "v").exists()                # never visible unsigned
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".v")]  # nor its staging
    monkeypatch.undo()
    out = api.apply("sampling-defaults", base, out=tmp_path / "v", sign=str(keys[0])).output
    assert api.verify_signature(out, str(keys[1])).checked


def test_require_signed_base_refuses_unsigned_and_other_keys(tmp_path, keys):
    base = small_model(tmp_path / "b")
    with pytest.raises(VerifyMismatch, match="not signed"):
        api.apply("sampling-defaults", base, out=tmp_path / "v", require_signed_base=keys[1])
    _, other = write_key(tmp_path, "other")
    mid = variant(base, tmp_path / "mid")
    api.sign(mid, str(keys[0]))
    with pytest.raises(VerifyMismatch, match="another key"):
        api.apply("sampling-defaults", mid, out=tmp_path / "v", require_signed_base=other,
                  allow_noop=True)
    assert not (tmp_path / "v").exists()


def test_a_signed_base_is_recorded_not_carried_and_revert_restores_it(tmp_path, keys):
    mid = variant(small_model(tmp_path / "b"), tmp_path / "mid")
    api.sign(mid, str(keys[0]))
    base_sig = (mid / "model.sig").read_bytes()
    out = api.apply("sampling-defaults", mid, out=tmp_path / "v", allow_noop=True,
                    require_signed_base=keys[1], sign=str(keys[0])).output
    manifest = json.loads((out / "modelpatch.provenance.json").read_text())
    record = manifest["predicate"]["buildDefinition"]["externalParameters"]["base_signature"]
    import hashlib
    assert record["sha256"] == hashlib.sha256(base_sig).hexdigest()
    assert record["verified"] is True and record["carried"] is False
    assert record["signer"].startswith("key fingerprint ")
    assert "model.sig" not in {s["name"] for s in manifest["subject"]}
    assert (out / "model.sig").read_bytes() != base_sig
    result = run("verify", out, "--key", keys[1], "--base-key", keys[1])
    assert result.exit_code == 0 and "base: signed by key fingerprint" in result.stdout
    _, other = write_key(tmp_path, "other")
    one_error_line(run("verify", out, "--base-key", other), 1, "signed by another key")
    api.revert(out, out=tmp_path / "rebuilt")
    assert (tmp_path / "rebuilt" / "model.sig").read_bytes() == base_sig
    assert api.verify_signature(tmp_path / "rebuilt", str(keys[1])).checked


def test_an_in_place_patch_sets_the_signature_aside_and_revert_puts_it_back(tmp_path, keys):
    mid = variant(small_model(tmp_path / "b"), tmp_path / "mid")
    api.sign(mid, str(keys[0]))
    before = (mid / "model.sig").read_bytes()
    api.apply_in_place("sampling-defaults", mid, params={"temperature": 0.5})
    assert not (mid / "model.sig").exists()            # it no longer matches the files
    assert api.verify(mid).ok
    api.revert(mid)
    assert (mid / "model.sig").read_bytes() == before
    assert api.verify_signature(mid, str(keys[1])).checked


def test_sign_options_are_refused_where_no_variant_directory_is_made(tmp_path, keys):
    base = small_model(tmp_path / "b")
    result = run("apply", "sampling-defaults", base, "--in-place", "--sign", keys[0])
    assert result.exit_code == 2 and "--sign" in result.output
    shutil.rmtree(base)


def test_stacked_recipes_as_doctor_fix_writes_them_are_committed_signed(tmp_path, keys):
    base = small_model(tmp_path / "b")
    out = api.apply_stacked(["sampling-defaults"], base, out=tmp_path / "fixed",
                            sign=str(keys[0]),
                            params={"sampling-defaults": {"temperature": 0.2}})
    report = api.verify_signature(out, str(keys[1]))
    assert report.checked and report.files.ok
    assert read_bundle(out / "model.sig").model_name == "fixed"     # not the scratch name


def test_doctor_sign_goes_with_fix(tmp_path, keys):
    base = small_model(tmp_path / "b")
    result = run("doctor", base, "--sign", keys[0])
    assert result.exit_code == 2 and "--sign goes with --fix" in result.output
