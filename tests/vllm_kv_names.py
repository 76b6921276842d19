"""How vLLM 0.33 loads a checkpoint's KV-cache scale, for the tests that cannot import vLLM.

Restated from vLLM 0.33.0's ``maybe_remap_kv_scale_name`` (model_executor/model_loader/
weight_utils.py), the remap every loader we touch calls (Llama, Qwen2/3, Mixtral through
models/utils.py's AutoWeightsLoader; DeepSeek-V2/V3 in deepseek_v2.py's load_weights), and checked
against the real function by integration/consumer_matrix.py:

- a name that is a parameter already is kept;
- ``.kv_scale`` -> ``.attn.k_scale`` (deprecated);
- ``.self_attn.{k,v}_proj.{k,v}_scale`` -> ``.self_attn.<attn>.{k,v}_scale``, where ``<attn>`` is
  ``mla_attn.mla_attn`` if any parameter name holds ``mla_attn`` (an MLA model), else ``attn``;
- ``.self_attn.qkv_proj.{k,v}_scale`` -> ``.self_attn.attn.{k,v}_scale``;
- any other ``.{q,k,v}_scale`` -> ``.attn.{q,k,v}_scale``;
- a remapped name that is not a parameter is dropped ("k_scale is not loaded").
"""

from __future__ import annotations

import re

_PATTERNS = (
    (r"\.self_attn\.([kv])_proj\.([kv])_scale$", r".self_attn.{attn}.\2_scale"),
    (r"\.self_attn\.qkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),
    (r"\.([qkv])_scale$", r".attn.\1_scale"),
)


def attention_scale_params(layers: int, mla: bool) -> set[str]:
    """The KV-scale parameter names of the attention of vLLM's model class: MLA's
    (DeepseekV2Attention's mla_attn wrapper holding an MLAAttention) or the others'."""
    attn = "mla_attn.mla_attn" if mla else "attn"
    return {f"model.layers.{i}.self_attn.{attn}.{w}_scale" for i in range(layers)
            for w in ("k", "v")}


def vllm_loads(name: str, params: set[str]) -> str | None:
    """The parameter vLLM 0.33 loads checkpoint tensor ``name`` into, or None if it drops it."""
    if name in params:
        return name
    if name.endswith(".kv_scale"):
        mapped = name.replace(".kv_scale", ".attn.k_scale")
        return mapped if mapped in params else None
    attn = "mla_attn.mla_attn" if any("mla_attn" in p for p in params) else "attn"
    for pattern, replacement in _PATTERNS:
        if re.search(pattern, name):
            mapped = re.sub(pattern, replacement.replace("{attn}", attn), name)
            return mapped if mapped in params else None
    return name
