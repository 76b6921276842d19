"""A .gguf file given as MODEL to plan, apply, verify and revert: the variant is a
directory holding the new file and its manifest; the files beside the base are left alone."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from fs_snapshot import diff, snapshot
from gguf_fixtures import gguf, needs_gguf, read_back, write_tiny

from patcher import api
from patcher.cli import main
from patcher.model.model_dir import MANIFEST_NAME

pytestmark = needs_gguf


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def quants_dir(tmp_path):
    """A GGUF repository as people download it: several quantizations side by side."""
    root = tmp_path / "repo"
    root.mkdir()
    write_tiny(root / "tiny-Q8_0.gguf", seed=1)
    write_tiny(root / "tiny-F16.gguf", seed=2)
    (root / "README.md").write_text("# tiny\n")
    return root


def test_apply_to_one_file_of_many_writes_a_directory_with_it_and_its_manifest(tmp_path):
    root = quants_dir(tmp_path)
    before = snapshot(root)
    model = root / "tiny-Q8_0.gguf"
    result = run("apply", "gguf-context", model)
    assert result.exit_code == 0, result.output
    out = root / "tiny-Q8_0-gguf-context"
    assert result.output.strip() == str(out)
    assert sorted(os.listdir(out)) == [".modelpatch", MANIFEST_NAME, "tiny-Q8_0.gguf"]
    assert read_back(out / "tiny-Q8_0.gguf")[0]["llama.context_length"] == 8192
    statement = json.loads((out / MANIFEST_NAME).read_text())
    assert [s["name"] for s in statement["subject"]] == ["tiny-Q8_0.gguf"]
    assert api.verify(out / "tiny-Q8_0.gguf").ok           # a file stands for its directory
    after = snapshot(root)
    kept = {k: v for k, v in after.items() if not k.startswith("tiny-Q8_0-gguf")}
    assert diff(before, kept) == []
    back = tmp_path / "back"
    assert run("revert", out / "tiny-Q8_0.gguf", "-o", back).exit_code == 0
    assert (back / "tiny-Q8_0.gguf").read_bytes() == model.read_bytes()


def test_plan_of_a_file_names_only_that_file(tmp_path):
    root = quants_dir(tmp_path)
    plan = api.plan("gguf-context", root / "tiny-F16.gguf").to_json()
    assert [f["path"] for f in plan["files"]] == ["tiny-F16.gguf"]
    result = run("plan", "gguf-context", root / "tiny-F16.gguf")
    assert result.exit_code == 0 and "tiny-Q8_0" not in result.output


def test_output_named_like_a_gguf_file_is_refused_in_one_line(tmp_path):
    root = quants_dir(tmp_path)
    result = run("apply", "gguf-context", root / "tiny-F16.gguf", "-o", tmp_path / "new.gguf")
    assert result.exit_code == 2
    assert "-o names the output directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2 and "Traceback" not in result.stderr
    assert not (tmp_path / "new.gguf").exists()


def test_in_place_on_a_file_beside_another_model_is_refused(tmp_path):
    root = quants_dir(tmp_path)
    before = snapshot(root)
    for dry in ([], ["--dry-run"]):
        result = run("apply", "gguf-context", root / "tiny-F16.gguf", "--in-place", *dry)
        assert result.exit_code == 2 and "also holds the GGUF model tiny-Q8_0.gguf" in result.stderr
    assert diff(before, snapshot(root)) == []


def test_in_place_on_a_file_alone_with_its_mmproj_verifies_and_reverts(tmp_path):
    root = tmp_path / "alone"
    root.mkdir()
    model = write_tiny(root / "tiny.gguf")
    write_tiny(root / "mmproj-tiny.gguf", arch="clip", blocks=1,
               extra_kv={"general.type": (gguf.GGUFValueType.STRING, "mmproj")})
    (root / "tokenizer_config.json").write_text('{"eos_token": "t5"}')
    before = snapshot(root)
    result = run("apply", "gguf-fix-eos", model, "--in-place")
    assert result.exit_code == 0, result.output
    assert read_back(model)[0]["tokenizer.ggml.eos_token_id"] == 5
    assert run("verify", model).exit_code == 0
    assert run("revert", model).exit_code == 0
    assert diff(before, snapshot(root)) == []


def test_a_split_member_as_model_takes_the_whole_set(tmp_path):
    root = tmp_path / "split"
    root.mkdir()
    write_tiny(root / "tiny.gguf", split_max_tensors=8)
    names = sorted(os.listdir(root))
    assert names[0] == "tiny-00001-of-00003.gguf"
    out = api.apply("gguf-context", root / names[1], out=tmp_path / "v").output
    assert sorted(os.listdir(out)) == sorted(names + [".modelpatch", MANIFEST_NAME])
    assert read_back(out / names[0])[0]["llama.context_length"] == 8192


def test_a_missing_file_is_named_in_one_line(tmp_path):
    result = run("plan", "gguf-context", tmp_path / "nope.gguf")
    assert result.exit_code == 2 and "nope.gguf: no such file" in result.stderr


def test_a_file_of_a_hugging_face_cache_snapshot_writes_its_variant_outside_the_cache(
        tmp_path, monkeypatch):
    from fs_snapshot import blobs

    from examples.generate import make_hf_cache_snapshot

    source = quants_dir(tmp_path)
    root = make_hf_cache_snapshot(source, tmp_path / "hub", "org/tiny-GGUF")
    repo = root.parents[1]
    blobs_before = blobs(repo)
    assert (root / "tiny-F16.gguf").is_symlink()
    monkeypatch.chdir(tmp_path)
    result = run("apply", "gguf-context", root / "tiny-F16.gguf")
    assert result.exit_code == 0, result.output
    out = tmp_path / "tiny-F16-gguf-context"
    assert result.output.strip() == str(out)
    assert read_back(out / "tiny-F16.gguf")[0]["llama.context_length"] == 8192
    assert blobs(repo) == blobs_before and sorted(os.listdir(root)) == sorted(os.listdir(source))
