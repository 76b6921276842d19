"""The layout of a synthetic checkpoint (synth.py): its dimensions, every tensor's name, dtype
and shape in checkpoint order, and how they are packed into shards."""

from __future__ import annotations

import math
from dataclasses import dataclass

ITEMSIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1}
KV_SCALE_SUFFIXES = ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")
# Companion tensors: they stay in the shard of the weight they belong to.
COMPANION_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale", ".weight_scale_inv")

Spec = tuple[str, str, tuple[int, ...]]


@dataclass(frozen=True)
class Dims:
    """A scaled-down DeepSeek-V3 (real: 7168 hidden, 128 heads, 1536/512 ranks, 256 experts)."""

    hidden: int
    heads: int
    q_rank: int
    kv_rank: int
    nope: int
    rope: int
    v_dim: int
    inter: int          # dense MLP of layer 0 (first_k_dense_replace = 1)
    moe_inter: int
    experts: int
    vocab: int


TIERS = (   # largest first; the first whose decoder layer fits half a shard is used
    # DeepSeek-V3's own matrix shapes (8 of its 256 experts, a quarter of its vocabulary): a
    # decoder layer is 0.58 GB in FP8, so shards of 1.2 GB or more (e.g. 6 GB in 5 shards)
    Dims(hidden=7168, heads=128, q_rank=1536, kv_rank=512, nope=128, rope=64, v_dim=128,
         inter=18432, moe_inter=2048, experts=8, vocab=32768),
    Dims(hidden=2048, heads=16, q_rank=768, kv_rank=256, nope=128, rope=64, v_dim=128,
         inter=4096, moe_inter=1024, experts=24, vocab=32768),
    Dims(hidden=1024, heads=8, q_rank=384, kv_rank=128, nope=64, rope=32, v_dim=64,
         inter=2048, moe_inter=512, experts=16, vocab=8192),
    Dims(hidden=256, heads=4, q_rank=128, kv_rank=64, nope=32, rope=16, v_dim=32,
         inter=512, moe_inter=128, experts=8, vocab=4096),
)


def nbytes(dtype: str, shape) -> int:
    return ITEMSIZE[dtype] * math.prod(shape)


# --------------------------------------------------------------------------- tensor names

def _linear(name: str, rows: int, cols: int, scheme: str) -> list[Spec]:
    """One Linear's tensors: ``bf16``, ``nvfp4`` (ModelOpt) or ``fp8`` (128x128 block)."""
    if scheme == "nvfp4":
        return [(name + ".weight", "U8", (rows, cols // 2)),
                (name + ".weight_scale", "F8_E4M3", (rows, cols // 16)),
                (name + ".weight_scale_2", "F32", ()),
                (name + ".input_scale", "F32", ())]
    if scheme == "fp8":
        return [(name + ".weight", "F8_E4M3", (rows, cols)),
                (name + ".weight_scale_inv", "F32", (math.ceil(rows / 128), math.ceil(cols / 128)))]
    return [(name + ".weight", "BF16", (rows, cols))]


def _layer(prefix: str, d: Dims, layer: int, fmt: str, kv_scales: bool) -> list[Spec]:
    p = f"{prefix}layers.{layer}."
    a = p + "self_attn."
    attn = "fp8" if fmt == "fp8-block" else "bf16"
    dense = "fp8" if fmt == "fp8-block" else "bf16"
    expert = "fp8" if fmt == "fp8-block" else "nvfp4"
    h = d.hidden
    specs: list[Spec] = [(p + "input_layernorm.weight", "BF16", (h,))]
    specs += _linear(a + "q_a_proj", d.q_rank, h, attn)
    specs += [(a + "q_a_layernorm.weight", "BF16", (d.q_rank,))]
    specs += _linear(a + "q_b_proj", d.heads * (d.nope + d.rope), d.q_rank, attn)
    specs += _linear(a + "kv_a_proj_with_mqa", d.kv_rank + d.rope, h, attn)
    specs += [(a + "kv_a_layernorm.weight", "BF16", (d.kv_rank,))]
    specs += _linear(a + "kv_b_proj", d.heads * (d.nope + d.v_dim), d.kv_rank, attn)
    specs += _linear(a + "o_proj", h, d.heads * d.v_dim, attn)
    if kv_scales:
        specs += [(a + "k_proj.k_scale", "F32", ()), (a + "v_proj.v_scale", "F32", ())]
    specs += [(p + "post_attention_layernorm.weight", "BF16", (h,))]
    m = p + "mlp."
    if layer == 0:
        return specs + _ffn(m, h, d.inter, dense)
    specs += [(m + "gate.weight", "BF16", (d.experts, h)),
              (m + "gate.e_score_correction_bias", "F32", (d.experts,))]
    for e in range(d.experts):
        specs += _ffn(f"{m}experts.{e}.", h, d.moe_inter, expert)
    return specs + _ffn(m + "shared_experts.", h, d.moe_inter, dense)


def _ffn(p: str, hidden: int, inner: int, scheme: str) -> list[Spec]:
    return (_linear(p + "gate_proj", inner, hidden, scheme)
            + _linear(p + "up_proj", inner, hidden, scheme)
            + _linear(p + "down_proj", hidden, inner, scheme))


def _vision(d: Dims) -> list[Spec]:
    """A two-block MoonViT-like tower and patch-merger projector (Kimi only), BF16."""
    v = d.hidden // 2
    specs: list[Spec] = [("vision_tower.patch_embed.proj.weight", "BF16", (v, 3, 14, 14)),
                         ("vision_tower.patch_embed.proj.bias", "BF16", (v,))]
    for b in range(2):
        p = f"vision_tower.encoder.blocks.{b}."
        specs += [(p + "norm0.weight", "BF16", (v,)), (p + "wqkv.weight", "BF16", (3 * v, v)),
                  (p + "wo.weight", "BF16", (v, v)), (p + "norm1.weight", "BF16", (v,)),
                  (p + "mlp.fc0.weight", "BF16", (4 * v, v)),
                  (p + "mlp.fc1.weight", "BF16", (v, 4 * v))]
    return specs + [("mm_projector.pre_norm.weight", "BF16", (v,)),
                    ("mm_projector.proj.0.weight", "BF16", (4 * v, 4 * v)),
                    ("mm_projector.proj.2.weight", "BF16", (d.hidden, 4 * v))]


def model_specs(d: Dims, layers: int, fmt: str, kv_scales: bool) -> list[Spec]:
    """Every tensor, in checkpoint order."""
    if fmt == "nvfp4":
        prefix, head, specs = "language_model.model.", "language_model.lm_head.weight", _vision(d)
    else:
        prefix, head, specs = "model.", "lm_head.weight", []
    specs += [(prefix + "embed_tokens.weight", "BF16", (d.vocab, d.hidden))]
    for layer in range(layers):
        specs += _layer(prefix, d, layer, fmt, kv_scales)
    return specs + [(prefix + "norm.weight", "BF16", (d.hidden,)),
                    (head, "BF16", (d.vocab, d.hidden))]


def layer_bytes(d: Dims, fmt: str) -> int:
    return sum(nbytes(t, s) for _, t, s in _layer("x.", d, 1, fmt, True))


def pick_dims(shard_bytes: int, fmt: str) -> Dims:
    for d in TIERS:
        if layer_bytes(d, fmt) * 2 <= shard_bytes:
            return d
    return TIERS[-1]


def pack(specs: list[Spec], target: int) -> list[list[Spec]]:
    """Greedy shards of at most ``target`` bytes (a single bigger unit gets its own shard); a
    weight's companion scales stay with it."""
    units: list[list[Spec]] = []
    for spec in specs:
        if units and spec[0].endswith(COMPANION_SUFFIXES):
            units[-1].append(spec)
        else:
            units.append([spec])
    shards: list[list[Spec]] = [[]]
    size = 0
    for unit in units:
        n = sum(nbytes(t, s) for _, t, s in unit)
        if shards[-1] and size + n > target:
            shards.append([])
            size = 0
        shards[-1].extend(unit)
        size += n
    return shards


def plan_layout(size_gb: float, shards: int, fmt: str, kv_scales: bool):
    """(dims, layers, shard lists): the most layers that pack into exactly ``shards`` shards,
    each holding KV scales when there are any (else the closest that can be reached)."""
    target = int(size_gb * 1e9 / shards)
    d = pick_dims(target, fmt)
    ends = sum(nbytes(t, s) for _, t, s in model_specs(d, 0, fmt, kv_scales))
    layers = max(1, int((size_gb * 1e9 - ends) / layer_bytes(d, fmt)) + 1)
    fallback = None
    for n_layers in range(layers, 0, -1):
        packed = pack(model_specs(d, n_layers, fmt, kv_scales), target)
        if len(packed) > shards:
            continue
        if fallback is None:
            fallback = (d, n_layers, packed)
        if len(packed) < shards:
            break
        if not kv_scales or all(any(s[0].endswith(KV_SCALE_SUFFIXES) for s in specs)
                                for specs in packed):
            return d, n_layers, packed
    return fallback or (d, 1, pack(model_specs(d, 1, fmt, kv_scales), target))
