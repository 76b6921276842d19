"""The OMS v1.0 test vectors (tests/fixtures/oms: copied from the spec's repository) behave as
the spec says: ``valid/`` bundles are read, ``invalid/`` ones refused at the bundle level and
``invalid-payload/`` at the statement level, each in one line naming what is wrong. The bundles
modelpatch writes pass the spec's JSON Schemas, checked with ``jsonschema``, and so does every
valid vector: the hand-written reader and the schemas agree."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from signing_helpers import small_model, variant, write_key, write_pki

from patcher import api
from patcher.errors import VerifyMismatch
from patcher.signing.keys import load_signer
from patcher.signing.parse import parse_bundle, read_bundle

OMS = Path(__file__).resolve().parents[1] / "fixtures" / "oms"
VECTORS = OMS / "vectors"


def _schemas():
    jsonschema = pytest.importorskip("jsonschema")
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    docs = [json.loads(p.read_text()) for p in sorted((OMS / "schemas").glob("*.json"))]
    registry = Registry().with_resources(
        (d["$id"], Resource.from_contents(d, default_specification=DRAFT202012)) for d in docs)
    by_title = {d["$id"].split("/")[-3]: d for d in docs}
    return (jsonschema.Draft202012Validator(by_title["bundle"], registry=registry),
            jsonschema.Draft202012Validator(by_title["statement"], registry=registry))


def _schema_valid(path: Path) -> bool:
    bundle_v, statement_v = _schemas()
    try:
        doc = json.loads(path.read_bytes())
        bundle_v.validate(doc)
        statement_v.validate(json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"])))
    except Exception:
        return False
    return True


@pytest.mark.parametrize("name, method", [("key", "key"), ("certificate", "certificate"),
                                          ("sigstore", "sigstore")])
def test_valid_vectors_are_read(name, method):
    path = VECTORS / "valid" / f"{name}.bundle.json"
    assert _schema_valid(path)
    bundle = read_bundle(path)
    assert bundle.method == method
    assert set(bundle.resources) == {"signme-1", "signme-2"}
    assert "ignore-me" in bundle.ignore_paths


def test_the_key_vector_names_its_key_and_refuses_any_other(tmp_path):
    bundle = read_bundle(VECTORS / "valid" / "key.bundle.json")
    assert bundle.claimed_signer() == ("key fingerprint e8450dec4eb99dae995da9af1bc2cc9f76ed669e"
                                       "e2e744f57abba763df3e3f8e")
    from patcher.signing.check import check_key
    from patcher.signing.keys import load_public_key

    with pytest.raises(VerifyMismatch, match="signed by another key"):
        check_key(bundle, load_public_key(write_key(tmp_path)[1]))


@pytest.mark.parametrize("folder, name, needle", [
    ("invalid", "empty", "not JSON"),
    ("invalid", "missing-envelope", "'dsseEnvelope' is missing"),
    ("invalid", "missing-verification-material", "'verificationMaterial' is missing"),
    ("invalid", "missing-tlog-entries", "transparency log"),
    ("invalid-payload", "wrong-predicate", "predicateType"),
])
def test_invalid_vectors_are_refused_in_one_line(folder, name, needle):
    path = VECTORS / folder / f"{name}.bundle.json"
    assert not _schema_valid(path)
    with pytest.raises(VerifyMismatch) as info:
        read_bundle(path)
    line = info.value.one_line()
    assert "\n" not in line and "not an OMS v1.0 bundle" in line and needle in line, line


def test_bundles_modelpatch_writes_pass_the_oms_schemas(tmp_path):
    out = variant(small_model(tmp_path / "base"), tmp_path / "variant")
    key, _ = write_key(tmp_path)
    api.sign(out, str(key))
    assert _schema_valid(out / "model.sig")
    pki = write_pki(tmp_path)
    api.sign(out, load_signer(pki["key"], cert=pki["leaf"], chain=pki["chain"]))
    assert _schema_valid(out / "model.sig")


@pytest.mark.parametrize("mutate, needle", [
    (lambda s: s["predicate"]["serialization"].update(method="shards", shard_size=1),
     "'shards' is not supported"),
    (lambda s: s["predicate"]["serialization"].update(hash_type="blake3"), "sha256 only"),
    (lambda s: s["predicate"]["resources"][0].update(name="../escape"), "'..' component"),
    (lambda s: s["predicate"].update(resources=[]), "at least one file"),
    (lambda s: s["subject"][0]["digest"].update(sha256="0" * 64), "root digest"),
    (lambda s: s.update(extra=1), "unexpected key"),
])
def test_statements_a_verifier_must_refuse(mutate, needle):
    doc = json.loads((VECTORS / "valid" / "key.bundle.json").read_bytes())
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    mutate(statement)
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(VerifyMismatch, match=needle):
        parse_bundle(json.dumps(doc).encode(), "model.sig")
