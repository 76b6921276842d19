"""The files of a synthetic checkpoint (synth.py): shards whose tensor bytes are copied from
small seeded pools, and the JSON configs of the two shapes."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from synth_layout import ITEMSIZE, Dims, Spec, nbytes

# --------------------------------------------------------------------------- tensor bytes

_POOLS: dict[str, memoryview] = {}
POOL_BYTES = 32 << 20


def _pool(kind: str) -> memoryview:
    """Seeded pools of valid values: ``bytes`` (no e4m3 NaN code 0x7f/0xff), ``bf16`` normals
    (std 0.02), ``f32`` positive scales in [1e-3, 1e-2)."""
    if kind not in _POOLS:
        import numpy as np

        rng = np.random.default_rng(20240601)
        if kind == "bytes":
            arr = rng.integers(0, 256, POOL_BYTES, dtype=np.uint8) & np.uint8(0xFE)
        elif kind == "bf16":
            f = (rng.standard_normal(POOL_BYTES // 2, dtype=np.float32) * 0.02)
            arr = (f.view(np.uint32) >> 16).astype(np.uint16)
        else:
            arr = rng.uniform(1e-3, 1e-2, POOL_BYTES // 4).astype(np.float32)
        _POOLS[kind] = memoryview(arr.tobytes())
    return _POOLS[kind]


def _write_tensor(f, name: str, dtype: str, n: int) -> None:
    pool = _pool({"BF16": "bf16", "F32": "f32"}.get(dtype, "bytes"))
    item = ITEMSIZE[dtype]
    start = (zlib.crc32(name.encode()) * 4099) % len(pool) // item * item
    while n:
        chunk = pool[start:start + n]
        _write_all(f, chunk)
        n -= len(chunk)
        start = 0


def _write_all(f, view: memoryview) -> None:
    while view:
        k = f.write(view)
        view = view[k:]


def shard_header(specs: list[Spec]) -> tuple[bytes, list[Spec]]:
    """The safetensors header (8-byte length + JSON, space-padded to 8) and the data order:
    larger element sizes first, then by name, as safetensors' own writer orders them."""
    ordered = sorted(specs, key=lambda s: (-ITEMSIZE[s[1]], s[0]))
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in ordered:
        n = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body, ordered


def write_shard(path: Path, specs: list[Spec]) -> bytes:
    """Write one shard; returns its header (whose sha256 identifies its content)."""
    header, ordered = shard_header(specs)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb", buffering=0) as f:
        _write_all(f, memoryview(header))
        for name, dtype, shape in ordered:
            _write_tensor(f, name, dtype, nbytes(dtype, shape))
    tmp.rename(path)
    return header


# --------------------------------------------------------------------------- configs

def configs(d: Dims, layers: int, fmt: str, kv_cache: str) -> dict[str, tuple[dict, int]]:
    """{file name: (JSON, indent)}."""
    text = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": d.hidden, "intermediate_size": d.inter,
        "moe_intermediate_size": d.moe_inter, "num_hidden_layers": layers,
        "first_k_dense_replace": 1, "num_attention_heads": d.heads,
        "num_key_value_heads": d.heads, "q_lora_rank": d.q_rank, "kv_lora_rank": d.kv_rank,
        "qk_nope_head_dim": d.nope, "qk_rope_head_dim": d.rope, "v_head_dim": d.v_dim,
        "n_routed_experts": d.experts, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "vocab_size": d.vocab, "max_position_embeddings": 262144, "rms_norm_eps": 1e-05,
        "rope_theta": 50000.0, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "routed_scaling_factor": 2.827, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True,
    }
    kv = {"dynamic": False, "num_bits": 8, "type": "float"}
    if fmt == "fp8-block":
        quant = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                 "weight_block_size": [128, 128]}
        if kv_cache == "fp8":
            quant["kv_cache_scheme"] = kv
        config = dict(text, quantization_config=quant)
        return {"config.json": (config, 2),
                "generation_config.json": ({"bos_token_id": 0, "eos_token_id": 1,
                                            "do_sample": True, "temperature": 0.6}, 2)}
    layers_glob = "language_model.model.layers."
    exclude = sorted(["language_model.lm_head", "mm_projector*", "vision_tower*",
                      f"{layers_glob}0.*"]
                     + [f"{layers_glob}{i}.{m}*" for i in range(1, layers)
                        for m in ("self_attn", "mlp.shared_experts")])
    nvfp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    producer = {"name": "modelopt", "version": "0.41.0"}
    quant = {"config_groups": {"group_0": {"input_activations": dict(nvfp4),
                                           "weights": dict(nvfp4), "targets": ["Linear"]}},
             "ignore": exclude, "quant_algo": "NVFP4", "producer": producer,
             "quant_method": "modelopt"}
    hf_quant = {"producer": producer, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                       "exclude_modules": exclude}}
    if kv_cache == "fp8":
        quant["kv_cache_scheme"] = kv
        hf_quant["quantization"]["kv_cache_quant_algo"] = "FP8"
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "bos_token_id": 163584, "eos_token_id": 163585, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "text_config": text,
        "vision_config": {"vt_hidden_size": d.hidden // 2, "vt_num_hidden_layers": 2,
                          "patch_size": 14, "merge_kernel_size": [2, 2]},
        "quantization_config": quant,
    }
    return {"config.json": (config, 4), "hf_quant_config.json": (hf_quant, 4),
            "generation_config.json": ({"eos_token_id": 163586, "max_length": 262144}, 2),
            "tokenizer_config.json": ({"bos_token": "[BOS]", "eos_token": "[EOS]",
                                       "model_max_length": 262144,
                                       "tokenizer_class": "TikTokenTokenizer"}, 2)}
