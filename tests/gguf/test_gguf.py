"""GGUF models: the built-in recipes on tiny GGUFs written by gguf-py's GGUFWriter,
read back by gguf-py's GGUFReader; plan, manifest, verify, in place and revert."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from fs_snapshot import cli, diff, snapshot
from gguf_fixtures import gguf, needs_gguf, read_back, tiny_dir, write_tiny

from patcher import api
from patcher.cli import main
from patcher.errors import GuardRefused, PlanError, RecipeError
from patcher.gguf.files import gguf_models
from patcher.gguf.format import read_header
from patcher.model.model_dir import ModelDir

pytestmark = needs_gguf
NEW_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def recipe(tmp_path: Path, body: str, name: str = "r") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"modelpatch: 1\nname: {name}\ndescription: test\n{body}")
    return path


def assert_same_tensors(before: Path, after: Path, dropped=(), renamed=None) -> None:
    _, src = read_back(before)
    _, out = read_back(after)
    renamed = renamed or {}
    expected = {renamed.get(n, n): data for n, data in src.items() if n not in dropped}
    assert out.keys() == expected.keys()
    for name, data in expected.items():
        assert out[name] == data, name


# ---------------------------------------------------------------- reading

def test_reader_agrees_with_gguf_py(tmp_path):
    path = write_tiny(tmp_path / "m.gguf")
    ours = read_header(path)
    reader = gguf.GGUFReader(path)
    assert [t.name for t in reader.tensors] == list(ours.tensors)
    for t in reader.tensors:
        mine = ours.tensors[t.name]
        assert ours.data_offset + mine.offset == t.data_offset
        assert mine.nbytes == t.n_bytes and mine.ggml_type == t.tensor_type
    meta, _ = read_back(path)
    assert {k: kv.value for k, kv in ours.kv.items()} == meta


def test_split_set_is_read_and_checked(tmp_path):
    root = tmp_path / "split"
    root.mkdir()
    write_tiny(root / "tiny.gguf", split_max_tensors=10)
    models = gguf_models(ModelDir.open(root))
    assert len(models) == 1 and len(models[0].files) == 3
    assert models[0].tensor_count() == 21
    (root / "tiny-00002-of-00003.gguf").unlink()
    with pytest.raises(Exception, match="lacks file"):
        gguf_models(ModelDir.open(root))


def test_inspect_directory_and_file(tmp_path):
    root = tiny_dir(tmp_path)
    report = api.inspect(root)
    model = report.gguf[0]
    assert report.format == "gguf" and model["architecture"] == "llama"
    assert model["metadata"]["tokenizer.ggml.tokens"]["value"] == "[32 items]"
    assert set(model["tensors"]["by_type"]) == {"F16", "F32", "Q8_0"}
    assert model["tensors"]["by_group"]["attention"]["tensors"] == 8
    result = run("inspect", root / "tiny.gguf")
    assert result.exit_code == 0, result.output
    assert "architecture llama" in result.output and "Q8_0" in result.output


# ---------------------------------------------------------------- built-in recipes

def _template(root: Path) -> dict:
    """gguf-chat-template's --set template=file:... for the chat_template.jinja in ``root``."""
    return {"template": f"file:{root / 'chat_template.jinja'}"}


def test_chat_template_recipe(tmp_path):
    root = tiny_dir(tmp_path)
    (root / "chat_template.jinja").write_text(NEW_TEMPLATE)
    result = api.apply("gguf-chat-template", root, params=_template(root), out=tmp_path / "out")
    meta, _ = read_back(result.output / "tiny.gguf")
    assert meta["tokenizer.chat_template"] == NEW_TEMPLATE
    before, _ = read_back(root / "tiny.gguf")
    assert {k: v for k, v in meta.items() if k != "tokenizer.chat_template"} == \
        {k: v for k, v in before.items() if k != "tokenizer.chat_template"}
    assert_same_tensors(root / "tiny.gguf", result.output / "tiny.gguf")
    assert api.verify(result.output).ok


def test_fix_eos_recipe_maps_the_tokenizer_eos_to_its_id(tmp_path):
    root = tiny_dir(tmp_path)
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "t7"}}))
    out = api.apply("gguf-fix-eos", root, out=tmp_path / "out").output
    meta, _ = read_back(out / "tiny.gguf")
    assert meta["tokenizer.ggml.eos_token_id"] == 7
    assert_same_tensors(root / "tiny.gguf", out / "tiny.gguf")
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<missing>"}))
    with pytest.raises(PlanError, match="not in tokenizer.ggml.tokens"):
        api.plan("gguf-fix-eos", root)


def test_strip_mtp_recipe(tmp_path):
    root = tiny_dir(tmp_path, arch="glm4moe", blocks=2, nextn=1)
    out = api.apply("gguf-strip-mtp", root, out=tmp_path / "out").output
    meta, tensors = read_back(out / "tiny.gguf")
    assert meta["glm4moe.block_count"] == 2
    assert meta["glm4moe.nextn_predict_layers"] == 0
    assert meta["glm4moe.attention.head_count_kv"] == [4, 4]
    _, before = read_back(root / "tiny.gguf")
    dropped = {n for n in before if n.startswith("blk.2.")}
    assert len(dropped) == 13 and not any(n.startswith("blk.2.") for n in tensors)
    assert_same_tensors(root / "tiny.gguf", out / "tiny.gguf", dropped=dropped)
    with pytest.raises(GuardRefused, match="refuses this model: .*no MTP/nextn layers"):
        api.plan("gguf-strip-mtp", out)


def test_context_recipe_and_its_refusals(tmp_path):
    root = tiny_dir(tmp_path)
    out = api.apply("gguf-context", root, out=tmp_path / "out").output
    meta, _ = read_back(out / "tiny.gguf")
    assert meta["llama.context_length"] == 8192
    assert meta["llama.rope.scaling.original_context_length"] == 2048
    assert meta["llama.rope.scaling.type"] == "yarn"
    assert meta["llama.rope.scaling.factor"] == 4.0
    assert_same_tensors(root / "tiny.gguf", out / "tiny.gguf")
    with pytest.raises(GuardRefused, match="already scaled"):
        api.plan("gguf-context", out)
    odd = tmp_path / "odd"
    odd.mkdir()
    write_tiny(odd / "tiny.gguf", extra_kv={"llama.rope.scaling.type":
                                            (gguf.GGUFValueType.STRING, "su-rope")})
    result = run("plan", "gguf-context", odd)
    assert result.exit_code == 2
    assert "'su-rope', a rope type this recipe does not know" in result.stderr


# ---------------------------------------------------------------- recipe ops

def test_metadata_ops_typed_arrays_from_file_and_arch(tmp_path):
    root = tiny_dir(tmp_path)
    (tmp_path / "t.jinja").write_text(NEW_TEMPLATE)
    path = recipe(tmp_path, """gguf:
  metadata:
    - {set: tokenizer.chat_template, from: t.jinja}
    - {set: tokenizer.ggml.eos_token_ids, value: [2, 5], type: "array[uint32]"}
    - {set: tokenizer.ggml.eos_token_id, value: 5}
    - {set: "{arch}.context_length", value: 4096, type: uint64}
    - {drop: general.name}
    - {rename: tokenizer.ggml.bos_token_id, to: tokenizer.ggml.padding_token_id}
""")
    out = api.apply(path, root, out=tmp_path / "out").output
    meta, _ = read_back(out / "tiny.gguf")
    assert meta["tokenizer.chat_template"] == NEW_TEMPLATE
    assert meta["tokenizer.ggml.eos_token_ids"] == [2, 5]
    assert meta["tokenizer.ggml.eos_token_id"] == 5
    assert meta["llama.context_length"] == 4096
    fields = gguf.GGUFReader(out / "tiny.gguf").fields
    assert fields["llama.context_length"].types == [gguf.GGUFValueType.UINT64]
    assert fields["tokenizer.ggml.eos_token_ids"].types == [gguf.GGUFValueType.ARRAY,
                                                            gguf.GGUFValueType.UINT32]
    assert "general.name" not in meta and "tokenizer.ggml.bos_token_id" not in meta
    assert meta["tokenizer.ggml.padding_token_id"] == 1
    changes = api.plan(path, root).to_json()["changes"]
    assert {c["key"] for c in changes if c["kind"] == "gguf_metadata"} >= {
        "llama.context_length", "general.name"}


def test_tensor_ops_glob_regex_layers(tmp_path):
    root = tiny_dir(tmp_path, blocks=4)
    path = recipe(tmp_path, """gguf:
  tensors:
    - {select: {glob: "blk.*.ffn_gate.weight", layers: "2-"}, drop: true}
    - {select: {regex: "^output\\\\.weight$"}, rename: {pattern: "^output", to: "lm_head"}}
    - {select: {layers: "last:1", glob: "*.attn_q.*"}, drop: true}
""")
    out = api.apply(path, root, out=tmp_path / "out").output
    dropped = {"blk.2.ffn_gate.weight", "blk.3.ffn_gate.weight", "blk.3.attn_q.weight"}
    assert_same_tensors(root / "tiny.gguf", out / "tiny.gguf", dropped=dropped,
                        renamed={"output.weight": "lm_head.weight"})
    text = run("plan", path, root).output
    assert "- blk.3.attn_q.weight  Q8_0[64, 64]  (drop)" in text
    assert "> output.weight -> lm_head.weight" in text


@pytest.mark.parametrize("body, message", [
    ("gguf:\n  metadata:\n    - {set: x, value: 1, type: uint33}\n", "unknown GGUF type"),
    ("gguf:\n  metadata:\n    - {set: x.rope.scaling.type, value: magic}\n",
     "unknown rope scaling type"),
    ("gguf:\n  metadata:\n    - {set: x, value: 1, from: a.txt}\n", "exactly one of value"),
    ("gguf:\n  tensors:\n    - {select: {layers: 'a-b'}, drop: true}\n", "layers 'a-b'"),
    ("gguf:\n  tensors:\n    - {select: {glob: x}}\n", "exactly one of drop"),
    ("gguf:\n  bogus: 1\n", "unknown key 'bogus'"),
])
def test_recipe_errors_name_the_line(tmp_path, body, message):
    with pytest.raises(RecipeError, match=message) as info:
        api.load(recipe(tmp_path, body))
    assert ":" in info.value.where


@pytest.mark.parametrize("body, message", [
    ("  metadata:\n    - {drop: no.such.key}\n", "'no.such.key' is not in"),
    ("  metadata:\n    - {set: llama.block_count, value: -1}\n", "out of range"),
    ("  metadata:\n    - {set: general.name, value: 3}\n", "expected a string"),
    ("  metadata:\n    - {rename: general.name, to: general.architecture}\n", "already exists"),
    ("  tensors:\n    - {select: {glob: 'nothing*'}, drop: true}\n", "selects no tensor"),
    ("  metadata:\n    - {set: general.alignment, value: 64}\n", "cannot edit it"),
    ("  metadata:\n    - {drop: split.count, missing_ok: true}\n", "cannot edit it"),
    ("  tensors:\n    - {select: {glob: 'blk.*'}, rename: {pattern: '^blk\\.\\d+', to: 'b'}}\n",
     "two tensors the name"),
])
def test_plan_errors(tmp_path, body, message):
    root = tiny_dir(tmp_path)
    result = run("plan", recipe(tmp_path, "gguf:\n" + body), root)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_guards_on_gguf_metadata(tmp_path):
    root = tiny_dir(tmp_path)
    path = recipe(tmp_path, """gguf:
  requires:
    - {key: general.architecture, one_of: [qwen2], message: only for qwen2}
  metadata:
    - {drop: general.name}
""")
    with pytest.raises(GuardRefused, match="only for qwen2"):
        api.plan(path, root)


def test_split_metadata_patch_rewrites_only_the_first_file(tmp_path):
    root = tmp_path / "split"
    root.mkdir()
    write_tiny(root / "tiny.gguf", split_max_tensors=10)
    (root / "chat_template.jinja").write_text(NEW_TEMPLATE)
    plan = api.plan("gguf-chat-template", root, options={"params": _template(root)})
    actions = {f.path: f.action.value for f in plan.files}
    assert actions["tiny-00001-of-00003.gguf"] == "rewrite-shard"
    assert actions["tiny-00002-of-00003.gguf"] == "link"
    out = api.apply("gguf-chat-template", root, params=_template(root),
                    out=tmp_path / "out").output
    assert read_back(out / "tiny-00001-of-00003.gguf")[0]["tokenizer.chat_template"] == \
        NEW_TEMPLATE
    assert len(gguf_models(ModelDir.open(out))) == 1


def test_split_tensor_drop_updates_every_file(tmp_path):
    root = tmp_path / "split"
    root.mkdir()
    write_tiny(root / "tiny.gguf", split_max_tensors=10)
    path = recipe(tmp_path, "gguf:\n  tensors:\n    - {select: {layers: '1'}, drop: true}\n")
    out = api.apply(path, root, out=tmp_path / "out").output
    (model,) = gguf_models(ModelDir.open(out))
    assert model.tensor_count() == 12
    for rel in model.files:
        assert read_back(out / rel)[0]["split.tensors.count"] == 12


# ---------------------------------------------------------------- engine guarantees

def test_in_place_and_revert_are_byte_identical(tmp_path):
    root = tiny_dir(tmp_path, arch="glm4moe", nextn=1)
    (root / "chat_template.jinja").write_text(NEW_TEMPLATE)
    before = snapshot(root)
    api.apply_in_place("gguf-strip-mtp", root)
    api.apply_in_place("gguf-chat-template", root, params=_template(root))
    assert read_back(root / "tiny.gguf")[0]["glm4moe.block_count"] == 2
    assert api.verify(root).ok
    api.revert(root, all_patches=True)
    assert diff(before, snapshot(root)) == []


def test_plan_shows_the_metadata_diff_and_the_manifest_records_it(tmp_path):
    root = tiny_dir(tmp_path)
    result = run("plan", "gguf-context", root)
    assert result.exit_code == 0, result.output
    assert "-llama.context_length: UINT32 2048" in result.output
    assert "+llama.context_length: UINT32 8192" in result.output
    out = api.apply("gguf-context", root, out=tmp_path / "out").output
    statement = json.loads((out / "modelpatch.provenance.json").read_text())
    assert "llama.context_length" in json.dumps(statement)
    shutil.copy(out / "tiny.gguf", tmp_path / "x")
    (out / "tiny.gguf").chmod(0o644)
    (out / "tiny.gguf").write_bytes((tmp_path / "x").read_bytes()[:-1] + b"\1")
    assert not api.verify(out).ok


@pytest.mark.parametrize("in_place, point", [(False, "tensor:blk.0.attn_v.weight"),
                                             (True, "manifest")])
def test_kill_9_while_writing_leaves_the_base_or_the_result(tmp_path, in_place, point):
    root = tiny_dir(tmp_path, arch="glm4moe", nextn=1)
    before = snapshot(root)
    out = tmp_path / "out"
    args = ["apply", "gguf-strip-mtp", root] + (["--in-place"] if in_place else ["-o", out])
    env = {"MODELPATCH_FAULT": f"kill@{point}", "MODELPATCH_CACHE_DIR": str(tmp_path / "dc")}
    assert cli(*args, env=env).returncode == -9
    api.recover(root)                   # what the next command does first
    assert diff(before, snapshot(root)) == [] and not out.exists()
    rerun = cli(*args, env={"MODELPATCH_CACHE_DIR": str(tmp_path / "dc")})
    assert rerun.returncode == 0, rerun.stderr
    target = root if in_place else out
    assert read_back(target / "tiny.gguf")[0]["glm4moe.block_count"] == 2


def test_token_values_and_the_readme_example(tmp_path):
    root = tiny_dir(tmp_path)
    path = recipe(tmp_path, """gguf:
  metadata:
    - {set: tokenizer.ggml.eos_token_id, value: t9, token: true}
    - {set: tokenizer.ggml.eot_token_id, value: t4, token: true}
""")
    meta, _ = read_back(api.apply(path, root, out=tmp_path / "out").output / "tiny.gguf")
    assert meta["tokenizer.ggml.eos_token_id"] == 9 and meta["tokenizer.ggml.eot_token_id"] == 4
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme[readme.index("```yaml\ngguf:") + 8:]
    block = block[:block.index("```")]
    (tmp_path / "template.jinja").write_text(NEW_TEMPLATE)
    loaded = api.load(recipe(tmp_path, block, name="readme"))
    assert loaded.gguf.strip_nextn and len(loaded.gguf.metadata) == 7


def test_the_base_is_hashed_from_the_reads_of_the_rewrite(tmp_path):
    root = tiny_dir(tmp_path)
    result = api.apply("gguf-context", root, out=tmp_path / "out")
    assert result.bytes_hashed == 0          # no separate pass over the base
    statement = json.loads((result.output / "modelpatch.provenance.json").read_text())
    expected = hashlib.sha256((root / "tiny.gguf").read_bytes()).hexdigest()
    assert expected in json.dumps(statement)
    api.revert(result.output, out=tmp_path / "back")
    assert (tmp_path / "back" / "tiny.gguf").read_bytes() == (root / "tiny.gguf").read_bytes()


def test_a_header_larger_than_the_first_read(tmp_path):
    big = "x" * (3 << 20)
    path = write_tiny(tmp_path / "big.gguf", extra_kv={"general.description":
                                                       (gguf.GGUFValueType.STRING, big)})
    header = read_header(path)
    assert header.get("general.description") == big and len(header.tensors) == 21


def test_in_place_on_a_hugging_face_cache_snapshot_never_touches_the_blobs(tmp_path):
    from fs_snapshot import blobs

    from examples.generate import make_hf_cache_snapshot

    source = tiny_dir(tmp_path)
    (source / "chat_template.jinja").write_text(NEW_TEMPLATE)
    root = make_hf_cache_snapshot(source, tmp_path / "hub", "org/tiny-GGUF")
    repo = root.parents[1]
    before, blobs_before = snapshot(root), blobs(repo)
    api.apply_in_place("gguf-chat-template", root, params=_template(source))
    assert (root / "tiny.gguf").is_file() and not (root / "tiny.gguf").is_symlink()
    assert read_back(root / "tiny.gguf")[0]["tokenizer.chat_template"] == NEW_TEMPLATE
    assert blobs(repo) == blobs_before
    out = api.apply("gguf-context", root, out=tmp_path / "variant").output
    assert read_back(out / "tiny.gguf")[0]["llama.context_length"] == 8192
    api.revert(root)
    assert diff(before, snapshot(root)) == [] and blobs(repo) == blobs_before


def test_metadata_that_fits_the_header_region_keeps_every_tensor_offset(tmp_path):
    root = tiny_dir(tmp_path)
    small = recipe(tmp_path, "gguf:\n  metadata:\n    - {set: tokenizer.ggml.eos_token_id, "
                   "value: 3}\n", name="small")
    (entry,) = [f for f in api.plan(small, root).to_json()["files"] if f["path"] == "tiny.gguf"]
    assert any("header fits" in line for line in entry["tensors"]["changed"])
    assert "# tiny.gguf: header fits the base's header region" in run("plan", small, root).output
    out = api.apply(small, root, out=tmp_path / "out").output
    data_offset = read_header(root / "tiny.gguf").data_offset
    new, old = (out / "tiny.gguf").read_bytes(), (root / "tiny.gguf").read_bytes()
    assert read_header(out / "tiny.gguf").data_offset == data_offset
    assert new[data_offset:] == old[data_offset:]
    big = recipe(tmp_path, "gguf:\n  metadata:\n    - {set: general.description, "
                 f"value: {'x' * 400}}}\n", name="big")
    (entry,) = [f for f in api.plan(big, root).to_json()["files"] if f["path"] == "tiny.gguf"]
    assert not any("header fits" in line for line in entry["tensors"]["changed"])


def test_an_mmproj_beside_the_model_is_left_alone(tmp_path):
    root = tiny_dir(tmp_path, arch="glm4moe", nextn=1)
    write_tiny(root / "mmproj-tiny.gguf", arch="clip", blocks=1,
               extra_kv={"general.type": (gguf.GGUFValueType.STRING, "mmproj")})
    plan = api.plan("gguf-strip-mtp", root)
    assert {f.path: f.action.value for f in plan.files} == {"tiny.gguf": "rewrite-shard",
                                                            "mmproj-tiny.gguf": "link"}
    (root / "tiny.gguf").unlink()
    with pytest.raises(GuardRefused, match="refuses this model: .*no .gguf model file"):
        api.plan("gguf-strip-mtp", root)


def test_gguf_sections_of_recipes_given_together_all_apply(tmp_path):
    root = tiny_dir(tmp_path)
    mine = recipe(tmp_path, "gguf:\n  metadata:\n    - {set: general.name, value: mine}\n",
                  name="mine")
    out = api.apply(["gguf-context", mine], root, out=tmp_path / "out").output
    meta, _ = read_back(out / "tiny.gguf")
    assert meta["llama.context_length"] == 8192 and meta["llama.rope.scaling.type"] == "yarn"
    assert meta["general.name"] == "mine"
    assert_same_tensors(root / "tiny.gguf", out / "tiny.gguf")


def test_an_included_gguf_section_applies_with_the_includers(tmp_path):
    root = tiny_dir(tmp_path)
    both = recipe(tmp_path, "include:\n  - {recipe: gguf-context}\ngguf:\n  metadata:\n"
                  "    - {set: general.name, value: both}\n"
                  "    - {set: \"{arch}.context_length\", from_key: \"{arch}.context_length\","
                  " multiply: 2}\n", name="both")
    out = api.apply(both, root, out=tmp_path / "out").output
    meta, _ = read_back(out / "tiny.gguf")
    # the included recipe's edits first, then the includer's, each on what the last left
    assert meta["llama.rope.scaling.type"] == "yarn" and meta["general.name"] == "both"
    assert meta["llama.context_length"] == 2048 * 4 * 2
    refused = recipe(tmp_path, "include:\n  - {recipe: gguf-context}\n", name="again")
    with pytest.raises(GuardRefused, match="already scaled"):
        api.plan(refused, out)


def test_chat_template_recipe_drops_the_named_templates_as_gguf_new_metadata_does(tmp_path):
    """llama.cpp serves tokenizer.chat_template.tool_use to any request with tools: a stale one
    would keep the old tool-calling format. gguf-py's gguf-new-metadata is the reference."""
    import subprocess
    import sys

    S, A = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
    root = tiny_dir(tmp_path, extra_kv={"tokenizer.chat_template.tool_use": (S, "old tools"),
                                        "tokenizer.chat_template.rag": (S, "old rag"),
                                        "tokenizer.chat_templates": (A, ["tool_use", "rag"])})
    (root / "chat_template.jinja").write_text(NEW_TEMPLATE)
    result = api.apply("gguf-chat-template", root, params=_template(root), out=tmp_path / "out")
    meta, _ = read_back(result.output / "tiny.gguf")
    reference = tmp_path / "reference.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--chat-template",
                    NEW_TEMPLATE, "--force", str(root / "tiny.gguf"), str(reference)],
                   check=True, capture_output=True)
    assert meta == read_back(reference)[0]
    assert not any(k.startswith("tokenizer.chat_template.") or k == "tokenizer.chat_templates"
                   for k in meta)
    assert meta["tokenizer.chat_template"] == NEW_TEMPLATE
    assert_same_tensors(root / "tiny.gguf", result.output / "tiny.gguf")


def _writer_size_label(path: Path) -> str:
    """general.size_label as gguf-py's GGUFWriter counts it for the tensors of ``path``."""
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(None, "x")
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    return gguf.utility.size_label(*writer.get_total_parameter_count())


def test_strip_mtp_counts_the_size_label_again(tmp_path):
    S = gguf.GGUFValueType.STRING
    first = tiny_dir(tmp_path, "first", arch="glm4moe", blocks=2, nextn=1)
    label = _writer_size_label(first / "tiny.gguf")
    root = tiny_dir(tmp_path, arch="glm4moe", blocks=2, nextn=1,
                    extra_kv={"general.size_label": (S, label)})
    out = api.apply("gguf-strip-mtp", root, out=tmp_path / "out").output
    meta, _ = read_back(out / "tiny.gguf")
    assert meta["general.size_label"] == _writer_size_label(out / "tiny.gguf") != label
    odd = tiny_dir(tmp_path, "odd", arch="glm4moe", blocks=2, nextn=1,
                   extra_kv={"general.size_label": (S, "by hand")})
    out = api.apply("gguf-strip-mtp", odd, out=tmp_path / "odd-out").output
    assert "general.size_label" not in read_back(out / "tiny.gguf")[0]


@pytest.mark.parametrize("kv,message", [
    ({"glm4moe.nextn_predict_layers": (gguf.GGUFValueType.STRING, "1")} if gguf else {},
     "glm4moe.nextn_predict_layers must be a non-negative integer; got STRING '1'"),
    ({"glm4moe.nextn_predict_layers": (gguf.GGUFValueType.UINT32, 9)} if gguf else {},
     "glm4moe.nextn_predict_layers is 9 but glm4moe.block_count is 3"),
])
def test_strip_mtp_refuses_bad_block_counts_in_one_line(tmp_path, kv, message):
    root = tiny_dir(tmp_path, arch="glm4moe", blocks=3, extra_kv=kv)
    result = run("plan", "gguf-strip-mtp", root)
    assert result.exit_code == 2, (result.output, result.exception)
    (line,) = result.stderr.strip().splitlines()
    assert message in line


def test_strip_mtp_refuses_a_missing_block_count_in_one_line(tmp_path):
    import numpy as np

    root = tmp_path / "m"
    root.mkdir()
    w = gguf.GGUFWriter(root / "m.gguf", "glm4moe")
    w.add_nextn_predict_layers(1)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    result = run("plan", "gguf-strip-mtp", root)
    assert result.exit_code == 2, (result.output, result.exception)
    (line,) = result.stderr.strip().splitlines()
    assert "glm4moe.block_count is missing" in line
