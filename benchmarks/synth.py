#!/usr/bin/env python
"""Synthetic large checkpoints for the benchmarks, written at disk speed.

Two shapes, with the real tensor names, dtypes and companion layouts (DESIGN.md section 1):

``nvfp4`` -- shaped like nvidia/Kimi-K2.5-NVFP4: a ``KimiK25ForConditionalGeneration`` config
    wrapping a DeepSeek-V3 ``text_config``; text weights under ``language_model.model.``; a small
    ``vision_tower.`` / ``mm_projector.`` first; MLA attention, the dense layer-0 MLP, shared
    experts, router, embeddings and lm_head in BF16; routed experts in ModelOpt NVFP4 (``weight``
    U8 [out, in/2], ``weight_scale`` F8_E4M3 [out, in/16], ``weight_scale_2`` and ``input_scale``
    F32 scalars); per layer the FP8 KV-cache scales ``self_attn.k_proj.k_scale`` /
    ``self_attn.v_proj.v_scale`` (F32 scalars). The config declares the FP8 KV cache
    (``quantization_config.kv_cache_scheme: {num_bits: 8, type: float}`` and hf_quant_config.json
    ``quantization.kv_cache_quant_algo: FP8``) unless ``kv_cache="none"`` (the state after
    ``sm120-fp16-kv``, which ``drop-kv-scales`` requires).
``fp8-block`` -- shaped like deepseek-ai/DeepSeek-V3: every attention and MLP projection (experts
    included) F8_E4M3 with an F32 ``weight_scale_inv`` [ceil(M/128), ceil(N/128)]; embeddings,
    norms, router and lm_head BF16; config ``quantization_config: {quant_method: fp8,
    weight_block_size: [128, 128]}``. No KV cache is declared unless ``kv_cache="fp8"``.

Dimensions are chosen from the shard size so that a decoder layer is at most half a shard: every
shard then holds at least one layer's attention, and so KV scales (``drop-kv-scales`` rewrites
every shard). Shards are cut greedily at ``size / shards`` bytes (a weight and its scales stay
together); the number of layers is the largest that gives exactly ``shards`` shards, so the real
size is a little under the nominal one (the report states both). The index carries the exact
``metadata.total_size`` (the sum of tensor bytes, as transformers writes it).

Tensor bytes come from three small seeded pools (random bytes without FP8 NaN codes, BF16 normals,
positive F32 scales) written at rotating offsets, so a GB costs a memcpy, not a random number
generator. The data is a pure function of the tensor's name, dtype and shape, so a shard whose
header equals a shard of another generated model has the same bytes: ``link_from`` hardlinks it
instead of writing it again (the benchmark's 1, 2, 4 and 8 GB models share all but their last
shard, and a ``kv_cache="none"`` twin shares every shard). Every file is aged by an hour
(``os.utime``) so that modelpatch's digest cache, which ignores files modified in the last 2 s,
records them; the data is flushed to disk (``os.sync``) before returning, so background writeback
does not disturb the first measurements.

Usage:
    python benchmarks/synth.py OUT --size-gb 8 --shards 16 [--format nvfp4|fp8-block]
                               [--kv-cache fp8|none] [--link-from DIR ...]

A sibling file ``OUT.synth.json`` records the parameters and the layout; calling again with the
same parameters reuses the directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

GENERATOR_VERSION = 1
ITEMSIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1}
AGE_S = 3600
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

def _configs(d: Dims, layers: int, fmt: str, kv_cache: str) -> dict[str, tuple[dict, int]]:
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


# --------------------------------------------------------------------------- the model

def _stamp(out: Path) -> Path:
    return out.with_name(out.name + ".synth.json")


def _age(path: Path, now: float) -> None:
    t = int((now - AGE_S) * 1e9)
    os.utime(path, ns=(t, t))


def _linkable(link_from) -> dict[str, Path]:
    """{header sha256: shard path} of the models in ``link_from`` (generated by this module)."""
    found: dict[str, Path] = {}
    for src in link_from or ():
        src = Path(src)
        try:
            info = json.loads(_stamp(src).read_text())
        except (OSError, ValueError):
            continue
        if info.get("params", {}).get("generator") != GENERATOR_VERSION:
            continue
        for digest, shard in info.get("shard_headers", {}).items():
            if (src / shard).is_file():
                found.setdefault(digest, src / shard)
    return found


def generate(out: str | os.PathLike, *, size_gb: float, shards: int, fmt: str = "nvfp4",
             kv_cache: str | None = None, kv_scales: bool | None = None,
             link_from=(), sync: bool = True) -> dict:
    """Write (or reuse) a synthetic checkpoint in ``out``; returns its description.

    Args:
        size_gb: nominal size in GB (1e9 bytes); the real size is at most this.
        shards: number of shards (each about ``size_gb / shards``).
        fmt: ``nvfp4`` (Kimi-K2.5-NVFP4 shape) or ``fp8-block`` (DeepSeek-V3 shape).
        kv_cache: ``fp8`` (declare an FP8 KV cache) or ``none``; default ``fp8`` for nvfp4,
            ``none`` for fp8-block.
        kv_scales: write ``k_proj.k_scale`` / ``v_proj.v_scale``; default True for nvfp4.
        link_from: directories of earlier generated models whose identical shards are hardlinked.
        sync: flush everything to disk before returning.
    """
    if fmt not in ("nvfp4", "fp8-block"):
        raise ValueError(f"unknown format {fmt!r}")
    kv_cache = kv_cache or ("fp8" if fmt == "nvfp4" else "none")
    kv_scales = (fmt == "nvfp4") if kv_scales is None else kv_scales
    out = Path(out)
    params = {"generator": GENERATOR_VERSION, "size_gb": size_gb, "shards": shards, "format": fmt,
              "kv_cache": kv_cache, "kv_scales": kv_scales}
    stamp = _stamp(out)
    if stamp.exists() and out.is_dir():
        try:
            info = json.loads(stamp.read_text())
        except ValueError:
            info = {}
        if info.get("params") == params:
            return dict(info, reused=True)
    if out.exists():
        shutil.rmtree(out)
    stamp.unlink(missing_ok=True)
    t0 = time.perf_counter()
    dims, layers, packed = plan_layout(size_gb, shards, fmt, kv_scales)
    out.mkdir(parents=True)
    linkable = _linkable(link_from)
    n = len(packed)
    weight_map: dict[str, str] = {}
    headers: dict[str, str] = {}
    total = written = linked = 0
    now = time.time()
    for i, specs in enumerate(packed, start=1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        header, _ = shard_header(specs)
        digest = hashlib.sha256(header).hexdigest()
        data = sum(nbytes(t, s) for _, t, s in specs)
        src = linkable.get(digest)
        if src is not None:
            os.link(src, out / name)
            linked += len(header) + data
        else:
            write_shard(out / name, specs)
            _age(out / name, now)
            written += len(header) + data
        headers[digest] = name
        weight_map.update(dict.fromkeys((s[0] for s in specs), name))
        total += data
    files = {"model.safetensors.index.json": ({"metadata": {"total_size": total},
                                               "weight_map": dict(sorted(weight_map.items()))}, 2)}
    files.update(_configs(dims, layers, fmt, kv_cache))
    for fname, (doc, indent) in files.items():
        (out / fname).write_text(json.dumps(doc, indent=indent) + "\n")
        _age(out / fname, now)
    if sync:
        os.sync()
    kv_per_shard = [sum(1 for s in specs if s[0].endswith(KV_SCALE_SUFFIXES)) for specs in packed]
    info = {
        "params": params, "path": str(out), "dims": asdict(dims), "layers": layers,
        "shards": n, "tensors": len(weight_map), "tensor_bytes": total,
        "file_bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file()),
        "largest_shard": max((out / f"model-{i:05d}-of-{n:05d}.safetensors").stat().st_size
                             for i in range(1, n + 1)),
        "shards_without_kv_scales": sum(1 for k in kv_per_shard if k == 0) if kv_scales else None,
        "bytes_written": written, "bytes_linked": linked,
        "generated_s": round(time.perf_counter() - t0, 3), "shard_headers": headers,
    }
    stamp.write_text(json.dumps(info, indent=1))
    return dict(info, reused=False)


def hf_cache_snapshot(model: str | os.PathLike, cache_root: str | os.PathLike,
                      repo_id: str = "synth/model") -> Path:
    """Lay ``model`` out as a Hugging Face hub cache entry, as huggingface_hub downloads do, and
    return its snapshot directory: ``models--org--name/blobs/<etag>`` (hardlinks of the model's
    files, so nothing is copied), ``snapshots/<commit>/<file>`` relative symlinks into ``blobs/``,
    ``refs/main``. The etag of an LFS file (``*.safetensors``, or over 10 MiB) is its sha256,
    of any other file the git blob sha1, as on the hub. Hashing uses one thread per core."""
    from concurrent.futures import ThreadPoolExecutor

    src = Path(model)
    files = sorted(p.name for p in src.iterdir() if p.is_file())

    def etag(name: str) -> str:
        path = src / name
        size = path.stat().st_size
        lfs = name.endswith(".safetensors") or size > 10 << 20
        h = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % size)
        with open(path, "rb") as f:
            if lfs:
                return hashlib.file_digest(f, "sha256").hexdigest()
            h.update(f.read())
        return h.hexdigest()

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        etags = dict(zip(files, pool.map(etag, files)))
    commit = hashlib.sha1("".join(f"{n}\0{e}\n" for n, e in etags.items()).encode()).hexdigest()
    repo = Path(cache_root) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name, tag in etags.items():
        blob = repo / "blobs" / tag
        if not blob.exists():
            os.link(src / name, blob)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--format", dest="fmt", choices=["nvfp4", "fp8-block"], default="nvfp4")
    parser.add_argument("--kv-cache", choices=["fp8", "none"], default=None,
                        help="declare an FP8 KV cache in the config (default: fp8 for nvfp4, "
                             "none for fp8-block)")
    parser.add_argument("--no-kv-scales", action="store_true",
                        help="do not write k_proj.k_scale / v_proj.v_scale tensors")
    parser.add_argument("--link-from", type=Path, nargs="*", default=[],
                        help="earlier generated models whose identical shards are hardlinked")
    args = parser.parse_args(argv)
    info = generate(args.out, size_gb=args.size_gb, shards=args.shards, fmt=args.fmt,
                    kv_cache=args.kv_cache, kv_scales=False if args.no_kv_scales else None,
                    link_from=args.link_from)
    info.pop("shard_headers", None)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
