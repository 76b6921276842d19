"""apply / plan / verify end to end on the Kimi-shaped example."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from tensor_helpers import snapshot  # bytes, mode, inode and mtime of every entry

from patcher import api
from patcher.cli import main
from patcher.integrity.manifest import read_manifest

RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.fixture
def kimi(kimi_dir, tmp_path) -> Path:
    dst = tmp_path / "kimi"
    shutil.copytree(kimi_dir, dst, symlinks=True)
    # Files modified within the last moments are not cached (a racy mtime could hide a later
    # change): age them like a downloaded model.
    old = 1_700_000_000
    for path in dst.rglob("*"):
        os.utime(path, (old, old), follow_symlinks=False)
    return dst


def run(*args: str, ok: bool = True):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output + (result.stderr or "")
    return result


def test_sm120_variant_nulls_both_keys_and_keeps_everything_else(kimi):
    before = snapshot(kimi)
    result = run("apply", "sm120-fp16-kv", kimi, "-q")
    out = Path(result.stdout.strip())
    assert out == kimi.with_name("kimi-sm120-fp16-kv")

    old_cfg = json.loads((kimi / "config.json").read_text())
    new_cfg = json.loads((out / "config.json").read_text())
    assert old_cfg["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    old_cfg["quantization_config"]["kv_cache_scheme"] = None
    assert new_cfg == old_cfg
    old_hq = json.loads((kimi / "hf_quant_config.json").read_text())
    new_hq = json.loads((out / "hf_quant_config.json").read_text())
    old_hq["quantization"]["kv_cache_quant_algo"] = None   # vLLM requires the key: null, kept
    assert new_hq == old_hq
    # Only the patched line changes: the rest of the text is byte-identical.
    old_lines = (kimi / "hf_quant_config.json").read_text().splitlines()
    new_lines = (out / "hf_quant_config.json").read_text().splitlines()
    assert [(a, b) for a, b in zip(old_lines, new_lines) if a != b] == [
        ('        "kv_cache_quant_algo": "FP8",', '        "kv_cache_quant_algo": null,')]

    for shard in kimi.glob("*.safetensors"):
        assert (out / shard.name).stat().st_ino == shard.stat().st_ino   # hardlinked
    assert (out / "config.json").stat().st_mode & 0o777 == 0o444
    assert snapshot(kimi) == before                                       # base untouched
    assert api.verify(out).ok


def test_verify_detects_changed_byte_removed_and_added_files(kimi):
    out = Path(run("apply", "sm120-fp16-kv", kimi, "-q").stdout.strip())
    shard = out / "model-00002-of-00004.safetensors"
    # A shard is a hardlink to the base: break the link before editing the copy.
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.unlink()
    shard.write_bytes(bytes(data))
    result = run("verify", out, "--json", ok=False)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert [m["path"] for m in report["modified"]] == [shard.name]

    (out / "generation_config.json").unlink()
    (out / "extra.txt").write_text("x")
    report = json.loads(run("verify", out, "--json", ok=False).stdout)
    assert report["missing"] == ["generation_config.json"]
    assert report["extra"] == ["extra.txt"]


def test_second_apply_reuses_known_digests(kimi, tmp_path):
    first = api.apply("sm120-fp16-kv", kimi, out=tmp_path / "v1")
    second = api.apply("sm120-fp16-kv", kimi, out=tmp_path / "v2")
    assert first.bytes_hashed > 4_000_000
    assert second.bytes_hashed == 0
    assert read_manifest(tmp_path / "v1").subjects == read_manifest(tmp_path / "v2").subjects


def test_copy_flag_copies_instead_of_linking(kimi, tmp_path):
    result = api.apply("sm120-fp16-kv", kimi, out=tmp_path / "v", force_copy=True)
    assert result.link_method == "copy"
    shard = "model-00001-of-00004.safetensors"
    assert (tmp_path / "v" / shard).stat().st_ino != (kimi / shard).stat().st_ino
    assert api.verify(tmp_path / "v").ok


def test_plan_prints_diffs_and_table_and_writes_nothing(kimi):
    def snapshot_beside(model):       # the header cache (digest-cache/headers) may be written
        return {k: v for k, v in snapshot(model.parent).items() if not k.startswith("digest-")}

    before = snapshot_beside(kimi)
    text = run("plan", "sm120-fp16-kv", kimi).stdout
    assert '-        "kv_cache_scheme": {' in text
    assert '-        "kv_cache_quant_algo": "FP8",' in text
    assert "~ config.json" in text and "write-json" in text
    assert "Plan: 10 link, 2 write-json" in text
    data = json.loads(run("apply", "--dry-run", "--json", "sm120-fp16-kv", kimi).stdout)
    actions = {f["path"]: f["action"] for f in data["files"]}
    assert actions["config.json"] == "write-json"
    assert actions["model-00001-of-00004.safetensors"] == "link"
    assert {c["path"] for c in data["changes"]} == {"/quantization_config/kv_cache_scheme",
                                                   "/quantization/kv_cache_quant_algo"}
    assert snapshot_beside(kimi) == before


def test_manifest_is_in_toto_with_change_log_and_chained_provenance(kimi, tmp_path):
    v1 = tmp_path / "v1"
    api.apply("sm120-fp16-kv", kimi, out=v1)
    statement = json.loads((v1 / "modelpatch.provenance.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    names = {s["name"] for s in statement["subject"]}
    assert "config.json" in names and not any(n.startswith(".modelpatch") for n in names)
    manifest = read_manifest(v1)
    assert manifest.recipe["name"] == "sm120-fp16-kv"
    assert manifest.recipe["text"] == (RECIPE_DIR / "sm120-fp16-kv.yaml").read_text()
    nulled = {(c["file"], c["path"]) for c in manifest.changes
              if c["kind"] == "set" and c["after"] is None}
    assert nulled == {("config.json", "/quantization_config/kv_cache_scheme"),
                      ("hf_quant_config.json", "/quantization/kv_cache_quant_algo")}

    v2 = tmp_path / "v2"
    api.apply("drop-kv-scales", v1, out=v2)
    chained = read_manifest(v2)
    assert chained.base_statement["predicate"]["buildDefinition"]["externalParameters"][
        "recipe"]["name"] == "sm120-fp16-kv"
    assert api.verify(v2).ok


def test_guard_refusal_exits_1_and_writes_nothing(kimi, tmp_path):
    run("apply", "sm120-fp16-kv", kimi, "-o", tmp_path / "v1", "-q")
    result = run("apply", "sm120-fp16-kv", tmp_path / "v1", "-o", tmp_path / "v2", ok=False)
    assert result.exit_code == 1
    assert "declares no FP8 KV cache" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "v2").exists()


def test_bad_recipe_reports_line_and_column(kimi, tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("modelpatch: 1\nname: bad\ndescription: x\nconfg:\n  config.json: []\n")
    result = run("apply", recipe, kimi, ok=False)
    assert result.exit_code == 2
    assert f"{recipe}:4:1:" in result.stderr and "config" in result.stderr
    assert result.stderr.count("\n") == 1


def test_failing_json_patch_test_op_writes_nothing(kimi, tmp_path):
    recipe = tmp_path / "t.yaml"
    recipe.write_text("modelpatch: 1\nname: t\ndescription: x\nconfig:\n  config.json:\n"
                      "    - {op: test, path: /model_type, value: llama}\n"
                      "    - {op: remove, path: /vision_config}\n")
    result = run("apply", recipe, kimi, "-o", tmp_path / "out", ok=False)
    assert result.exit_code == 2
    assert "/model_type" in result.stderr and "t.yaml:6" in result.stderr
    assert not (tmp_path / "out").exists()


def test_recipe_editing_a_missing_file_is_an_error(kimi, tmp_path):
    recipe = tmp_path / "m.yaml"
    recipe.write_text("modelpatch: 1\nname: m\ndescription: x\nconfig:\n"
                      "  preprocessor_config.json:\n"
                      "    - set: /size\n      value: 3\n")
    result = run("apply", recipe, kimi, ok=False)
    assert result.exit_code == 2
    assert "preprocessor_config.json" in result.stderr


def test_existing_output_is_refused_unless_force(kimi, tmp_path):
    out = tmp_path / "out"
    run("apply", "sm120-fp16-kv", kimi, "-o", out, "-q")
    first = (out / "modelpatch.provenance.json").read_bytes()
    result = run("apply", "sm120-fp16-kv", kimi, "-o", out, ok=False)
    assert result.exit_code == 2 and "--force" in result.stderr
    assert (out / "modelpatch.provenance.json").read_bytes() == first
    run("apply", "sm120-fp16-kv", kimi, "-o", out, "--force", "-q")
    assert (out / "modelpatch.provenance.json").read_bytes() != first and api.verify(out).ok
    assert not list(tmp_path.glob(".out.*"))                 # no staging or lock residue


@pytest.mark.parametrize("what", ["directory", "file"])
def test_force_never_replaces_what_modelpatch_did_not_write(kimi, tmp_path, what):
    out = tmp_path / "precious"
    if what == "directory":
        out.mkdir()
        (out / "keep.txt").write_text("x")
    else:
        out.write_text("x")
    result = run("apply", "sm120-fp16-kv", kimi, "-o", out, "--force", ok=False)
    assert result.exit_code == 2 and "not" in result.stderr and "precious" in result.stderr
    assert (out / "keep.txt").read_text() == "x" if what == "directory" else out.read_text() == "x"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("apply", "sm120-fp16-kv", kimi, "-o", empty, "--force", "-q").exit_code == 0


def test_default_output_of_a_cache_snapshot_is_not_inside_the_cache(kimi_dir, tmp_path,
                                                                     monkeypatch):
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(kimi_dir, tmp_path / "hf", "nvidia/Kimi-K2.5-NVFP4")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = run("apply", "sm120-fp16-kv", snap, "-q")
    assert result.stdout.strip() == str(work / "Kimi-K2.5-NVFP4-sm120-fp16-kv")
    assert sorted(p.name for p in snap.parent.iterdir()) == [snap.name]


@pytest.mark.parametrize("point", ["file:config.json", "hashing", "manifest", "commit"])
def test_interrupt_while_writing_leaves_no_output_and_no_staging(kimi, tmp_path, monkeypatch,
                                                                 point):
    from patcher import faults

    def interrupt(name):
        if name == point:
            raise KeyboardInterrupt

    monkeypatch.setattr(faults, "point", interrupt)
    before = snapshot(kimi)
    result = run("apply", "sm120-fp16-kv", kimi, "-o", tmp_path / "out", ok=False)
    assert result.exit_code == 130
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out*"))                 # staging and lock file gone
    assert snapshot(kimi) == before


def test_injected_disk_full_is_one_line_and_cleans_up(kimi, tmp_path, monkeypatch):
    import errno

    from patcher import faults

    def full(name):
        if name == "manifest":
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr(faults, "point", full)
    result = run("apply", "sm120-fp16-kv", kimi, "-o", tmp_path / "out", ok=False)
    assert result.exit_code == 3
    assert "No space left on device" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out*"))


def test_recipes_list_and_show():
    listing = run("recipes", "list").stdout
    for name in ("sm120-fp16-kv", "drop-kv-scales", "fp8-block-to-bf16", "nvfp4-to-bf16"):
        assert name in listing
    assert run("recipes", "show", "sm120-fp16-kv").stdout == \
        (RECIPE_DIR / "sm120-fp16-kv.yaml").read_text()
    result = run("recipes", "show", "no-such-recipe", ok=False)
    assert result.exit_code == 2 and "sm120-fp16-kv" in result.stderr


def test_config_only_patch_keeps_transformers_logits(tiny_bf16_dir, tmp_path):
    """A config-only recipe must not change what the model computes: reload both in
    transformers and compare logits exactly."""
    import torch
    from tensor_helpers import transformers_logits

    recipe = tmp_path / "c.yaml"
    recipe.write_text("modelpatch: 1\nname: c\ndescription: x\nconfig:\n  config.json:\n"
                      "    - set: /use_cache\n      value: false\n"
                      "  generation_config.json:\n    - set: /max_length\n      value: 64\n")
    out = api.apply(recipe, tiny_bf16_dir, out=tmp_path / "v").output
    assert json.loads((out / "config.json").read_text())["use_cache"] is False
    assert torch.equal(transformers_logits(tiny_bf16_dir), transformers_logits(out))


@pytest.mark.parametrize("where", ["inside", "ancestor"])
def test_output_inside_the_base_or_containing_it_is_refused(kimi, where):
    before = snapshot(kimi)
    out = kimi / "variant" if where == "inside" else kimi.parent
    result = run("apply", "sm120-fp16-kv", kimi, "-o", out, "--force", ok=False)
    assert result.exit_code == 2 and "contain one another" in result.stderr
    assert snapshot(kimi) == before


@pytest.mark.parametrize(("name", "content", "says"), [
    ("model-00001-of-00004.safetensors", "hi", "made by the tensors: operations"),
    ("model.safetensors.index.json", "{}", "made by the tensors: operations"),
    ("config.json", "{not json", "is not valid JSON"),
    ("generation_config.json", '{"a": 1, "a": 2}', "is not valid JSON"),
])
def test_files_add_never_writes_an_unloadable_variant(kimi, tmp_path, name, content, says):
    recipe = tmp_path / "add.yaml"
    recipe.write_text("modelpatch: 1\nname: add\ndescription: x\nfiles:\n"
                      f"  - add: {name}\n    content: '{content}'\n    overwrite: true\n")
    result = run("apply", recipe, kimi, "-o", tmp_path / "v", ok=False)
    assert result.exit_code == 2 and says in result.stderr and "add.yaml:5:5" in result.stderr
    assert not (tmp_path / "v").exists()
