"""The doctor's model rules, each with a model that triggers it and
one that does not, and the fixes their findings carry (params taken from the model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli import main
from patcher.model.safetensors_io import OutputTensor, encode_header


def _model(path: Path, tensors: dict[str, tuple[str, tuple]], **files) -> Path:
    """A one-shard model with zero-filled ``tensors`` (name -> (dtype, shape)) and JSON files."""
    path.mkdir()
    header, layout = encode_header([OutputTensor(n, d, s) for n, (d, s) in tensors.items()],
                                   {"format": "pt"})
    (path / "model.safetensors").write_bytes(header + bytes(sum(t.nbytes for t in layout)))
    files.setdefault("config.json", {"model_type": "llama"})
    for name, doc in files.items():
        (path / name.replace("__", ".")).write_text(json.dumps(doc, indent=2))
    return path


def _found(model, **target) -> dict:
    return {f["rule"]: f for f in api.doctor(model, **target).to_json()["findings"]}


# --- eos-inconsistent ----------------------------------------------------------------------

TOKENIZER = {"eos_token": "<|eot_id|>",
             "added_tokens_decoder": {"128001": {"content": "<|end_of_text|>"},
                                      "128009": {"content": "<|eot_id|>"}}}


def _eos_model(path, config_eos, generation_eos, tokenizer=TOKENIZER):
    return _model(path, {"model.embed_tokens.weight": ("BF16", (4, 2))},
                  **{"config.json": {"model_type": "llama", "eos_token_id": config_eos},
                     "generation_config.json": {"eos_token_id": generation_eos},
                     "tokenizer_config.json": tokenizer})


def test_eos_inconsistent_fires_and_its_fix_makes_the_model_clean(tmp_path):
    # vllm#4180's shape: the tokenizer's EOS (<|eot_id|>) is not a stop id in the configs
    model = _eos_model(tmp_path / "m", 128001, 128001)
    finding = _found(model)["eos-inconsistent"]
    assert finding["severity"] == "warning"
    assert finding["details"] == ["tokenizer_config.json eos_token '<|eot_id|>' (id 128009) is "
                                  "not among generation_config.json eos_token_id [128001]: "
                                  "generation does not stop at it"]
    assert finding["fix"] == {"recipe": "fix-eos", "params": {
        "eos_token_id": [128009, 128001], "eos_token": "<|eot_id|>"}}
    out = tmp_path / "fixed"
    result = CliRunner().invoke(main, ["doctor", str(model), "--fix", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["fix"]["after"]["findings"] == []
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == \
        [128009, 128001]
    assert api.verify(out).ok


@pytest.mark.parametrize("config_eos, generation_eos", [
    (128009, [128001, 128009]),          # every id a stop id, the tokenizer's among them
    ([128001, 128009], [128009, 128001]),
])
def test_eos_consistent_does_not_fire(tmp_path, config_eos, generation_eos):
    assert "eos-inconsistent" not in _found(_eos_model(tmp_path / "m", config_eos,
                                                       generation_eos))


def test_eos_config_id_missing_from_generation_config_fires(tmp_path):
    model = _eos_model(tmp_path / "m", [128001, 2], [128001, 128009])
    assert _found(model)["eos-inconsistent"]["details"] == [
        "config.json eos_token_id [128001, 2] is not all in generation_config.json eos_token_id "
        "[128001, 128009] (generation follows generation_config.json)"]


# --- quantization ignore lists ---------------------------------------------------------------

def _quantized(path, ignore, layer0_quantized=True):
    tensors = {"lm_head.weight": ("BF16", (8, 4)), "model.embed_tokens.weight": ("BF16", (8, 4))}
    for layer in range(2):
        for proj in ("q_proj", "k_proj"):
            base = f"model.layers.{layer}.self_attn.{proj}"
            if layer == 0 and not layer0_quantized:
                tensors[f"{base}.weight"] = ("BF16", (4, 4))
            else:
                tensors[f"{base}.weight"] = ("F8_E4M3", (4, 4))
                tensors[f"{base}.weight_scale"] = ("F32", ())
    config = {"model_type": "llama", "quantization_config": {
        "quant_method": "compressed-tensors", "ignore": ignore}}
    return _model(path, tensors, **{"config.json": config})


def test_ignore_entry_matching_no_module_fires(tmp_path):
    model = _quantized(tmp_path / "m", ["lm_head", "re:.*vision_tower.*", "model.visual"])
    finding = _found(model)["quant-ignore-unmatched"]
    assert finding["details"] == ["re:.*vision_tower.*", "model.visual"]
    assert finding["fix"] is None
    ok = _quantized(tmp_path / "ok", ["lm_head", "re:.*layers\\.1\\.self_attn\\.q_proj"])
    assert "quant-ignore-unmatched" not in _found(ok)


def test_unquantized_module_no_entry_covers_fires(tmp_path):
    model = _quantized(tmp_path / "m", ["lm_head"], layer0_quantized=False)
    finding = _found(model)["quant-unquantized-uncovered"]
    assert finding["details"] == ["model.layers.0.self_attn.k_proj",
                                  "model.layers.0.self_attn.q_proj"]
    covered = _quantized(tmp_path / "ok", ["lm_head", "re:model\\.layers\\.0\\..*"],
                         layer0_quantized=False)
    assert "quant-unquantized-uncovered" not in _found(covered)
    assert "quant-unquantized-uncovered" not in _found(_quantized(tmp_path / "q", ["lm_head"]))


# --- KV-cache scale names on SGLang ----------------------------------------------------------

def _qwen2(path, scale_name):
    tensors = {"model.layers.0.self_attn.k_proj.weight": ("BF16", (4, 4)),
               f"model.layers.0.self_attn.{scale_name}": ("F32", ())}
    return _model(path, tensors, **{"config.json": {"model_type": "qwen2",
                                                    "architectures": ["Qwen2ForCausalLM"]}})


@pytest.mark.parametrize("scale, engine, fires", [
    ("k_proj.k_scale", "sglang==0.5.9", True),       # ModelOpt naming
    ("qkv_proj.k_scale", "sglang==0.5.9", True),     # llm-compressor's fused naming
    ("kv_scale", "sglang==0.5.9", True),             # deprecated
    ("attn.k_scale", "sglang==0.5.9", False),        # the name the model registers
    ("k_proj.k_scale", "vllm==0.33.0", False),       # vLLM remaps it
])
def test_kv_scale_names_sglang_rule(tmp_path, scale, engine, fires):
    found = _found(_qwen2(tmp_path / "m", scale), engine=engine)
    assert ("kv-scale-names-sglang" in found) is fires
    if fires:
        assert found["kv-scale-names-sglang"]["fix"] is None


def test_kv_scale_names_rule_needs_the_engine(tmp_path):
    report = api.doctor(_qwen2(tmp_path / "m", "k_proj.k_scale")).to_json()
    assert {"rule": "kv-scale-names-sglang", "needs": ["engine"]} in report["not_checked"]


# --- MTP layers ------------------------------------------------------------------------------

def _deepseek(path, mtp_layers: int, nextn: int):
    tensors = {f"model.layers.{i}.mlp.down_proj.weight": ("BF16", (4, 4))
               for i in range(2 + mtp_layers)}
    return _model(path, tensors, **{"config.json": {
        "model_type": "deepseek_v3", "num_hidden_layers": 2, "num_nextn_predict_layers": nextn}})


def test_mtp_layers_rule_is_info_and_left_out_of_fix(tmp_path):
    model = _deepseek(tmp_path / "m", 1, 1)
    finding = _found(model)["mtp-layers-unused"]
    assert (finding["severity"], finding["details"], finding["fix"]) == \
        ("info", [2], {"recipe": "strip-mtp"})
    result = CliRunner().invoke(main, ["doctor", str(model), "--fix", "--json"])
    assert result.exit_code == 0 and "fix" not in json.loads(result.output)   # info: not applied
    assert "mtp-layers-unused" not in _found(_deepseek(tmp_path / "n", 0, 1))
    assert "mtp-layers-unused" not in _found(_deepseek(tmp_path / "z", 1, 0))


# --- fixes wired to the earlier rules ----------------------------------------------------------

def test_lm_head_rules_fix_with_the_tie_recipes(tmp_path):
    tied = _model(tmp_path / "t", {"model.embed_tokens.weight": ("BF16", (8, 4)),
                                   "lm_head.weight": ("BF16", (8, 4))},
                  **{"config.json": {"model_type": "llama", "tie_word_embeddings": True}})
    assert _found(tied)["tied-lm-head-ignored"]["fix"] == {"recipe": "tie-embeddings"}
    out = tmp_path / "t-fixed"
    result = CliRunner().invoke(main, ["doctor", str(tied), "--fix", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert _found(out) == {}
    untied = _model(tmp_path / "u", {"model.embed_tokens.weight": ("BF16", (8, 4))},
                    **{"config.json": {"model_type": "llama", "tie_word_embeddings": False}})
    assert _found(untied)["untied-lm-head-missing"]["fix"] == {"recipe": "untie-embeddings"}


def test_remote_code_fix_keeps_the_native_class(tmp_path):
    model = _model(tmp_path / "m", {"model.embed_tokens.weight": ("BF16", (8, 4))},
                   **{"config.json": {"model_type": "llama",
                                      "architectures": ["LlamaForCausalLM"],
                                      "auto_map": {"AutoConfig": "configuration_x.XConfig"}}})
    assert _found(model)["remote-code-with-native-class"]["fix"] == {
        "recipe": "no-remote-code",
        "params": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}}
    custom = json.loads((model / "config.json").read_text())
    custom["architectures"] = ["MyOwnForCausalLM"]
    (model / "config.json").write_text(json.dumps(custom))
    assert _found(model)["remote-code-with-native-class"]["fix"] is None


def test_a_rule_fix_takes_recipe_params_and_params_from_only(tmp_path):
    from patcher.doctor.rules import load_rules
    from patcher.errors import RecipeError

    rules = tmp_path / "rules"
    rules.mkdir()
    rule = ("doctor: 1\nid: mine\nseverity: info\nsummary: s\n"
            "evidence: [{source: x, versions: any}]\nfix: FIX\n"
            "when: {file: config.json, path: /x, exists: true}\n")
    (rules / "r.yaml").write_text(rule.replace("FIX", "{recipe: fix-eos, params_from: /eos/fix}"))
    assert load_rules((str(rules),))[-1].fix == {"recipe": "fix-eos", "params_from": "/eos/fix"}
    for bad in ("{recipe: fix-eos, params_from: eos}", "{recipe: fix-eos, with: 1}",
                "{recipe: fix-eos, params: [1]}"):
        (rules / "r.yaml").write_text(rule.replace("FIX", bad))
        with pytest.raises(RecipeError, match="fix is {recipe: NAME}"):
            load_rules((str(rules),))
