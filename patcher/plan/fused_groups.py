"""vLLM's fused layers: the Linear weights it loads into one parameter, which must share one
per-tensor (global) scale.

vLLM stacks these sibling projections into one layer (the ``packed_modules_mapping`` of its
model classes: ``qkv_proj`` of ``q_proj``/``k_proj``/``v_proj`` and ``gate_up_proj`` of
``gate_proj``/``up_proj`` in Llama, Qwen2/3, Mistral...; DeepSeek-V2/V3's ``fused_qkv_a_proj`` of
``q_a_proj``/``kv_a_proj_with_mqa``, built only when ``q_lora_rank`` is set, that is when
``q_a_proj`` exists; ``w13`` of a MoE expert's ``w1``/``w3`` in Mixtral and the ``gate_proj``/
``up_proj`` of each expert elsewhere) and keeps one global scale for the stack: the largest
(``weight global scale is different for parallel layers``), so a shard quantized against its own
smaller scale comes out scaled down. llm-compressor (``update_fused_layer_weight_global_scales``)
and ModelOpt's export (``preprocess_linear_fusion``) therefore give every member of a group the
scale of the group's largest magnitude; quantizing does the same (``planning._quantize``).
"""

from __future__ import annotations

from collections.abc import Iterable

#: projection -> the fused layer vLLM loads it into (siblings under one parent module)
FUSED_INTO = {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
    "q_a_proj": "fused_qkv_a_proj", "kv_a_proj_with_mqa": "fused_qkv_a_proj",
    "w1": "w13", "w3": "w13",
}


def fused_peers(weights: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """For each ``<parent>.<projection>.weight`` among ``weights`` whose projection vLLM fuses
    with siblings also among ``weights``: those siblings, in name order. Others are absent."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name in weights:
        stem, dot, suffix = name.rpartition(".")
        parent, _, leaf = stem.rpartition(".")
        if dot and suffix == "weight" and parent and leaf in FUSED_INTO:
            groups.setdefault((parent, FUSED_INTO[leaf]), []).append(name)
    return {name: tuple(sorted(n for n in members if n != name))
            for members in groups.values() if len(members) > 1 for name in members}
