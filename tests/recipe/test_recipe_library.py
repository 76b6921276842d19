"""The built-in recipe library: each recipe on a fixture saved by transformers'
save_pretrained, loaded back by transformers with no missing or unexpected keys, with
identical logits where the recipe must not change the math."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tensor_helpers import transformers_logits

from patcher import api
from patcher.errors import GuardRefused, InputError

QWEN3 = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             max_position_embeddings=256)


def _load(directory: Path):
    """(model, loading info) from transformers; info lists missing/unexpected keys."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16,
                                                output_loading_info=True)


def _clean(info) -> bool:
    return not info["missing_keys"] and not info["unexpected_keys"]


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny Qwen3ForCausalLM saved by transformers: untied and tied."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = {}
    root = tmp_path_factory.mktemp("qwen3")
    for tied in (False, True):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3, tie_word_embeddings=tied))
        path = root / ("tied" if tied else "untied")
        model.to(torch.bfloat16).save_pretrained(path)
        out["tied" if tied else "untied"] = path
    return out


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


# --------------------------------------------------------------------------------- yarn

@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "rope_theta"])
def test_yarn_derives_rope_scaling_and_context(qwen3_dirs, tmp_path, legacy):
    base = _copy(qwen3_dirs["untied"], tmp_path / "base")
    if legacy:      # the form Qwen's hub configs have: rope_theta and rope_scaling: null
        cfg = _json(base / "config.json")
        cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
        cfg["rope_scaling"] = None
        (base / "config.json").write_text(json.dumps(cfg))
    out = api.apply("yarn", base, out=tmp_path / "v", params={"factor": "4"}).output
    cfg = _json(out / "config.json")
    assert cfg["max_position_embeddings"] == 1024
    assert cfg["rope_scaling"] == {"rope_type": "yarn", "factor": 4,
                                   "original_max_position_embeddings": 256}
    if not legacy:
        assert cfg["rope_parameters"]["rope_type"] == "yarn"
    model, info = _load(out)
    assert _clean(info)
    rope = model.config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == \
        ("yarn", 4, 256)
    with pytest.raises(GuardRefused, match="already has rope_scaling"):
        api.plan("yarn", out)


# ----------------------------------------------------------------------------- strip-mtp

@pytest.fixture(scope="module")
def deepseek_with_mtp(tiny_bf16_dir, tmp_path_factory) -> Path:
    """The tiny DeepseekV3 (3 layers) with one MTP layer added as layer 3, as DeepSeek-V3 stores
    layer 61: a decoder layer plus enorm, hnorm, eh_proj, shared_head."""
    base = _copy(tiny_bf16_dir, tmp_path_factory.mktemp("mtp") / "m")
    index = _json(base / "model.safetensors.index.json")
    layer2 = {}
    for shard in sorted(set(index["weight_map"].values())):
        layer2.update({k: v for k, v in load_file(base / shard).items()
                       if k.startswith("model.layers.2.")})
    mtp = {k.replace("model.layers.2.", "model.layers.3."): v.clone() for k, v in layer2.items()}
    h = 64
    mtp.update({"model.layers.3.enorm.weight": torch.ones(h, dtype=torch.bfloat16),
                "model.layers.3.hnorm.weight": torch.ones(h, dtype=torch.bfloat16),
                "model.layers.3.eh_proj.weight": torch.zeros(h, 2 * h, dtype=torch.bfloat16),
                "model.layers.3.shared_head.norm.weight": torch.ones(h, dtype=torch.bfloat16)})
    save_file(mtp, base / "model-mtp.safetensors", metadata={"format": "pt"})
    index["weight_map"].update(dict.fromkeys(mtp, "model-mtp.safetensors"))
    index["metadata"]["total_size"] += sum(t.numel() * t.element_size() for t in mtp.values())
    (base / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg = _json(base / "config.json")
    cfg["num_nextn_predict_layers"] = 1
    (base / "config.json").write_text(json.dumps(cfg, indent=2))
    return base


def test_strip_mtp_drops_the_layers_past_num_hidden_layers(deepseek_with_mtp, tiny_bf16_dir,
                                                           tmp_path):
    _, before = _load(deepseek_with_mtp)
    assert any(".layers.3." in k for k in before["unexpected_keys"])   # the need
    out = api.apply("strip-mtp", deepseek_with_mtp, out=tmp_path / "v").output
    assert _json(out / "config.json")["num_nextn_predict_layers"] == 0
    index = _json(out / "model.safetensors.index.json")["weight_map"]
    assert not [k for k in index if k.startswith("model.layers.3.")]
    assert [k for k in index if k.startswith("model.layers.2.")]
    _, info = _load(out)
    assert _clean(info)
    assert torch.equal(transformers_logits(out), transformers_logits(tiny_bf16_dir))
    with pytest.raises(GuardRefused, match="declares no MTP layers"):
        api.plan("strip-mtp", out)


# ----------------------------------------------------------------------- tie / untie

def test_untie_embeddings_copies_the_embedding_as_the_head(qwen3_dirs, tmp_path):
    base = qwen3_dirs["tied"]
    assert "lm_head.weight" not in load_file(base / "model.safetensors")
    out = api.apply("untie-embeddings", base, out=tmp_path / "v").output
    tensors = load_file(out / "model.safetensors")
    assert torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    assert _json(out / "config.json")["tie_word_embeddings"] is False
    _, info = _load(out)
    assert _clean(info)
    assert torch.equal(transformers_logits(out), transformers_logits(base))
    with pytest.raises(GuardRefused, match="already has its own lm_head.weight"):
        api.plan("untie-embeddings", out)


def test_untie_fixes_a_config_that_claims_a_head_the_shards_lack(qwen3_dirs, tmp_path):
    """QwenLM/Qwen3-VL-Embedding#89: tie_word_embeddings false, no lm_head.weight."""
    base = _copy(qwen3_dirs["tied"], tmp_path / "base")
    cfg = _json(base / "config.json")
    cfg["tie_word_embeddings"] = False
    (base / "config.json").write_text(json.dumps(cfg))
    _, broken = _load(base)
    assert "lm_head.weight" in broken["missing_keys"]
    out = api.apply("untie-embeddings", base, out=tmp_path / "v").output
    _, info = _load(out)
    assert _clean(info)


def test_tie_embeddings_drops_the_dead_head_of_a_tied_model(qwen3_dirs, tmp_path):
    base = _copy(qwen3_dirs["tied"], tmp_path / "base")
    tensors = load_file(base / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    out = api.apply("tie-embeddings", base, out=tmp_path / "v").output
    assert "lm_head.weight" not in load_file(out / "model.safetensors")
    _, info = _load(out)
    assert _clean(info)
    assert torch.equal(transformers_logits(out), transformers_logits(qwen3_dirs["tied"]))
    with pytest.raises(GuardRefused, match="does not set tie_word_embeddings: true"):
        api.plan("tie-embeddings", qwen3_dirs["untied"])


# ------------------------------------------------------------------------------ fix-eos

def test_fix_eos_writes_one_answer_into_all_three_files(qwen3_dirs, tmp_path):
    base = _copy(qwen3_dirs["untied"], tmp_path / "base")
    (base / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|end_of_text|>", "model_max_length": 256, "added_tokens_decoder": {
            "7": {"content": "<|eot_id|>", "special": True},
            "9": {"content": "<|end_of_text|>", "special": True}}}))
    with pytest.raises(InputError, match="needs parameter 'eos_token_id'"):
        api.plan("fix-eos", base)
    out = api.apply("fix-eos", base, out=tmp_path / "v",
                    params={"eos_token_id": "7,9", "eos_token": "<|eot_id|>"}).output
    assert _json(out / "config.json")["eos_token_id"] == [7, 9]
    assert _json(out / "generation_config.json")["eos_token_id"] == [7, 9]
    assert _json(out / "tokenizer_config.json")["eos_token"] == "<|eot_id|>"
    from transformers import GenerationConfig

    assert GenerationConfig.from_pretrained(out).eos_token_id == [7, 9]
    _, info = _load(out)
    assert _clean(info)
    assert torch.equal(transformers_logits(out), transformers_logits(base))
    with pytest.raises(GuardRefused, match="no tokenizer_config.json"):
        api.plan("fix-eos", qwen3_dirs["untied"],
                 options={"params": {"eos_token_id": [1], "eos_token": "x"}})


# -------------------------------------------------------------------- drop-consolidated

def test_drop_consolidated_removes_the_duplicate(tiny_bf16_dir, tmp_path):
    base = _copy(tiny_bf16_dir, tmp_path / "base")
    index = _json(base / "model.safetensors.index.json")
    every = {}
    for shard in sorted(set(index["weight_map"].values())):
        every.update(load_file(base / shard))
    save_file(every, base / "consolidated.safetensors", metadata={"format": "pt"})
    out = api.apply("drop-consolidated", base, out=tmp_path / "v").output
    assert not (out / "consolidated.safetensors").exists()
    _, info = _load(out)
    assert _clean(info)
    assert torch.equal(transformers_logits(out), transformers_logits(tiny_bf16_dir))
    single = tmp_path / "single"            # consolidated.safetensors is its only copy
    single.mkdir()
    shutil.copy(base / "config.json", single / "config.json")
    shutil.copy(base / "consolidated.safetensors", single / "consolidated.safetensors")
    with pytest.raises(GuardRefused, match="no model.safetensors.index.json"):
        api.plan("drop-consolidated", single)


# ---------------------------------------------------------------------- sampling-defaults

def test_sampling_defaults_neutral_or_given(qwen3_dirs, tmp_path):
    base = _copy(qwen3_dirs["untied"], tmp_path / "base")
    gen = _json(base / "generation_config.json")
    gen.update(temperature=0.7, top_p=0.8, top_k=20, do_sample=True)
    (base / "generation_config.json").write_text(json.dumps(gen))
    out = api.apply("sampling-defaults", base, out=tmp_path / "v").output
    got = _json(out / "generation_config.json")
    assert (got["temperature"], got["top_p"], got["top_k"], got["min_p"],
            got["repetition_penalty"]) == (1.0, 1.0, 0, 0.0, 1.0)
    given = api.apply("sampling-defaults", base, out=tmp_path / "w",
                      params={"temperature": "0.6", "top_p": "0.95"}).output
    from transformers import GenerationConfig

    config = GenerationConfig.from_pretrained(given)
    assert (config.temperature, config.top_p, config.top_k) == (0.6, 0.95, 0)
    _, info = _load(given)
    assert _clean(info)


# ------------------------------------------------------------------------ no-remote-code

def test_no_remote_code_loads_natively(qwen3_dirs, tmp_path):
    base = _copy(qwen3_dirs["untied"], tmp_path / "base")
    cfg = _json(base / "config.json")
    cfg.update(model_type="custom_qwen", architectures=["CustomQwenForCausalLM"],
               auto_map={"AutoConfig": "configuration_custom.CustomConfig",
                         "AutoModelForCausalLM": "modeling_custom.CustomQwenForCausalLM"})
    (base / "config.json").write_text(json.dumps(cfg))
    (base / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tok.T", None]}, "eos_token": "x"}))
    with pytest.raises(InputError, match="needs parameter 'model_type'"):
        api.plan("no-remote-code", base)
    out = api.apply("no-remote-code", base, out=tmp_path / "v",
                    params={"model_type": "qwen3", "architectures": "Qwen3ForCausalLM"}).output
    cfg = _json(out / "config.json")
    assert "auto_map" not in cfg and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert "auto_map" not in _json(out / "tokenizer_config.json")
    _, info = _load(out)            # no trust_remote_code
    assert _clean(info)
    assert torch.equal(transformers_logits(out), transformers_logits(qwen3_dirs["untied"]))
    with pytest.raises(GuardRefused, match="has no auto_map"):
        api.plan("no-remote-code", out, options={"params": {"model_type": "qwen3",
                                                            "architectures": ["X"]}})


# ----------------------------------------------------------------------------- text-only

@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory) -> Path:
    """A tiny LlavaForConditionalGeneration (Llama text model, CLIP vision tower) saved by
    transformers: tensors under language_model., vision_tower., multi_modal_projector."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    text = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, image_size=28, patch_size=14,
                              projection_dim=16)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(LlavaConfig(text_config=text, vision_config=vision,
                                                      image_token_index=120))
    path = tmp_path_factory.mktemp("llava") / "m"
    model.to(torch.bfloat16).save_pretrained(path)
    return path


def test_text_only_extracts_the_text_model(llava_dir, tmp_path):
    from transformers import LlavaForConditionalGeneration

    out = api.apply("text-only", llava_dir, out=tmp_path / "v",
                    params={"architectures": "LlamaForCausalLM"}).output
    cfg = _json(out / "config.json")
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert "vision_config" not in cfg and "text_config" not in cfg
    names = load_file(out / "model.safetensors")
    assert not [n for n in names if n.startswith(("vision_tower.", "multi_modal_projector."))]
    model, info = _load(out)
    assert type(model).__name__ == "LlamaForCausalLM" and _clean(info)
    wrapper = LlavaForConditionalGeneration.from_pretrained(llava_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = wrapper(input_ids=torch.arange(12).reshape(1, 12)).logits
    assert torch.equal(transformers_logits(out), expected)
    with pytest.raises(GuardRefused, match="not a multimodal wrapper"):
        api.plan("text-only", out, options={"params": {"architectures": ["X"]}})


def test_text_only_keeps_quantization_config_and_fixes_both_ignore_lists(llava_dir, tmp_path):
    base = _copy(llava_dir, tmp_path / "base")
    ignore = ["language_model.lm_head", "vision_tower.encoder.layers.0.mlp.fc1",
              "multi_modal_projector.linear_1", "language_model.model.layers.0.mlp.gate"]
    cfg = _json(base / "config.json")
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "ignore": ignore}
    (base / "config.json").write_text(json.dumps(cfg))
    (base / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "FP8", "exclude_modules": ignore}}))
    plan = api.plan("text-only", base, options={"params": {"architectures": ["LlamaForCausalLM"]}})
    files = {f.path: f for f in plan.files}
    new_cfg = json.loads(files["config.json"].content)
    want = ["lm_head", "model.layers.0.mlp.gate"]
    assert new_cfg["quantization_config"] == {"quant_method": "compressed-tensors",
                                              "ignore": want}
    hf_quant = json.loads(files["hf_quant_config.json"].content)
    assert hf_quant["quantization"]["exclude_modules"] == want


def test_text_only_removes_wildcard_and_regex_vision_entries(llava_dir, tmp_path):
    """ModelOpt writes `vision_tower*`, `*mm_projector*`; compressed-tensors `re:` entries."""
    from patcher.doctor.facts import ignore_facts
    from patcher.model.model_dir import ModelDir

    base = _copy(llava_dir, tmp_path / "base")
    vision = ["vision_tower*", "model.vision_tower*", "*mm_projector*", "mm_projector*",
              "multi_modal_projector*", "re:.*vision_tower.*", r"re:model\.vision_tower\..*",
              r"re:^multi_modal_projector\..*"]
    kept = ["language_model.lm_head", r"re:.*(vision_tower|lm_head).*"]
    cfg = _json(base / "config.json")
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "ignore": vision + kept}
    (base / "config.json").write_text(json.dumps(cfg))
    out = api.apply("text-only", base, out=tmp_path / "v",
                    params={"architectures": "LlamaForCausalLM"}).output
    assert _json(out / "config.json")["quantization_config"]["ignore"] == \
        ["lm_head", r"re:.*(vision_tower|lm_head).*"]
    assert ignore_facts(ModelDir.open(out))["unmatched"] == []


def test_fix_eos_refuses_an_eos_token_the_vocabulary_lacks(qwen3_dirs, tmp_path):
    from click.testing import CliRunner

    from patcher.cli import main

    base = _copy(qwen3_dirs["untied"], tmp_path / "base")
    (base / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|end_of_text|>", "added_tokens_decoder": {
            "9": {"content": "<|end_of_text|>", "special": True}}}))
    (base / "tokenizer.json").write_text(json.dumps(
        {"added_tokens": [{"id": 9, "content": "<|end_of_text|>"}],
         "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}))
    result = CliRunner().invoke(main, ["plan", "fix-eos", "--set", "eos_token_id=7,9",
                                       "--set", "eos_token=<|eot_id|>", str(base)])
    assert result.exit_code == 2
    assert result.output.startswith("modelpatch: error: ")
    assert "parameter eos_token: '<|eot_id|>' is not a token of the model's vocabulary" \
        in result.output
    assert len(result.output.strip().splitlines()) == 1
    for known in ("<|end_of_text|>", "b"):     # an added token, a vocabulary entry
        api.plan("fix-eos", base, options={"params": {"eos_token_id": [9], "eos_token": known}})
    (base / "tokenizer.json").unlink()
    (base / "tokenizer_config.json").write_text(json.dumps({"eos_token": "x"}))
    with pytest.raises(InputError, match="cannot be checked against the vocabulary"):
        api.plan("fix-eos", base, options={"params": {"eos_token_id": [9], "eos_token": "x"}})


def test_strip_mtp_refuses_a_config_that_declares_mtp_without_its_tensors(tiny_bf16_dir,
                                                                         tmp_path):
    base = _copy(tiny_bf16_dir, tmp_path / "base")
    cfg = _json(base / "config.json")
    cfg["num_nextn_predict_layers"] = 1
    (base / "config.json").write_text(json.dumps(cfg, indent=2))
    with pytest.raises(GuardRefused, match="no tensors of the MTP layers"):
        api.plan("strip-mtp", base)
