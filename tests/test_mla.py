"""MLA as its consumers decide it (patcher/model/mla.py): configs written by transformers' own
config classes (``save_pretrained``), read back by transformers, against ``uses_mla``; the
restated class defaults against the installed transformers; doctor's rules and the recipes'
conditions reading the one answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patcher import api
from patcher.model.mla import (
    DEFAULT_KV_LORA_RANK,
    DEFAULT_TEXT_MODEL_TYPE,
    VLLM_MLA_MODEL_TYPES,
    uses_mla,
    with_model_facts,
)

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
             n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1)


def _class_rank(model_type: str):
    """``kv_lora_rank`` of the installed transformers' config class for ``model_type`` made
    with no arguments (as the class fills a config.json that leaves the key out)."""
    text = CONFIG_MAPPING[model_type]().get_text_config()
    return text.to_dict().get("kv_lora_rank")


def test_restated_defaults_are_the_installed_transformers_classes():
    """A transformers release that changes a class default (or adds one to an MLA family that
    had none) fails here until the table in patcher/model/mla.py follows."""
    checked = 0
    for model_type in sorted(VLLM_MLA_MODEL_TYPES | set(DEFAULT_KV_LORA_RANK)):
        read_as = "deepseek_v3" if model_type == "kimi_k2" else model_type
        if read_as not in CONFIG_MAPPING:
            continue
        assert DEFAULT_KV_LORA_RANK.get(model_type) == _class_rank(read_as), model_type
        checked += 1
    assert checked >= 10
    for parent, text_type in DEFAULT_TEXT_MODEL_TYPE.items():
        if parent in CONFIG_MAPPING:
            assert CONFIG_MAPPING[parent]().get_text_config().model_type == text_type


def _saved(tmp_path: Path, config, drop: tuple[str, ...] = ()) -> dict:
    """config.json as ``save_pretrained`` writes it, less ``drop`` (top level and text config):
    the hand-written hub configs that leave a key to its class default."""
    config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    doc = json.loads(path.read_text())
    for key in drop:
        doc.pop(key, None)
        if isinstance(doc.get("text_config"), dict):
            doc["text_config"].pop(key, None)
    path.write_text(json.dumps(doc))
    return doc


def _transformers_mla(path: Path) -> bool:
    """What vLLM's is_deepseek_mla reads: the text config's model type and kv_lora_rank."""
    text = AutoConfig.from_pretrained(path).get_text_config()
    return text.model_type in VLLM_MLA_MODEL_TYPES and \
        text.to_dict().get("kv_lora_rank") is not None


def _deepseek(**kw):
    return transformers.DeepseekV3Config(**{**SMALL, **kw})


@pytest.mark.parametrize("make, drop, expected", [
    (lambda: _deepseek(kv_lora_rank=32), (), True),
    (lambda: _deepseek(), ("kv_lora_rank",), True),          # the class default, 512
    (lambda: transformers.DeepseekV2Config(**SMALL), ("kv_lora_rank",), True),
    (lambda: transformers.LlamaConfig(hidden_size=32, num_attention_heads=4), (), False),
    (lambda: transformers.Qwen3Config(hidden_size=32, num_attention_heads=4), (), False),
    (lambda: CONFIG_MAPPING["kimi_k25"](text_config={**SMALL, "model_type": "deepseek_v3"}),
     ("kv_lora_rank",), True),
])
def test_uses_mla_agrees_with_transformers(tmp_path, make, drop, expected):
    doc = _saved(tmp_path, make(), drop)
    assert all(k not in doc for k in drop)
    assert _transformers_mla(tmp_path) is expected
    assert uses_mla(doc) is expected


def test_kimi_k2_is_read_as_deepseek_v3(tmp_path):
    """vLLM reads model_type kimi_k2 with transformers' DeepseekV3Config (its config registry)."""
    doc = _saved(tmp_path, _deepseek(), ("kv_lora_rank",))
    assert uses_mla({**doc, "model_type": "kimi_k2"})
    assert not uses_mla({**doc, "model_type": "kimi_k2", "kv_lora_rank": None})
    # transformers 5.25 refuses that null itself (a strict int field)
    with pytest.raises(Exception, match="kv_lora_rank"):
        _deepseek(kv_lora_rank=None)


def test_non_causal_deepseek_is_not_mla():
    """vLLM's use_mla: bidirectional DeepSeek variants take the non-MLA attention path."""
    assert not uses_mla({"model_type": "deepseek_v3", "is_causal": False})
    assert uses_mla({"model_type": "my_arch", "kv_lora_rank": 64})   # transformers backend


def test_model_facts_follow_the_json_reader():
    docs = {"config.json": {"model_type": "deepseek_v3"}}
    read = with_model_facts(docs.get)
    assert read("@model") == {"mla": True} and read("config.json") is docs["config.json"]
    assert with_model_facts(read) is read


# --- doctor and recipes read the same answer --------------------------------------------------

def _fp8_kv_deepseek(root: Path) -> Path:
    """A DeepSeek-V3 config.json from save_pretrained without kv_lora_rank, FP8 KV declared."""
    root.mkdir()
    doc = _saved(root, _deepseek(), ("kv_lora_rank",))
    doc["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8",
                                  "kv_cache_quant_algo": "FP8"}
    (root / "config.json").write_text(json.dumps(doc))
    return root


@pytest.mark.parametrize("gpu, engine, rule", [
    ("sm86", "vllm==0.33.0", "fp8-kv-mla-vllm-below-sm89"),
    ("sm120", "vllm==0.15.1", "fp8-kv-mla-vllm-sm120"),
])
def test_doctor_mla_rules_fire_on_the_class_default(tmp_path, gpu, engine, rule):
    model = _fp8_kv_deepseek(tmp_path / "m")
    found = {f.rule for f in api.doctor(model, engine=engine, gpu=gpu).findings}
    assert rule in found


def test_kv_scale_names_uses_the_mla_spelling_on_the_class_default(tmp_path):
    """kv_lora_rank left to its default: vLLM loads only k_proj.k_scale there, so the recipe
    writes that spelling (self_attn.k_scale would be dropped: "k_scale is not loaded")."""
    import torch
    from tensor_helpers import read_tensors, write_model
    from vllm_kv_names import attention_scale_params, vllm_loads

    config = _saved(tmp_path / "cfg", _deepseek(), ("kv_lora_rank",))
    tensors = {f"model.layers.{i}.self_attn.{w}_scale": torch.tensor([0.5], dtype=torch.float32)
               for i in range(2) for w in "kv"}
    base = write_model(tmp_path / "base", {"model.safetensors": tensors}, config, index=False)
    out = api.apply("kv-scale-names", base, out=tmp_path / "v").output
    params = attention_scale_params(2, mla=True)
    assert {vllm_loads(n, params) for n in read_tensors(out)} == params
