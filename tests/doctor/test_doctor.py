"""``modelpatch doctor``: each built-in rule with a model that triggers it and one that does not,
targets, user rules, exit codes and ``--fix``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from examples.generate import make_kimi_nvfp4
from patcher import api
from patcher.cli import main
from patcher.doctor.rules import builtin_rules_dir, load_rules
from patcher.errors import InputError, RecipeError

JSON_FILES = ("config.json", "hf_quant_config.json", "generation_config.json",
              "tokenizer_config.json")


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> Path:
    return make_kimi_nvfp4(tmp_path_factory.mktemp("doctor") / "kimi")


def _configs(kimi: Path, dest: Path, edit=None) -> Path:
    """The Kimi look-alike's JSON files alone (rules read only JSON), edited by ``edit``."""
    dest.mkdir()
    for name in JSON_FILES:
        shutil.copy(kimi / name, dest / name)
    docs = {n: json.loads((dest / n).read_text()) for n in JSON_FILES}
    _eos_agrees(docs)       # the look-alike's EOS disagree as Kimi's do (eos-inconsistent)
    if edit:
        edit(docs)
    for name, doc in docs.items():
        (dest / name).write_text(json.dumps(doc, indent=2))
    return dest


def _eos_agrees(docs):
    docs["generation_config.json"]["eos_token_id"] = [769, 770]


def _rules_found(model, **target) -> dict[str, str]:
    report = api.doctor(model, **target).to_json()
    return {f["rule"]: f["severity"] for f in report["findings"]}


def _no_fp8_kv(docs):
    docs["config.json"]["quantization_config"]["kv_cache_scheme"] = None
    docs["hf_quant_config.json"]["quantization"]["kv_cache_quant_algo"] = None


def _not_mla(docs):
    docs["config.json"]["text_config"]["model_type"] = "qwen3"
    del docs["config.json"]["text_config"]["kv_lora_rank"]


def _rank_left_out(docs):
    """No kv_lora_rank: DeepseekV3Config's default (512) fills it, MLA to vLLM."""
    del docs["config.json"]["text_config"]["kv_lora_rank"]


def test_every_builtin_rule_loads_and_is_tested():
    ids = {r.id for r in load_rules()}
    assert ids == {"fp8-kv-mla-vllm-sm120", "fp8-kv-mla-vllm-below-sm89",
                   "quant-config-disagreement", "remote-code-with-native-class",
                   "tied-lm-head-ignored", "untied-lm-head-missing",
                   "duplicate-consolidated-safetensors", "quantized-weights-below-vllm-minimum",
                   "eos-inconsistent", "quant-ignore-unmatched", "quant-unquantized-uncovered",
                   "kv-scale-names-sglang", "mtp-layers-unused", "gguf-mtp-layers-unused",
                   "gguf-eos-inconsistent", "config-json-missing"}
    assert len(list(builtin_rules_dir().glob("*.yaml"))) == len(ids)


@pytest.mark.parametrize("engine, gpu, edit, fires", [
    ("vllm==0.15.1", "sm120", None, True),
    ("vllm==0.17.1", "sm121", None, True),
    ("vllm==0.18.0", "sm120", None, False),         # PR #34597 released
    ("vllm==0.15.1", "sm90", None, False),          # FlashMLA on Hopper
    ("sglang==0.5.0", "sm120", None, False),
    ("vllm==0.15.1", "sm120", _no_fp8_kv, False),
    ("vllm==0.15.1", "sm120", _not_mla, False),
    ("vllm==0.15.1", "sm120", _rank_left_out, True),
])
def test_fp8_kv_mla_sm120_rule(kimi, tmp_path, engine, gpu, edit, fires):
    found = _rules_found(_configs(kimi, tmp_path / "m", edit), engine=engine, gpu=gpu)
    assert (found.get("fp8-kv-mla-vllm-sm120") == "blocker") is fires


@pytest.mark.parametrize("engine, gpu, edit, fires", [
    ("vllm==0.33.0", "sm86", None, True),
    ("vllm==0.15.1", "sm80", None, True),
    ("vllm==0.33.0", "sm89", None, False),
    ("vllm==0.33.0", "sm86", _no_fp8_kv, False),
])
def test_fp8_kv_mla_below_sm89_rule(kimi, tmp_path, engine, gpu, edit, fires):
    found = _rules_found(_configs(kimi, tmp_path / "m", edit), engine=engine, gpu=gpu)
    assert (found.get("fp8-kv-mla-vllm-below-sm89") == "blocker") is fires


def test_quant_config_disagreement_rule(kimi, tmp_path):
    def regroup(docs):
        docs["hf_quant_config.json"]["quantization"]["group_size"] = 32

    report = api.doctor(_configs(kimi, tmp_path / "bad", regroup)).to_json()
    (finding,) = report["findings"]
    assert (finding["rule"], finding["severity"], finding["fix"]) == \
        ("quant-config-disagreement", "warning", None)
    assert finding["details"] == ["group_size: config.json 16 vs hf_quant_config.json 32"]
    assert _rules_found(_configs(kimi, tmp_path / "good")) == {}


@pytest.mark.parametrize("model_type, fires", [("deepseek_v3", True), ("my_own_arch", False)])
def test_remote_code_rule(kimi, tmp_path, model_type, fires):
    def remote_code(docs):
        docs["config.json"]["model_type"] = model_type
        docs["config.json"]["auto_map"] = {"AutoConfig": "configuration_x.XConfig"}

    found = _rules_found(_configs(kimi, tmp_path / "m", remote_code))
    assert (found.get("remote-code-with-native-class") == "warning") is fires
    assert "remote-code-with-native-class" not in _rules_found(_configs(kimi, tmp_path / "n"))


def _llama(path: Path, tie: bool, lm_head: bool) -> Path:
    import torch
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                  "tie_word_embeddings": tie}))
    tensors = {"model.embed_tokens.weight": torch.zeros(8, 4),
               "model.norm.weight": torch.ones(4)}
    if lm_head:
        tensors["lm_head.weight"] = torch.zeros(8, 4)
    save_file(tensors, path / "model.safetensors")
    return path


@pytest.mark.parametrize("tie, lm_head, expected", [
    (True, True, {"tied-lm-head-ignored": "warning"}),
    (True, False, {}),
    (False, False, {"untied-lm-head-missing": "blocker"}),
    (False, True, {}),
])
def test_lm_head_and_tie_word_embeddings_rules(tmp_path, tie, lm_head, expected):
    assert _rules_found(_llama(tmp_path / "m", tie, lm_head)) == expected


@pytest.mark.parametrize("consolidated, fires", [(True, True), (False, False)])
def test_duplicate_consolidated_rule(tmp_path, consolidated, fires):
    model = _llama(tmp_path / "m", tie=False, lm_head=True)
    shard = model / "model-00001-of-00001.safetensors"
    (model / "model.safetensors").rename(shard)
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        n: shard.name for n in ("model.embed_tokens.weight", "model.norm.weight",
                                "lm_head.weight")}}))
    if consolidated:
        (model / "consolidated.safetensors").write_bytes(shard.read_bytes())
    assert _rules_found(model) == ({"duplicate-consolidated-safetensors": "warning"}
                                   if fires else {})


def _modelopt_fp8(docs):
    docs["config.json"]["quantization_config"]["quant_algo"] = "FP8"
    docs["hf_quant_config.json"]["quantization"]["quant_algo"] = "FP8"


@pytest.mark.parametrize("gpu, edit, fires", [
    ("sm70", None, True),              # NVFP4: minimum 7.5
    ("sm75", None, False),
    ("sm75", _modelopt_fp8, True),     # ModelOpt FP8: minimum 8.0
    ("sm80", _modelopt_fp8, False),
    ("sm70", _no_fp8_kv, True),
])
def test_quantized_weights_below_vllm_minimum_rule(kimi, tmp_path, gpu, edit, fires):
    found = _rules_found(_configs(kimi, tmp_path / "m", edit), engine="vllm==0.33.0", gpu=gpu)
    assert (found.get("quantized-weights-below-vllm-minimum") == "blocker") is fires


def test_quantized_block_fp8_rule_and_bf16_non_trigger(tmp_path):
    model = _llama(tmp_path / "m", tie=False, lm_head=True)
    config = json.loads((model / "config.json").read_text())
    assert "quantized-weights-below-vllm-minimum" not in _rules_found(
        model, engine="vllm==0.33.0", gpu="sm70")
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (model / "config.json").write_text(json.dumps(config))
    assert _rules_found(model, engine="vllm==0.33.0", gpu="sm70") == {
        "quantized-weights-below-vllm-minimum": "blocker"}


def test_rules_needing_missing_facts_are_reported_not_run(kimi, tmp_path):
    report = api.doctor(_configs(kimi, tmp_path / "m"), gpu="sm120").to_json()
    assert report["findings"] == []
    assert {"rule": "fp8-kv-mla-vllm-sm120", "needs": ["engine"]} \
        in report["not_checked"]


def test_engine_and_gpu_that_cannot_be_read_are_one_line_errors(kimi, tmp_path, monkeypatch):
    import importlib.metadata as md

    def absent(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", absent)
    with pytest.raises(InputError, match="vllm is not installed.*"):
        api.doctor(kimi, engine="vllm")
    with pytest.raises(InputError, match="unknown engine 'tgi'"):
        api.doctor(kimi, engine="tgi==1.0")
    with pytest.raises(InputError, match="--gpu blackwell"):
        api.doctor(kimi, gpu="blackwell")


def test_engine_without_version_reads_the_installed_one(kimi, tmp_path, monkeypatch):
    import importlib.metadata as md

    monkeypatch.setattr(md, "version", lambda name: "0.15.1" if name == "vllm" else None)
    report = api.doctor(_configs(kimi, tmp_path / "m"), engine="vllm", gpu="12.0").to_json()
    assert report["target"] == {"engine": "vllm", "engine_version": "0.15.1", "gpu": "sm120"}
    assert report["blockers"] == 1


USER_RULE = """\
doctor: 1
id: no-generation-config
severity: info
summary: there is no generation_config.json, so engines use their own sampling defaults
evidence:
  - {source: "our deployment notes", versions: any}
when:
  all_of:
    - engine: [vllm, sglang]
    - {file: generation_config.json, path: "", exists: false}
"""


def test_user_rules_directory(kimi, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "gen.yaml").write_text(USER_RULE)
    model = _configs(kimi, tmp_path / "m")
    (model / "generation_config.json").unlink()
    report = api.doctor(model, engine="sglang==0.5.0", rules=(str(rules),)).to_json()
    assert [f["rule"] for f in report["findings"]] == ["no-generation-config"]
    (rules / "gen.yaml").write_text(USER_RULE.replace("gpu", "x").replace(
        "engine: [vllm, sglang]", "gpu: blackwell"))
    with pytest.raises(RecipeError, match=r"gen\.yaml:9:\d+: gpu: cannot read"):
        api.doctor(model, rules=(str(rules),))


def test_cli_exit_codes_and_json(kimi, tmp_path):
    model = str(_configs(kimi, tmp_path / "m"))
    runner = CliRunner()
    blocked = runner.invoke(main, ["doctor", model, "--engine", "vllm==0.15.1", "--gpu", "sm120"])
    assert blocked.exit_code == 1
    assert "BLOCKER    fp8-kv-mla-vllm-sm120: the model declares an FP8 KV cache" in blocked.output
    assert "evidence: https://github.com/vllm-project/vllm/pull/34597" in blocked.output
    assert f"fix: modelpatch apply sm120-fp16-kv {model}" in blocked.output
    fine = runner.invoke(main, ["doctor", model, "--engine", "vllm==0.18.0", "--gpu", "sm120",
                                "--json"])
    assert fine.exit_code == 0
    assert json.loads(fine.output)["blockers"] == 0
    for bad in (["--in-place"], ["--fix", "--in-place", "-o", "x"]):
        assert runner.invoke(main, ["doctor", model, *bad]).exit_code == 2
    hub_in_place = runner.invoke(main, ["doctor", "hf://a/b", "--fix", "--in-place"])
    assert hub_in_place.exit_code == 2 and "cannot patch a hub model" in hub_in_place.output


def test_fix_in_place_is_revertible(kimi, tmp_path):
    model = tmp_path / "kimi"
    shutil.copytree(kimi, model)
    result = CliRunner().invoke(main, ["doctor", str(model), "--engine", "vllm==0.33.0",
                                       "--gpu", "sm86", "--fix", "--in-place"])
    assert result.exit_code == 0, result.output
    assert "fixed with sm120-fp16-kv, fix-eos" in result.output
    api.revert(model)                     # fix-eos
    api.revert(model)                     # sm120-fp16-kv
    assert (model / "config.json").read_bytes() == (kimi / "config.json").read_bytes()


def test_fix_writes_a_verified_variant_that_doctor_finds_clean(kimi, tmp_path):
    out = tmp_path / "fixed"
    result = CliRunner().invoke(main, ["doctor", str(kimi), "--engine", "vllm==0.15.1",
                                       "--gpu", "sm120", "--fix", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["blockers"] == 1
    assert report["fix"]["recipes"] == ["sm120-fp16-kv", "fix-eos"]   # blocker, warning
    assert report["fix"]["after"]["blockers"] == 0 and report["fix"]["after"]["findings"] == []
    assert api.verify(out).ok
    again = CliRunner().invoke(main, ["doctor", str(out), "--engine", "vllm==0.15.1",
                                      "--gpu", "sm120"])
    assert again.exit_code == 0 and "no findings" in again.output


def test_fix_stacks_several_recipes_on_one_variant(kimi, tmp_path):
    """On SM70 the NVFP4 weights and the FP8 KV cache both block: sm120-fp16-kv, then to-bf16
    stacked in place on the variant; the base is untouched and the result is clean."""
    import hashlib

    def digest(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()

    shard = kimi / "model-00001-of-00004.safetensors"
    before = digest(shard)
    out = tmp_path / "fixed"
    result = CliRunner().invoke(main, ["doctor", str(kimi), "--engine", "vllm==0.33.0",
                                       "--gpu", "sm70", "--fix", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["fix"]["recipes"] == ["sm120-fp16-kv", "to-bf16", "fix-eos"]
    assert report["fix"]["after"]["findings"] == []
    assert api.verify(out).ok
    assert digest(shard) == before
    assert not (out / "hf_quant_config.json").exists()
