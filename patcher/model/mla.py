"""Whether a model's attention is MLA (DeepSeek-V2/V3-style multi-head latent attention) as its
consumers decide it, from config.json alone: the one answer every doctor rule and recipe
condition reads (``@model`` ``/mla``).

config.json is not the whole config its readers see. transformers builds a config class for the
``model_type`` and fills every key the file leaves out with the class default, and
``DeepseekV3Config`` (also Kimi-K2's, which vLLM maps to it) defaults ``kv_lora_rank`` to 512: a
DeepSeek-V3 config.json without the key is MLA to transformers and to vLLM. vLLM 0.33 decides MLA
in ``transformers_utils/model_arch_config_convertor.py`` ``is_deepseek_mla`` on the text config
(``config.get_text_config()``: ``text_config`` of a multimodal model): its ``model_type`` is one
of a list of MLA families and its ``kv_lora_rank`` is not None (for DeepSeek-V4's compressed
layout, ``head_dim``); ``ModelConfig.use_mla`` then refuses a non-causal model
(``is_causal: false``). A model type outside the list with an explicit ``kv_lora_rank`` counts
too: that is how vLLM's transformers backend decides it.

The tables below restate transformers' class defaults and vLLM's list; tests/test_mla.py
checks them against the installed transformers' own config classes.
"""

from __future__ import annotations

from typing import Any, Callable

#: vLLM 0.33 ``is_deepseek_mla``: the text config model types whose attention is MLA.
VLLM_MLA_MODEL_TYPES = frozenset((
    "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41",
    "dots3_note", "deepseek_mtp", "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa",
    "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash",
    "pangu_ultra_moe", "pangu_ultra_moe_mtp", "bailing_hybrid", "bailing_hybrid_mtp",
    "bailing_hybrid_v3_mtp", "hy_v4", "hy_v4_mtp"))

#: ``kv_lora_rank`` of the config class a reader builds for a model type, when config.json
#: leaves it out (transformers 5.25's classes; kimi_k2 and deepseek_v32 are read by vLLM with
#: transformers' DeepseekV3Config). A type missing here gets no default.
DEFAULT_KV_LORA_RANK = {
    "axk1": 512, "deepseek_v2": 512, "deepseek_v3": 512, "deepseek_v32": 512, "kimi_k2": 512,
    "dots3_note": 512, "glm5_next": 512, "glm5_next_text": 512, "glm_moe_dsa": 512,
    "glm4_moe_lite": 512, "kimi_linear": 512, "longcat_flash": 512, "bailing_hybrid": 512,
    "hy_v4": 512,
}

#: Composite configs whose class builds a text config of this model type when config.json's
#: ``text_config`` leaves ``model_type`` out (or is absent): transformers' Kimi_K25Config.
DEFAULT_TEXT_MODEL_TYPE = {"kimi_k25": "deepseek_v3"}

#: Where transformers' ``get_text_config()`` looks for a nested text config.
_TEXT_CONFIG_KEYS = ("text_encoder", "decoder", "generator", "text_config")


def text_config(config: dict) -> dict:
    """The text config a reader uses: the one nested config of ``_TEXT_CONFIG_KEYS`` that is
    present, else ``config`` itself; its ``model_type`` filled in for a known composite."""
    nested = [config[k] for k in _TEXT_CONFIG_KEYS if isinstance(config.get(k), dict)]
    parent_type = config.get("model_type")
    implied = DEFAULT_TEXT_MODEL_TYPE.get(parent_type) if isinstance(parent_type, str) else None
    text = nested[0] if len(nested) == 1 else ({} if implied else config)
    if implied and not isinstance(text.get("model_type"), str):
        text = {**text, "model_type": implied}
    return text


def kv_lora_rank(text: dict) -> Any:
    """``kv_lora_rank`` as the config class reads it: the file's value (null included), else
    the class default for its model type (None when there is none)."""
    if "kv_lora_rank" in text:
        return text["kv_lora_rank"]
    model_type = text.get("model_type")
    return DEFAULT_KV_LORA_RANK.get(model_type) if isinstance(model_type, str) else None


def uses_mla(config: Any) -> bool:
    """Whether vLLM (and transformers) run this config.json's attention as MLA."""
    if not isinstance(config, dict):
        return False
    text = text_config(config)
    if text.get("is_causal", True) is False:
        return False
    model_type = text.get("model_type")
    if isinstance(model_type, str) and model_type in VLLM_MLA_MODEL_TYPES:
        if text.get("compress_ratios"):
            return text.get("head_dim") is not None
        return kv_lora_rank(text) is not None
    return text.get("kv_lora_rank") is not None


#: The virtual JSON file that conditions read model facts from.
MODEL_FACTS = "@model"


def with_model_facts(read_json: Callable[[str], Any]) -> Callable[[str], Any]:
    """``read_json`` that also serves ``@model``: ``{"mla": ...}`` computed from config.json as
    ``read_json`` reads it (so after the recipes bound before, for several applied as one)."""
    if getattr(read_json, "serves_model_facts", False):
        return read_json

    def read(file: str) -> Any:
        if file == MODEL_FACTS:
            return {"mla": uses_mla(read_json("config.json"))}
        return read_json(file)

    read.serves_model_facts = True      # type: ignore[attr-defined]
    return read
