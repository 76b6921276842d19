"""The synthetic checkpoint of bench_tensor.py: DeepSeek-V3-shaped, FP8-block projections
(``weight`` F8_E4M3 + ``weight_scale_inv`` F32, MoE experts included), BF16 embeddings, norms,
router and lm_head, and per layer the FP8 KV-cache scales, in shards of about ``shard_mb`` MB."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

GENERATOR_VERSION = 1


def _specs(hidden: int, experts: int, layers: int, vocab: int):
    """(name, dtype, shape) of the model, in file order; FP8 weights followed by their scale."""
    heads, nope, rope, v_dim, q_rank, kv_rank, inner = 16, 128, 64, 128, 1536, 512, 1408

    def fp8(name, rows, cols):
        yield name, "F8_E4M3", (rows, cols)
        yield name + "_scale_inv", "F32", (math.ceil(rows / 128), math.ceil(cols / 128))

    yield "model.embed_tokens.weight", "BF16", (vocab, hidden)
    for layer in range(layers):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        yield p + "input_layernorm.weight", "BF16", (hidden,)
        yield from fp8(a + "q_a_proj.weight", q_rank, hidden)
        yield a + "q_a_layernorm.weight", "BF16", (q_rank,)
        yield from fp8(a + "q_b_proj.weight", heads * (nope + rope), q_rank)
        yield from fp8(a + "kv_a_proj_with_mqa.weight", kv_rank + rope, hidden)
        yield a + "kv_a_layernorm.weight", "BF16", (kv_rank,)
        yield from fp8(a + "kv_b_proj.weight", heads * (nope + v_dim), kv_rank)
        yield from fp8(a + "o_proj.weight", hidden, heads * v_dim)
        yield a + "k_proj.k_scale", "F32", ()
        yield a + "v_proj.v_scale", "F32", ()
        yield p + "post_attention_layernorm.weight", "BF16", (hidden,)
        yield p + "mlp.gate.weight", "BF16", (experts, hidden)
        yield p + "mlp.gate.e_score_correction_bias", "F32", (experts,)
        for e in ["shared_experts"] + [f"experts.{i}" for i in range(experts)]:
            m = f"{p}mlp.{e}."
            yield from fp8(m + "gate_proj.weight", inner, hidden)
            yield from fp8(m + "up_proj.weight", inner, hidden)
            yield from fp8(m + "down_proj.weight", hidden, inner)
    yield "model.norm.weight", "BF16", (hidden,)
    yield "lm_head.weight", "BF16", (vocab, hidden)


_ITEM = {"F8_E4M3": 1, "BF16": 2, "F32": 4}


def _nbytes(dtype, shape) -> int:
    return _ITEM[dtype] * math.prod(shape)


def _layout(size_gb: float, shard_mb: int):
    hidden = 2048
    vocab, experts = (32000, 16) if shard_mb >= 256 else (4000, 2)
    one_layer = sum(_nbytes(d, s) for n, d, s in _specs(hidden, experts, 1, vocab)
                    if ".layers." in n)
    ends = 2 * _nbytes("BF16", (vocab, hidden))
    layers = max(1, round((size_gb * 1e9 - ends) / one_layer))
    return hidden, experts, layers, vocab


def _tensor(dtype: str, shape, pool):
    import torch

    n = _nbytes(dtype, shape)
    offset = (n * 7919) % pool.numel()       # vary the bytes from tensor to tensor
    raw = pool.roll(-offset)
    raw = raw[:n].clone() if n <= raw.numel() else raw.repeat(n // raw.numel() + 1)[:n]
    if dtype == "F8_E4M3":
        return raw.view(torch.float8_e4m3fn).reshape(shape)   # pool has no NaN codes
    if dtype == "BF16":
        return (raw[: n // 2].to(torch.int16) - 128).to(torch.bfloat16).mul_(1e-3).reshape(shape)
    if not shape:
        return torch.tensor(0.01, dtype=torch.float32)
    return torch.rand(shape, dtype=torch.float32) * 1e-3 + 1e-4


def make_model(out: Path, size_gb: float, shard_mb: int) -> dict:
    """Write the synthetic checkpoint into ``out`` (reused when already complete)."""
    import torch
    from safetensors.torch import save_file

    stamp = out / ".bench-complete"
    params = {"size_gb": size_gb, "shard_mb": shard_mb, "version": GENERATOR_VERSION}
    if stamp.exists() and json.loads(stamp.read_text()) == params:
        return params
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    hidden, experts, layers, vocab = _layout(size_gb, shard_mb)
    specs = list(_specs(hidden, experts, layers, vocab))
    gen = torch.Generator().manual_seed(0)
    pool = torch.randint(0, 256, (8 << 20,), dtype=torch.uint8, generator=gen) & 0xFE
    # Cut shards by size; a weight and the scale that follows it stay together.
    shards, current, size = [], [], 0
    for spec in specs:
        nb = _nbytes(spec[1], spec[2])
        if current and size + nb > shard_mb * 2**20 and not spec[0].endswith("_scale_inv"):
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += nb
    shards.append(current)
    weight_map, total = {}, 0
    for i, group in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: _tensor(d, s, pool) for n, d, s in group}
        save_file(tensors, out / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(_nbytes(d, s) for _, d, s in group)
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
        indent=2))
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": hidden, "num_hidden_layers": layers, "n_routed_experts": experts,
        "vocab_size": vocab, "torch_dtype": "bfloat16",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    without_kv = [g for g in shards if not any(n.endswith(("k_scale", "v_scale")) for n, _, _ in g)]
    if without_kv:
        print(f"warning: {len(without_kv)} shards hold no KV scale", file=sys.stderr)
    stamp.write_text(json.dumps(params))
    return params


def describe(model: Path) -> dict:
    shards = sorted(model.glob("*.safetensors"))
    index = json.loads((model / "model.safetensors.index.json").read_text())
    return {"shards": len(shards), "bytes": sum(p.stat().st_size for p in shards),
            "largest_shard": max(p.stat().st_size for p in shards),
            "tensors": len(index["weight_map"]),
            "kv_scales": sum(1 for n in index["weight_map"] if n.endswith(("k_scale", "v_scale")))}
