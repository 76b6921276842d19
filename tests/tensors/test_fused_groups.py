"""vLLM's fused layers share one per-tensor scale (``plan.fused_groups``): which weights form
a group, and an FP8 per-tensor quantization whose members sit in different shards."""

from __future__ import annotations

import torch
from tensor_helpers import assert_bits_equal, read_tensors, write_model, write_recipe

from patcher import api
from patcher.plan.fused_groups import fused_peers


def test_groups_follow_vllms_packed_modules():
    attn, mlp = "model.layers.0.self_attn", "model.layers.0.mlp"
    names = [f"{attn}.{p}.weight" for p in ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj",
                                            "kv_b_proj", "o_proj")]
    names += [f"{mlp}.experts.{e}.{p}.weight" for e in (0, 1)
              for p in ("gate_proj", "up_proj", "down_proj")]
    names += ["model.layers.1.block_sparse_moe.experts.0.w1.weight",
              "model.layers.1.block_sparse_moe.experts.0.w3.weight",
              "model.layers.1.block_sparse_moe.experts.0.w2.weight",
              # DeepSeek-V2-Lite (no q_lora_rank): vLLM keeps q_proj and kv_a_proj_with_mqa apart
              "model.layers.2.self_attn.q_proj.weight",
              "model.layers.2.self_attn.kv_a_proj_with_mqa.weight"]
    peers = fused_peers(names)
    assert peers == {
        f"{attn}.q_a_proj.weight": (f"{attn}.kv_a_proj_with_mqa.weight",),
        f"{attn}.kv_a_proj_with_mqa.weight": (f"{attn}.q_a_proj.weight",),
        f"{mlp}.experts.0.gate_proj.weight": (f"{mlp}.experts.0.up_proj.weight",),
        f"{mlp}.experts.0.up_proj.weight": (f"{mlp}.experts.0.gate_proj.weight",),
        f"{mlp}.experts.1.gate_proj.weight": (f"{mlp}.experts.1.up_proj.weight",),
        f"{mlp}.experts.1.up_proj.weight": (f"{mlp}.experts.1.gate_proj.weight",),
        "model.layers.1.block_sparse_moe.experts.0.w1.weight":
            ("model.layers.1.block_sparse_moe.experts.0.w3.weight",),
        "model.layers.1.block_sparse_moe.experts.0.w3.weight":
            ("model.layers.1.block_sparse_moe.experts.0.w1.weight",),
    }


def test_fp8_tensor_scales_are_shared_across_shards(tmp_path):
    """q, k and v in two shards: one scale, max |q, k, v| / 448, and each weight's codes are
    its values divided by that scale, rounded to e4m3 (computed here from the definition)."""
    g = torch.Generator().manual_seed(1)
    attn = "model.layers.0.self_attn"
    w = {p: (torch.randn(32, 32, generator=g) * s).to(torch.bfloat16)
         for p, s in (("q_proj", 0.02), ("k_proj", 0.5), ("v_proj", 0.1), ("o_proj", 0.03))}
    base = write_model(tmp_path / "base", {
        "a.safetensors": {f"{attn}.q_proj.weight": w["q_proj"],
                          f"{attn}.o_proj.weight": w["o_proj"]},
        "b.safetensors": {f"{attn}.k_proj.weight": w["k_proj"],
                          f"{attn}.v_proj.weight": w["v_proj"]}})
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "*_proj.weight"}
          quantize: {scheme: fp8-tensor, layout: modelopt}
    """)
    got = read_tensors(api.apply(recipe, base, out=tmp_path / "out").output)
    amax = max(float(w[p].float().abs().max()) for p in ("q_proj", "k_proj", "v_proj"))
    shared = torch.tensor(amax, dtype=torch.float32) / torch.tensor(448.0)
    for p in ("q_proj", "k_proj", "v_proj"):
        assert_bits_equal(got[f"{attn}.{p}.weight_scale"], shared, p)
        want = (w[p].float() / shared).clamp(-448, 448).to(torch.float8_e4m3fn)
        assert_bits_equal(got[f"{attn}.{p}.weight"], want, p)
    own = w["o_proj"].float().abs().max() / torch.tensor(448.0)
    assert_bits_equal(got[f"{attn}.o_proj.weight_scale"], own, "o_proj")
