"""Build small, deterministic model directories shaped like the checkpoints modelpatch must patch.

Usage: ``python examples/generate.py OUTDIR [--only NAME ...]`` (``examples/out`` is git-ignored),
or import ``examples.generate``. Each directory must be new or empty.
Every run writes the same bytes: tensors come from generators seeded by the tensor's name, nothing
records a time, and shards are cut by a fixed rule.

``kimi-k25-nvfp4`` is shaped like nvidia/Kimi-K2.5-NVFP4 (540 GB, 119 shards).
  Faithful: config.json is a ``KimiK25ForConditionalGeneration`` wrapper around a DeepSeek-V3
  ``text_config`` plus a MoonViT ``vision_config``; the ModelOpt ``quantization_config`` sits at
  the top level, written as ModelOpt's ``convert_hf_quant_config_format`` writes it (config_groups,
  ignore, ``kv_cache_scheme: {dynamic: false, num_bits: 8, type: float}``); hf_quant_config.json
  carries ``kv_cache_quant_algo: FP8``. Tensor names, dtypes and the precision split follow the
  real export: only routed experts are NVFP4 (``weight`` uint8 [out, in/2] with the even element in
  the low nibble, ``weight_scale`` float8_e4m3fn [out, in/16], ``weight_scale_2`` and
  ``input_scale`` float32 scalars), produced by a re-implementation of ModelOpt's
  ``NVFP4QTensor.quantize``; MLA attention, the dense layer-0 MLP, shared experts, the router,
  lm_head, vision tower and projector stay bf16, and the ``ignore``/``exclude_modules`` list names
  them in the per-layer glob style of NVIDIA's ModelOpt exports; FP8 KV scales are
  ``self_attn.k_proj.k_scale`` and ``self_attn.v_proj.v_scale``. Some ``weight_scale`` tensors sit
  in a different shard from their weight. ``docs/deploy_guidance.md`` gives the repo a subfolder.
  Shrunk: every dimension (hidden 256, 3 layers, 8 routed experts, vocab 1024, a 2-block vision
  tower), 4 shards, a byte-level tiktoken.model. Special token ids keep their distance from the end
  of the vocabulary (real 163584 = vocab - 256 becomes 768). Remote code (``*.py``, ``auto_map``)
  is not shipped.

``deepseek-v3-fp8`` is shaped like deepseek-ai/DeepSeek-V3.
  Faithful: ``quantization_config`` (fp8, e4m3, dynamic activations, ``weight_block_size``
  [128, 128]); every attention and MLP projection (experts, shared experts and dense MLP included)
  is float8_e4m3fn with a float32 ``weight_scale_inv`` [ceil(M/128), ceil(N/128)] such that
  W = fp8 * scale_inv per block (DeepSeek's ``weight_dequant``), quantized with scale = amax / 448;
  embeddings, norms, the router, lm_head and the multi-token-prediction (MTP) layer's
  ``eh_proj``/``shared_head`` stay bf16, ``e_score_correction_bias`` is float32. Dimensions are not
  multiples of 128, so edge blocks are partial. Some ``weight_scale_inv`` tensors sit in a
  different shard from their weight.
  Shrunk: 2 layers plus 1 MTP layer, 4 routed experts, vocab 1024, 3 shards, no tokenizer files.

``tiny-deepseek-v3-bf16`` is a seeded ``DeepseekV3ForCausalLM`` from transformers, cast to
bfloat16 and written by ``save_pretrained`` in 3 shards; it reloads with ``from_pretrained``.

``make_hf_cache_snapshot`` lays any of these out as a Hugging Face hub cache entry
(``models--org--name/{blobs,refs,snapshots}``) with the hub's etags and relative symlinks.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import fnmatch
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

KIMI = "kimi-k25-nvfp4"
DEEPSEEK_FP8 = "deepseek-v3-fp8"
TINY_BF16 = "tiny-deepseek-v3-bf16"

# The ModelOpt release that wrote nvidia/Kimi-K2.5-NVFP4 is not recorded anywhere we could read.
MODELOPT_VERSION = "0.41.0"

KIMI_TEXT = {
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4,
    "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
    "v_head_dim": 32, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
}
KIMI_VISION = {
    "vt_hidden_size": 64, "vt_num_hidden_layers": 2, "vt_num_attention_heads": 4,
    "vt_intermediate_size": 128, "patch_size": 14, "merge_kernel_size": [2, 2],
    "init_pos_emb_height": 8, "init_pos_emb_width": 8,
}
# Distance of each special token from the end of the real 163840-token vocabulary.
KIMI_SPECIAL_TOKENS = {
    "[BOS]": 256, "[EOS]": 255, "<|im_end|>": 254, "<|im_user|>": 253, "<|im_assistant|>": 252,
    "<|im_system|>": 246, "<|im_middle|>": 239, "<|media_pad|>": 235, "[PAD]": 1,
}
# Not multiples of 128, so the FP8 edge blocks are partial.
DEEPSEEK_TEXT = {
    "vocab_size": 1024, "hidden_size": 320, "intermediate_size": 704, "moe_intermediate_size": 192,
    "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 2,
    "q_lora_rank": 192, "kv_lora_rank": 160, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
    "v_head_dim": 64, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 2, "topk_group": 1, "num_nextn_predict_layers": 1,
}
TINY_TEXT = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4,
    "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "max_position_embeddings": 256,
}

# --------------------------------------------------------------------------- quantizers

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_E2M1_TIES_UP = torch.tensor([0.75, 1.75, 2.5])  # ties ModelOpt rounds up, to the even code


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value; code bits 0-2 index E2M1_VALUES, bit 3 is the sign."""
    magnitude = x.abs()
    codes = torch.searchsorted(_E2M1_BOUNDS, magnitude).to(torch.uint8)
    codes += torch.isin(magnitude, _E2M1_TIES_UP).to(torch.uint8)
    return codes | ((x < 0).to(torch.uint8) << 3)


def quantize_nvfp4(weight: torch.Tensor, group: int = 16):
    """Quantize a 2-D weight as ModelOpt NVFP4 (``NVFP4QTensor.quantize``).

    Returns ``(weight uint8 [out, in/2], weight_scale float8_e4m3fn [out, in/group],
    weight_scale_2 float32 [])`` with W ~= E2M1_VALUES[code] * weight_scale * weight_scale_2.
    """
    w = weight.float()
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // group, group)
    block_amax = blocks.abs().amax(dim=-1)
    scale_2 = block_amax.amax() / (6.0 * 448.0)
    block_scale = block_amax / (6.0 * scale_2)
    block_scale[block_scale == 0] = 1.0
    block_scale = block_scale.to(torch.float8_e4m3fn)
    scaled = blocks / (block_scale.float() * scale_2).unsqueeze(-1)
    codes = _e2m1_codes(scaled.reshape(rows, cols))
    return codes[:, 0::2] | (codes[:, 1::2] << 4), block_scale, scale_2


def quantize_fp8_block(weight: torch.Tensor, block: int = 128):
    """Quantize a 2-D weight as DeepSeek-V3 block FP8: scale = amax / 448 per block.

    Returns ``(weight float8_e4m3fn [M, N], weight_scale_inv float32 [ceil(M/block),
    ceil(N/block)])`` with W ~= fp8[i, j] * weight_scale_inv[i // block, j // block].
    """
    w = weight.float()
    rows, cols = w.shape
    row_blocks, col_blocks = -(-rows // block), -(-cols // block)
    padding = (0, col_blocks * block - cols, 0, row_blocks * block - rows)
    padded = torch.nn.functional.pad(w, padding)
    tiles = padded.reshape(row_blocks, block, col_blocks, block)
    scale = tiles.abs().amax(dim=(1, 3)) / 448.0
    scale[scale == 0] = 1.0
    scaled = (tiles / scale[:, None, :, None]).reshape(row_blocks * block, col_blocks * block)
    return scaled[:rows, :cols].to(torch.float8_e4m3fn).contiguous(), scale


# --------------------------------------------------------------------------- tensor specs
# A spec is (name, role, shape). Roles: "plain" (bf16 weight that no recipe quantizes), "linear"
# (quantizable projection), "expert" (routed-expert projection), "norm", "bias" (bf16),
# "bias_f32" and "kv_scale" (float32 scalar).

Spec = tuple[str, str, tuple[int, ...]]


def _mla_specs(p: str, t: dict, kv_scales: bool) -> list[Spec]:
    h, heads = t["hidden_size"], t["num_attention_heads"]
    nope, rope, v = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    q_rank, kv_rank = t["q_lora_rank"], t["kv_lora_rank"]
    a = p + "self_attn."
    specs = [
        (a + "q_a_proj.weight", "linear", (q_rank, h)),
        (a + "q_a_layernorm.weight", "norm", (q_rank,)),
        (a + "q_b_proj.weight", "linear", (heads * (nope + rope), q_rank)),
        (a + "kv_a_proj_with_mqa.weight", "linear", (kv_rank + rope, h)),
        (a + "kv_a_layernorm.weight", "norm", (kv_rank,)),
        (a + "kv_b_proj.weight", "linear", (heads * (nope + v), kv_rank)),
        (a + "o_proj.weight", "linear", (h, heads * v)),
    ]
    if kv_scales:
        specs += [(a + "k_proj.k_scale", "kv_scale", ()), (a + "v_proj.v_scale", "kv_scale", ())]
    return specs


def _ffn_specs(p: str, hidden: int, inner: int, role: str) -> list[Spec]:
    return [(p + "gate_proj.weight", role, (inner, hidden)),
            (p + "up_proj.weight", role, (inner, hidden)),
            (p + "down_proj.weight", role, (hidden, inner))]


def _mlp_specs(p: str, t: dict, layer: int) -> list[Spec]:
    h, experts, inner = t["hidden_size"], t["n_routed_experts"], t["moe_intermediate_size"]
    if layer < t["first_k_dense_replace"]:
        return _ffn_specs(p + "mlp.", h, t["intermediate_size"], "linear")
    specs = [(p + "mlp.gate.weight", "plain", (experts, h)),
             (p + "mlp.gate.e_score_correction_bias", "bias_f32", (experts,))]
    for e in range(experts):
        specs += _ffn_specs(f"{p}mlp.experts.{e}.", h, inner, "expert")
    return specs + _ffn_specs(p + "mlp.shared_experts.", h, inner * t["n_shared_experts"], "linear")


def _decoder_layer_specs(prefix: str, t: dict, layer: int, kv_scales: bool) -> list[Spec]:
    p, h = f"{prefix}layers.{layer}.", t["hidden_size"]
    return ([(p + "input_layernorm.weight", "norm", (h,))] + _mla_specs(p, t, kv_scales)
            + [(p + "post_attention_layernorm.weight", "norm", (h,))] + _mlp_specs(p, t, layer))


def _text_specs(prefix: str, lm_head: str, t: dict, kv_scales: bool) -> list[Spec]:
    h, vocab = t["hidden_size"], t["vocab_size"]
    specs = [(prefix + "embed_tokens.weight", "plain", (vocab, h))]
    for layer in range(t["num_hidden_layers"]):
        specs += _decoder_layer_specs(prefix, t, layer, kv_scales)
    return specs + [(prefix + "norm.weight", "norm", (h,)), (lm_head, "plain", (vocab, h))]


def _mtp_specs(t: dict) -> list[Spec]:
    """DeepSeek-V3's multi-token-prediction layer, stored as layer ``num_hidden_layers``."""
    layer, h, vocab = t["num_hidden_layers"], t["hidden_size"], t["vocab_size"]
    p = f"model.layers.{layer}."
    return ([(p + "embed_tokens.weight", "plain", (vocab, h)), (p + "enorm.weight", "norm", (h,)),
             (p + "hnorm.weight", "norm", (h,)), (p + "eh_proj.weight", "plain", (h, 2 * h))]
            + _decoder_layer_specs("model.", t, layer, kv_scales=False)
            + [(p + "shared_head.norm.weight", "norm", (h,)),
               (p + "shared_head.head.weight", "plain", (vocab, h))])


def _affine_specs(p: str, out: int, inp: int | None) -> list[Spec]:
    """A LayerNorm (``inp`` None) or a Linear with bias."""
    if inp is None:
        return [(p + ".weight", "norm", (out,)), (p + ".bias", "bias", (out,))]
    return [(p + ".weight", "plain", (out, inp)), (p + ".bias", "bias", (out,))]


def _vision_specs(vc: dict, text_hidden: int) -> list[Spec]:
    """MoonViT tower (``vision_tower.``) and patch-merger projector (``mm_projector.``)."""
    d, inner, ps = vc["vt_hidden_size"], vc["vt_intermediate_size"], vc["patch_size"]
    merged = d * vc["merge_kernel_size"][0] * vc["merge_kernel_size"][1]
    pos = (vc["init_pos_emb_height"], vc["init_pos_emb_width"], d)
    specs = [("vision_tower.patch_embed.proj.weight", "plain", (d, 3, ps, ps)),
             ("vision_tower.patch_embed.proj.bias", "bias", (d,)),
             ("vision_tower.patch_embed.pos_emb.weight", "plain", pos)]
    for b in range(vc["vt_num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{b}."
        specs += (_affine_specs(p + "norm0", d, None) + _affine_specs(p + "wqkv", 3 * d, d)
                  + _affine_specs(p + "wo", d, d) + _affine_specs(p + "norm1", d, None)
                  + _affine_specs(p + "mlp.fc0", inner, d) + _affine_specs(p + "mlp.fc1", d, inner))
    return (specs + _affine_specs("vision_tower.encoder.final_layernorm", d, None)
            + _affine_specs("mm_projector.pre_norm", d, None)
            + _affine_specs("mm_projector.proj.0", merged, merged)
            + _affine_specs("mm_projector.proj.2", text_hidden, merged))


# --------------------------------------------------------------------------- tensor data

def _generator(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def _uniform(name: str, low: float, high: float) -> torch.Tensor:
    """A float32 scalar (shape []) drawn from [low, high)."""
    return torch.rand((), generator=_generator(name)) * (high - low) + low


def _source_tensor(name: str, role: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The unquantized tensor: bf16, except the float32 roles."""
    if role == "kv_scale":
        return _uniform(name, 1.0, 16.0) / 448.0  # ModelOpt FP8 KV scale = amax / 448
    noise = torch.randn(shape, generator=_generator(name))
    if role == "bias_f32":
        return noise * 0.01
    if role == "norm":
        return (1.0 + noise * 0.05).bfloat16()
    return (noise * (0.01 if role == "bias" else 0.02)).bfloat16()


def _kimi_tensors(spec: Spec) -> dict[str, torch.Tensor]:
    """Routed experts become ModelOpt NVFP4 (four tensors); everything else stays as generated."""
    name, role, _ = spec
    if role != "expert":
        return {name: _source_tensor(*spec)}
    packed, scale, scale_2 = quantize_nvfp4(_source_tensor(*spec))
    stem = name.removesuffix("weight")
    input_scale = _uniform(stem + "input_scale", 1.0, 16.0) / (6.0 * 448.0)
    return {name: packed, stem + "weight_scale": scale, stem + "weight_scale_2": scale_2,
            stem + "input_scale": input_scale}


def _deepseek_tensors(spec: Spec) -> dict[str, torch.Tensor]:
    """Every projection becomes block FP8 with its ``weight_scale_inv``."""
    name, role, _ = spec
    if role not in ("linear", "expert"):
        return {name: _source_tensor(*spec)}
    weight, scale_inv = quantize_fp8_block(_source_tensor(*spec))
    return {name: weight, name + "_scale_inv": scale_inv}


def _build(specs: list[Spec], encode: Callable[[Spec], dict]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for spec in specs:
        tensors.update(encode(spec))
    return tensors


# --------------------------------------------------------------------------- writing

def _prepare_dir(path: str | os.PathLike) -> Path:
    out = Path(path)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; generate into a new directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_json(path: Path, obj: dict, indent: int = 2) -> None:
    path.write_text(json.dumps(obj, indent=indent) + "\n", encoding="utf-8")


def _shard_bounds(names: list[str], sizes: list[int], shards: int, companion: str) -> list[int]:
    """Cut ``names`` into ``shards`` runs of about equal bytes.

    Each cut moves to the nearest place that separates a weight from its ``weight + companion``
    tensor, as long as it stays between its neighbours, so some companions land in the next shard.
    """
    total, ends = sum(sizes), list(itertools.accumulate(sizes))
    greedy = [bisect.bisect_left(ends, total * k / shards) + 1 for k in range(1, shards)]
    splits = [i for i in range(1, len(names)) if names[i] == names[i - 1] + companion]
    bounds = [0]
    for k, cut in enumerate(greedy):
        upper = greedy[k + 1] if k + 1 < len(greedy) else len(names)
        inside = [i for i in splits if bounds[-1] < i < upper]
        bounds.append(min(inside, key=lambda i: abs(i - cut)) if inside else cut)
    bounds.append(len(names))
    if any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cannot cut {len(names)} tensors into {shards} shards")
    return bounds


def _save_sharded(out: Path, tensors: dict[str, torch.Tensor], shards: int, companion: str) -> None:
    """Write ``model-0000i-of-0000n.safetensors`` shards and ``model.safetensors.index.json``."""
    names = list(tensors)
    sizes = [t.numel() * t.element_size() for t in tensors.values()]
    bounds = _shard_bounds(names, sizes, shards, companion)
    weight_map = {}
    for i, (start, stop) in enumerate(zip(bounds, bounds[1:]), start=1):
        filename = f"model-{i:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in names[start:stop]}, out / filename,
                  metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names[start:stop], filename))
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": dict(sorted(weight_map.items()))}
    _write_json(out / "model.safetensors.index.json", index)


# --------------------------------------------------------------------------- kimi-k25-nvfp4

def _kimi_exclude_modules(t: dict) -> list[str]:
    """Modules ModelOpt leaves bf16: everything but the routed experts (the router is implicit)."""
    layers = "language_model.model.layers."
    exclude = ["language_model.lm_head", "mm_projector*", "vision_tower*"]
    for layer in range(t["num_hidden_layers"]):
        if layer < t["first_k_dense_replace"]:
            exclude.append(f"{layers}{layer}.*")
        else:
            exclude += [f"{layers}{layer}.mlp.shared_experts*", f"{layers}{layer}.self_attn*"]
    return sorted(exclude)


def _modelopt_quant_configs(exclude: list[str]) -> tuple[dict, dict]:
    """(hf_quant_config.json, config.json ``quantization_config``): NVFP4 with an FP8 KV cache."""
    producer = {"name": "modelopt", "version": MODELOPT_VERSION}
    hf_quant = {"producer": producer, "quantization": {
        "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
        "exclude_modules": exclude}}
    nvfp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    config = {
        "config_groups": {"group_0": {"input_activations": dict(nvfp4), "weights": dict(nvfp4),
                                      "targets": ["Linear"]}},
        "ignore": exclude,
        "quant_algo": "NVFP4",
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
        "producer": producer,
        "quant_method": "modelopt",
    }
    return hf_quant, config


def _kimi_text_config(t: dict, ids: dict[str, int]) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "attention_bias": False, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
        "bos_token_id": ids["[BOS]"], "eos_token_id": ids["[EOS]"], "pad_token_id": ids["[PAD]"],
        "ep_size": 1, "hidden_act": "silu", "initializer_range": 0.02,
        "max_position_embeddings": 262144, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": True, "num_key_value_heads": t["num_attention_heads"],
        "num_nextn_predict_layers": 0, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                         "type": "yarn"},
        "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
        "seq_aux": True, "tie_word_embeddings": False, "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "use_cache": True, **t,
    }


def _kimi_vision_config(vc: dict, text_hidden: int) -> dict:
    return {
        **vc, "init_pos_emb_time": 4, "pos_emb_type": "divided_fixed",
        "merge_type": "sd2_tpool", "video_attn_type": "spatial_temporal",
        "mm_projector_type": "patchmerger", "mm_hidden_size": vc["vt_hidden_size"],
        "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05, "text_hidden_size": text_hidden,
    }


def _kimi_config(ids: dict[str, int], quantization_config: dict) -> dict:
    return {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "bos_token_id": ids["[BOS]"], "eos_token_id": ids["[EOS]"], "pad_token_id": ids["[PAD]"],
        "media_placeholder_token_id": ids["<|media_pad|>"], "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "text_config": _kimi_text_config(KIMI_TEXT, ids),
        "vision_config": _kimi_vision_config(KIMI_VISION, KIMI_TEXT["hidden_size"]),
        "quantization_config": quantization_config,
    }


_KIMI_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_{{ message['role'] }}|>{{ message['role'] }}<|im_middle|>{{ message['content'] }}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}\n"
)


def _write_kimi_tokenizer(out: Path, ids: dict[str, int]) -> None:
    """tiktoken.model (byte-level ranks), tokenizer_config.json and chat_template.jinja."""
    ranks = "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256))
    (out / "tiktoken.model").write_text(ranks, encoding="ascii")
    added = {str(i): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
             for token, i in sorted(ids.items(), key=lambda item: item[1])}
    _write_json(out / "tokenizer_config.json", {
        "added_tokens_decoder": added, "bos_token": "[BOS]", "eos_token": "[EOS]",
        "pad_token": "[PAD]", "clean_up_tokenization_spaces": False,
        "model_max_length": 262144, "tokenizer_class": "TikTokenTokenizer"})
    (out / "chat_template.jinja").write_text(_KIMI_CHAT_TEMPLATE, encoding="utf-8")


def make_kimi_nvfp4(path: str | os.PathLike) -> Path:
    """Write the nvidia/Kimi-K2.5-NVFP4 look-alike into ``path`` (new or empty) and return it."""
    out = _prepare_dir(path)
    vocab = KIMI_TEXT["vocab_size"]
    ids = {token: vocab - back for token, back in KIMI_SPECIAL_TOKENS.items()}
    hf_quant, quantization_config = _modelopt_quant_configs(_kimi_exclude_modules(KIMI_TEXT))
    _write_json(out / "config.json", _kimi_config(ids, quantization_config), indent=4)
    _write_json(out / "hf_quant_config.json", hf_quant, indent=4)
    _write_json(out / "generation_config.json",
                {"eos_token_id": ids["<|im_end|>"], "max_length": 262144})
    _write_kimi_tokenizer(out, ids)
    (out / "docs").mkdir()
    (out / "docs" / "deploy_guidance.md").write_text(
        "# Deployment\n\nServe with an NVFP4-capable engine on Blackwell GPUs.\n", encoding="utf-8")
    specs = (_vision_specs(KIMI_VISION, KIMI_TEXT["hidden_size"])
             + _text_specs("language_model.model.", "language_model.lm_head.weight", KIMI_TEXT,
                           kv_scales=True))
    _save_sharded(out, _build(specs, _kimi_tensors), shards=4, companion="_scale")
    return out


# --------------------------------------------------------------------------- deepseek-v3-fp8

def _deepseek_config(t: dict) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "attention_bias": False, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
        "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "hidden_act": "silu",
        "initializer_range": 0.02, "max_position_embeddings": 163840, "moe_layer_freq": 1,
        "norm_topk_prob": True, "num_key_value_heads": t["num_attention_heads"],
        "pretraining_tp": 1,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                "quant_method": "fp8", "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                         "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "seq_aux": True, "tie_word_embeddings": False, "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True, **t,
    }


def make_deepseek_fp8(path: str | os.PathLike) -> Path:
    """Write the DeepSeek-V3 block-FP8 look-alike into ``path`` (new or empty) and return it."""
    out = _prepare_dir(path)
    _write_json(out / "config.json", _deepseek_config(DEEPSEEK_TEXT))
    _write_json(out / "generation_config.json", {"_from_model_config": True, "bos_token_id": 0,
                                                 "eos_token_id": 1, "do_sample": True,
                                                 "temperature": 0.6, "top_p": 0.95})
    specs = _text_specs("model.", "lm_head.weight", DEEPSEEK_TEXT, kv_scales=False)
    specs += _mtp_specs(DEEPSEEK_TEXT)
    _save_sharded(out, _build(specs, _deepseek_tensors), shards=3, companion="_scale_inv")
    return out


# --------------------------------------------------------------------------- tiny bf16

@contextlib.contextmanager
def _transformers_progress_bars_off() -> Iterator[None]:
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


def make_tiny_bf16(path: str | os.PathLike) -> Path:
    """Save a seeded tiny transformers ``DeepseekV3ForCausalLM`` (bf16, 3 shards) into ``path``."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    out = _prepare_dir(path)
    with torch.random.fork_rng(devices=[]), _transformers_progress_bars_off():
        torch.manual_seed(0)
        model = DeepseekV3ForCausalLM(DeepseekV3Config(**TINY_TEXT)).to(torch.bfloat16)
        model.save_pretrained(out, max_shard_size="150KB")
    return out


# --------------------------------------------------------------------------- hub cache

# The .gitattributes every new Hugging Face model repository starts with.
HUB_LFS_PATTERNS = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
    "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
    "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "saved_model/**/*", "*.tar.*",
    "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*",
)
HUB_LFS_MIN_SIZE = 10 * 1024 * 1024  # the hub refuses larger files outside LFS


def _is_lfs(relpath: str, size: int) -> bool:
    name = relpath.rsplit("/", 1)[-1]
    return size > HUB_LFS_MIN_SIZE or any(
        fnmatch.fnmatchcase(relpath if "/" in pattern else name, pattern)
        for pattern in HUB_LFS_PATTERNS)


def hub_etag(path: str | os.PathLike, relpath: str) -> str:
    """The hub's etag for a file: sha256 for LFS files, else the git blob sha1."""
    size = os.path.getsize(path)
    if _is_lfs(relpath, size):
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1()
        digest.update(b"blob %d\0" % size)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stand_in_commit(etags: dict[str, str]) -> str:
    """A 40-hex id that depends only on the files' paths and etags (not a real git commit)."""
    listing = "".join(f"{relpath}\0{etag}\n" for relpath, etag in sorted(etags.items()))
    return hashlib.sha1(listing.encode()).hexdigest()


def make_hf_cache_snapshot(model_dir: str | os.PathLike, cache_root: str | os.PathLike,
                           repo_id: str = "org/name", commit: str | None = None) -> Path:
    """Lay ``model_dir`` out as a Hugging Face hub cache entry and return its snapshot directory.

    Writes ``cache_root/models--org--name/`` with ``blobs/<etag>``, ``refs/main`` (the commit,
    no newline) and ``snapshots/<commit>/<file>`` as relative symlinks into ``blobs/``, as
    ``huggingface_hub`` downloads do. ``commit`` defaults to an id derived from the content.
    """
    src = Path(model_dir)
    relpaths = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    etags = {relpath: hub_etag(src / relpath, relpath) for relpath in relpaths}
    commit = commit or _stand_in_commit(etags)
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"commit must be 40 lowercase hex digits, got {commit!r}")
    repo = Path(cache_root) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for relpath, etag in etags.items():
        blob = repo / "blobs" / etag
        if not blob.exists():
            shutil.copyfile(src / relpath, blob)
        link = snapshot / relpath
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit, encoding="ascii")
    return snapshot


# --------------------------------------------------------------------------- entry points

BUILDERS: dict[str, Callable[[str | os.PathLike], Path]] = {
    KIMI: make_kimi_nvfp4, DEEPSEEK_FP8: make_deepseek_fp8, TINY_BF16: make_tiny_bf16,
}


def make_all(outdir: str | os.PathLike, names: list[str] | None = None) -> dict[str, Path]:
    """Build every example (or only ``names``) under ``outdir``; return {name: directory}."""
    return {name: build(Path(outdir) / name) for name, build in BUILDERS.items()
            if names is None or name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path, help="directory to create the examples in")
    parser.add_argument("--only", nargs="+", choices=list(BUILDERS), metavar="NAME",
                        help=f"build only these ({', '.join(BUILDERS)})")
    parser.add_argument("--force", action="store_true",
                        help="replace example directories that already exist")
    args = parser.parse_args(argv)
    if args.force:
        for name in args.only or BUILDERS:
            shutil.rmtree(args.outdir / name, ignore_errors=True)
    for path in make_all(args.outdir, args.only).values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
