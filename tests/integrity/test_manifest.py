"""patcher.integrity.manifest: build, write and strictly read the provenance manifest."""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import os
import stat
import subprocess
import sys

import pytest

from patcher.errors import InputError
from patcher.integrity.manifest import (
    BUILD_TYPE,
    MANIFEST_NAME,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Manifest,
    build_statement,
    canonical_json,
    read_manifest,
    write_manifest,
)

T0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T1 = dt.datetime(2025, 3, 1, 12, 0, 7, 250000, tzinfo=dt.timezone.utc)
RECIPE_TEXT = "name: sm120-fp16-kv\nsteps: []\n"
RECIPE = {"name": "sm120-fp16-kv", "sha256": hashlib.sha256(RECIPE_TEXT.encode()).hexdigest(),
          "text": RECIPE_TEXT}
CHANGES = [
    {"op": "json_remove", "file": "config.json",
     "path": "/quantization_config/kv_cache_scheme", "old": {"num_bits": 8, "type": "float"}},
    {"op": "tensor_convert", "tensor": "model.layers.0.mlp.weight",
     "before": {"dtype": "F8_E4M3", "shape": [256, 128]},
     "after": {"dtype": "BF16", "shape": [256, 128]}},
]


def h(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def _statement(**kw):
    args = dict(
        subjects={"config.json": (h("c"), 10), "model-00002.safetensors": (h("m2"), 200),
                  "sub/tokenizer.json": (h("t"), 30), "model-00001.safetensors": (h("m1"), 100),
                  MANIFEST_NAME: (h("x"), 1), ".modelpatch/journal.json": (h("j"), 5)},
        base_files={"config.json": (h("c0"), 11), "model-00001.safetensors": (h("m1"), 100)},
        recipe=RECIPE, options={"jobs": 2, "in_place": False}, changes=CHANGES,
        started=T0, finished=T1)
    args.update(kw)
    return build_statement(**args)


def test_build_statement_shape():
    st = _statement(invocation_id="inv-1")
    assert st["_type"] == STATEMENT_TYPE and st["predicateType"] == PREDICATE_TYPE
    names = [s["name"] for s in st["subject"]]
    assert names == ["config.json", "model-00001.safetensors", "model-00002.safetensors",
                     "sub/tokenizer.json"]  # sorted, manifest and .modelpatch/ left out
    assert st["subject"][0] == {"name": "config.json", "digest": {"sha256": h("c")},
                                "annotations": {"size": 10}}
    build = st["predicate"]["buildDefinition"]
    assert build["buildType"] == BUILD_TYPE
    assert build["externalParameters"]["recipe"] == RECIPE
    assert build["externalParameters"]["options"] == {"jobs": 2, "in_place": False}
    assert "base_provenance" not in build["externalParameters"]
    assert [d["name"] for d in build["resolvedDependencies"]] == ["config.json",
                                                                  "model-00001.safetensors"]
    run = st["predicate"]["runDetails"]
    assert run["metadata"] == {"invocationId": "inv-1", "startedOn": "2025-03-01T12:00:00Z",
                               "finishedOn": "2025-03-01T12:00:07.250000Z"}
    versions = run["builder"]["version"]
    for key in ("modelpatch", "python", "safetensors", "huggingface_hub", "jsonpatch",
                "ruamel.yaml"):
        assert isinstance(versions[key], str) and versions[key]
    assert all(isinstance(v, str) for v in versions.values())
    (byproduct,) = run["byproducts"]
    assert byproduct["annotations"]["changes"] == CHANGES
    assert byproduct["digest"]["sha256"] == hashlib.sha256(canonical_json(CHANGES)).hexdigest()


def test_versions_never_import_torch():
    code = ("import sys, datetime as d\n"
            "from patcher.integrity.manifest import build_statement, tool_versions\n"
            "from patcher.integrity import verify\n"
            "from patcher.integrity.digests import digest_cache, hashing\n"
            "v = tool_versions()\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "print(v.get('torch', '-'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_round_trip(tmp_path):
    st = _statement()
    sha, size = write_manifest(tmp_path, st)
    path = tmp_path / MANIFEST_NAME
    data = path.read_bytes()
    assert sha == hashlib.sha256(data).hexdigest() and size == len(data)
    assert data.endswith(b"}\n") and data.startswith(b'{\n  "_type"')
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert canonical_json(json.loads(data)) == data
    assert not [p for p in os.listdir(tmp_path) if p != MANIFEST_NAME]  # no temp file left

    m = read_manifest(tmp_path)
    assert isinstance(m, Manifest)
    assert m.statement == st and (m.sha256, m.size) == (sha, size)
    assert m.subjects["sub/tokenizer.json"] == (h("t"), 30)
    assert m.subjects["sub/tokenizer.json"].size == 30
    assert set(m.subjects) == {"config.json", "model-00001.safetensors",
                               "model-00002.safetensors", "sub/tokenizer.json"}
    assert m.base_files == {"config.json": (h("c0"), 11), "model-00001.safetensors": (h("m1"), 100)}
    assert m.base_manifest is None and m.base_statement is None
    assert m.recipe == RECIPE and m.changes == CHANGES

    # Rewriting replaces the read-only file atomically.
    st2 = _statement(changes=[])
    write_manifest(tmp_path, st2)
    assert read_manifest(tmp_path).changes == []


def test_chain_links_and_embeds_the_base(tmp_path):
    base_dir, variant_dir = tmp_path / "base", tmp_path / "variant"
    base_dir.mkdir()
    variant_dir.mkdir()
    base_sha, base_size = write_manifest(base_dir, _statement())
    base = read_manifest(base_dir)
    st = _statement(base_statement=base,
                    base_files={**{n: tuple(v) for n, v in base.subjects.items()},
                                MANIFEST_NAME: (base_sha, base_size)})
    write_manifest(variant_dir, st)
    m = read_manifest(variant_dir)
    assert m.base_manifest == (base_sha, base_size)
    assert m.base_statement == base.statement
    assert set(m.base_files) == set(base.subjects)  # the base manifest is a link, not a file
    link = [d for d in m.predicate["buildDefinition"]["resolvedDependencies"]
            if d["name"] == MANIFEST_NAME]
    assert link[0]["annotations"]["role"] == "base-provenance"

    # A statement dict links by the sha256 of its canonical form: the same, for our own files.
    st_dict = _statement(base_statement=base.statement)
    dep = st_dict["predicate"]["buildDefinition"]["resolvedDependencies"][-1]
    assert dep["digest"]["sha256"] == base_sha

    # The embedded base is validated too.
    bad = copy.deepcopy(st)
    bad["predicate"]["buildDefinition"]["externalParameters"]["base_provenance"]["subject"][0][
        "name"] = "../evil"
    _write_raw(variant_dir, bad)
    with pytest.raises(InputError, match=r"base_provenance\.subject\[0\].*'\.\.' component"):
        read_manifest(variant_dir)


def test_build_statement_rejects_bad_input():
    with pytest.raises(ValueError, match="'..' component"):
        _statement(subjects={"../x": (h("a"), 1)})
    with pytest.raises(ValueError, match="sha256"):
        _statement(subjects={"x": ("ABC", 1)})
    with pytest.raises(ValueError, match="size"):
        _statement(subjects={"x": (h("a"), -1)})
    with pytest.raises(ValueError, match="recipe"):
        _statement(recipe={"name": "r"})
    with pytest.raises(ValueError, match="naive"):
        _statement(started=dt.datetime(2025, 1, 1))
    with pytest.raises(ValueError):
        _statement(options={"nan": float("nan")})


def _write_raw(directory, obj_or_bytes):
    path = directory / MANIFEST_NAME
    if path.exists():
        path.chmod(0o644)
    data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
    path.write_bytes(data)


def _set_subject(i, **fields):
    def tamper(st):
        st["subject"][i].update(fields)
    return tamper


def _set_annotation(i, value):
    def tamper(st):
        st["subject"][i]["annotations"]["size"] = value
    return tamper


def _dup(st):
    st["subject"].append(copy.deepcopy(st["subject"][0]))


TAMPERED = {
    "uppercase hex": (_set_subject(1, digest={"sha256": h("m1").upper()}),
                      r"subject\[1\].*lowercase hex"),
    "short hex": (_set_subject(1, digest={"sha256": "abc"}), "64 lowercase hex"),
    "no digest": (_set_subject(1, digest={"sha1": "a" * 40}), "digest.sha256"),
    "traversal": (_set_subject(0, name="../x"), r"'\.\./x'.*'\.\.' component"),
    "nested traversal": (_set_subject(0, name="sub/../../x"), "'..' component"),
    "absolute": (_set_subject(0, name="/etc/passwd"), "absolute path"),
    "duplicate": (_dup, "duplicate"),
    "state dir": (_set_subject(0, name=".modelpatch/journal.json"), "reserved"),
    "manifest itself": (_set_subject(0, name=MANIFEST_NAME), "reserved"),
    "backslash": (_set_subject(0, name="sub\\x"), "backslash"),
    "empty": (_set_subject(0, name=""), "path is empty"),
    "not normalized": (_set_subject(0, name="./x"), "empty or '.' component"),
    "double slash": (_set_subject(0, name="a//b"), "empty or '.' component"),
    "name not a string": (_set_subject(0, name=7), "subject\\[0\\]: name is a int, not a string"),
    "negative size": (_set_annotation(2, -1), "non-negative integer"),
    "bool size": (_set_annotation(2, True), "non-negative integer"),
    "string size": (_set_annotation(2, "10"), "non-negative integer"),
    "wrong _type": (lambda st: st.update(_type="https://in-toto.io/Statement/v0.1"), "_type"),
    "wrong predicateType": (lambda st: st.update(predicateType="x"), "predicateType"),
    "subject not a list": (lambda st: st.update(subject={}), "subject: expected a list"),
    "bad base file": (lambda st: st["predicate"]["buildDefinition"]["resolvedDependencies"][0]
                      .update(name="/abs"), r"resolvedDependencies\[0\].*absolute"),
    "bad recipe digest": (lambda st: st["predicate"]["buildDefinition"]["externalParameters"][
        "recipe"].update(sha256="nope"), "recipe.sha256"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_strict_reader_rejects(tmp_path, case):
    tamper, pattern = TAMPERED[case]
    st = _statement()
    tamper(st)
    _write_raw(tmp_path, st)
    with pytest.raises(InputError, match=pattern) as info:
        read_manifest(tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / MANIFEST_NAME) + ": ")
    assert info.value.exit_code == 2


@pytest.mark.parametrize("data, pattern", [
    (b"{", "invalid JSON at line 1"),
    (b'{"_type": 1, "_type": 2}', "duplicate key"),
    (b"\xff\xfe", "not valid UTF-8"),
    (b"[]", "expected an object"),
])
def test_strict_reader_rejects_bad_json(tmp_path, data, pattern):
    _write_raw(tmp_path, data)
    with pytest.raises(InputError, match=pattern) as info:
        read_manifest(tmp_path)
    assert MANIFEST_NAME in str(info.value) and "\n" not in str(info.value)


def test_missing_manifest(tmp_path):
    with pytest.raises(InputError, match="no provenance manifest"):
        read_manifest(tmp_path)


def test_write_manifest_refuses_an_invalid_statement(tmp_path):
    st = _statement()
    st["subject"][0]["name"] = "../x"
    with pytest.raises(ValueError, match="'..' component"):
        write_manifest(tmp_path, st)
    assert not (tmp_path / MANIFEST_NAME).exists()
