#!/usr/bin/env python
"""Benchmark ``modelpatch inspect`` against what a user does today to look inside a checkpoint.

Generates a synthetic DeepSeek-V3-shaped checkpoint (ModelOpt NVFP4 routed experts as U8 +
F8_E4M3 + F32 scales, FP8-block dense MLPs with ``weight_scale_inv``, BF16 attention and norms,
FP32 KV scales, an index with ``total_size``), then times, alternating after one warm-up of each:

  (a) ``modelpatch inspect --json MODEL`` as a subprocess (headers and JSON only);
  (b) a baseline subprocess that opens every shard with ``safetensors.safe_open(framework="pt")``
      and calls ``get_tensor`` on every tensor;
  (c) ``ModelDir.open`` + ``inspect_model`` in this process (no interpreter start-up).

The page cache cannot be dropped without privileges, so after the warm-up the baseline reads the
shards from memory: its figure is a lower bound for a cold read from disk.

Usage:
    python benchmarks/bench_inspect.py [--shards 100] [--shard-mb 64] [--repeat 5]
                                       [--tensors-per-shard 48] [--workdir DIR]

Results go to stdout as JSON; a one-line summary goes to stderr. With ``--workdir`` the generated
model is kept there and reused by later runs with the same parameters.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ITEMSIZE = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "U8": 1}
HIDDEN = 7168
LAYERS, DENSE_LAYERS, EXPERTS = 61, 3, 256
GENERATOR_VERSION = 1

BASELINE = r"""
import sys
from pathlib import Path
from safetensors import safe_open

total = count = 0
for path in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            total += t.numel() * t.element_size()
            count += 1
print(count, total)
"""


# --- the synthetic checkpoint ----------------------------------------------------------------


def _linear_names(prefix: str, scheme: str) -> Iterator[tuple[str, str, str]]:
    """(name, role, dtype) for one Linear under ``scheme`` (nvfp4 | fp8 | bf16)."""
    if scheme == "nvfp4":
        yield f"{prefix}.weight", "big", "U8"
        yield f"{prefix}.weight_scale", "fp4_scale", "F8_E4M3"
        yield f"{prefix}.weight_scale_2", "weight_scalar", "F32"
        yield f"{prefix}.input_scale", "weight_scalar", "F32"
    elif scheme == "fp8":
        yield f"{prefix}.weight", "big", "F8_E4M3"
        yield f"{prefix}.weight_scale_inv", "block_scale", "F32"
    else:
        yield f"{prefix}.weight", "big", "BF16"


def deepseek_names() -> Iterator[tuple[str, str, str]]:
    """DeepSeek-V3 tensor names in checkpoint order, endlessly (layers wrap with a suffix)."""
    for cycle in range(1 << 30):
        base = "model" if cycle == 0 else f"model.replica{cycle}"
        yield f"{base}.embed_tokens.weight", "big", "BF16"
        for layer in range(LAYERS):
            p = f"{base}.layers.{layer}"
            yield f"{p}.input_layernorm.weight", "vector", "BF16"
            for proj in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
                yield from _linear_names(f"{p}.self_attn.{proj}", "bf16")
            yield f"{p}.self_attn.q_a_layernorm.weight", "vector", "BF16"
            yield f"{p}.self_attn.kv_a_layernorm.weight", "vector", "BF16"
            yield f"{p}.self_attn.k_proj.k_scale", "scalar", "F32"
            yield f"{p}.self_attn.v_proj.v_scale", "scalar", "F32"
            yield f"{p}.post_attention_layernorm.weight", "vector", "BF16"
            if layer < DENSE_LAYERS:
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    yield from _linear_names(f"{p}.mlp.{proj}", "fp8")
                continue
            yield f"{p}.mlp.gate.weight", "router", "BF16"
            yield f"{p}.mlp.gate.e_score_correction_bias", "router_bias", "F32"
            for proj in ("gate_proj", "up_proj", "down_proj"):
                yield from _linear_names(f"{p}.mlp.shared_experts.{proj}", "nvfp4")
            for expert in range(EXPERTS):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    yield from _linear_names(f"{p}.mlp.experts.{expert}.{proj}", "nvfp4")
        yield f"{base}.norm.weight", "vector", "BF16"
        yield "lm_head.weight" if cycle == 0 else f"{base}.lm_head.weight", "big", "BF16"


SCALE_ROLES = ("fp4_scale", "weight_scalar", "block_scale")
# Tensors whose size does not follow the shard budget. (The scales of a weight are counted with
# the weight: 1/8 of an NVFP4 weight, 1/4096 of an FP8-block weight.)
FIXED_BYTES = {"vector": HIDDEN * 2, "router": EXPERTS * HIDDEN * 2, "router_bias": EXPERTS * 4,
               "scalar": 4, "weight_scalar": 4}


def plan_checkpoint(shards: int, shard_mb: int, per_shard: int) -> list[list[dict]]:
    """Per shard, its tensors (name, dtype, shape), sized so each shard is about ``shard_mb``.

    A shard takes ``per_shard`` names in checkpoint order, plus the scales that complete its
    last Linear, so every scale lands next to its weight.
    """
    names = list(itertools.islice(deepseek_names(), shards * (per_shard + 8) + 16))
    layout, pos, cols = [], 0, 1024
    for _ in range(shards):
        group = names[pos:pos + per_shard]
        pos += per_shard
        while names[pos][1] in SCALE_ROLES:
            group.append(names[pos])
            pos += 1
        n_big = sum(1 for _, role, _ in group if role == "big") or 1
        fixed = sum(FIXED_BYTES.get(role, 0) for _, role, _ in group)
        budget = max(0, shard_mb * (1 << 20) - fixed) // n_big
        tensors, rows_of = [], {}
        for name, role, dtype in group:
            stem = name.rsplit(".", 1)[0]
            rows = rows_of.get(stem, 128)
            if role == "big":
                # An NVFP4 weight brings an e4m3 scale of 1/8 its size.
                per_row = cols * ITEMSIZE[dtype] * (1.125 if dtype == "U8" else 1)
                rows = rows_of[stem] = max(16, int(budget // per_row) // 16 * 16)
                shape = [rows, cols]
            elif role == "fp4_scale":      # e4m3 [out, in/16]; in = 2 * packed columns
                shape = [rows, cols * 2 // 16]
            elif role == "block_scale":    # fp32 [ceil(out/128), ceil(in/128)]
                shape = [math.ceil(rows / 128), math.ceil(cols / 128)]
            elif role in ("weight_scalar", "scalar"):
                shape = []
            elif role == "vector":
                shape = [HIDDEN]
            elif role == "router":
                shape = [EXPERTS, HIDDEN]
            elif role == "router_bias":
                shape = [EXPERTS]
            else:
                raise AssertionError(role)
            tensors.append({"name": name, "dtype": dtype, "shape": shape})
        layout.append(tensors)
    return layout


def _nbytes(t: dict) -> int:
    return math.prod(t["shape"]) * ITEMSIZE[t["dtype"]]


def write_checkpoint(model: Path, layout: list[list[dict]]) -> tuple[int, int]:
    """Write the shards, the index and the JSON files. Returns (tensors, tensor bytes)."""
    model.mkdir(parents=True, exist_ok=True)
    block = os.urandom(1 << 20)
    weight_map, total_bytes, count = {}, 0, 0
    n = len(layout)
    for i, tensors in enumerate(layout):
        shard = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        # Like safetensors' writer: larger element sizes first, so every tensor stays aligned.
        ordered = sorted(tensors, key=lambda t: (-ITEMSIZE[t["dtype"]], t["name"]))
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for t in ordered:
            size = _nbytes(t)
            header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"],
                                 "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[t["name"]] = shard
        body = json.dumps(header, separators=(",", ":")).encode()
        body += b" " * (-len(body) % 8)
        tmp = model / (shard + ".tmp")
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(body)) + body)
            left = offset
            while left:
                chunk = block[:min(left, len(block))]
                f.write(chunk)
                left -= len(chunk)
        tmp.rename(model / shard)
        total_bytes += offset
        count += len(tensors)
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, indent=2))
    ignore = ["lm_head"] + [f"model.layers.{i}.self_attn*" for i in range(LAYERS)]
    (model / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "n_routed_experts": EXPERTS,
        "first_k_dense_replace": DENSE_LAYERS,
        "quantization_config": {
            "quant_method": "modelopt", "quant_algo": "NVFP4",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "group_size": 16, "strategy": "tensor_group"}}},
            "kv_cache_scheme": {"num_bits": 8, "type": "float"}, "ignore": ignore}},
        indent=2))
    (model / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.39.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                         "exclude_modules": ignore}}, indent=4))
    return count, total_bytes


def ensure_checkpoint(workdir: Path, shards: int, shard_mb: int, per_shard: int) -> dict:
    params = {"generator": GENERATOR_VERSION, "shards": shards, "shard_mb": shard_mb,
              "tensors_per_shard": per_shard}
    model = workdir / "synthetic-deepseek-v3-nvfp4"
    stamp = workdir / "synthetic-model.json"
    if stamp.exists():
        info = json.loads(stamp.read_text())
        if info.get("params") == params and model.is_dir():
            info["generated_s"] = None  # reused
            return info
    if model.exists():
        shutil.rmtree(model)
    t0 = time.perf_counter()
    count, total = write_checkpoint(model, plan_checkpoint(shards, shard_mb, per_shard))
    info = {"params": params, "path": str(model), "tensors": count, "tensor_bytes": total,
            "generated_s": round(time.perf_counter() - t0, 3)}
    stamp.write_text(json.dumps(info))
    return info


# --- timing ----------------------------------------------------------------------------------


def modelpatch_command() -> list[str]:
    exe = Path(sys.executable).parent / "modelpatch"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("modelpatch")
    return [found] if found else [sys.executable, "-c", "from patcher.cli import main; main()"]


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_inspect: {cmd[0]} failed ({proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def stats(runs: list[float]) -> dict:
    return {"median_s": round(statistics.median(runs), 4), "min_s": round(min(runs), 4),
            "max_s": round(max(runs), 4), "runs_s": [round(r, 4) for r in runs]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--shard-mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tensors-per-shard", type=int, default=48,
                        help="base tensors per shard (a Linear's scales are kept with it)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the generated model here and reuse it (default: a temporary "
                             "directory, removed afterwards)")
    return parser.parse_args()


def check_outputs(inspect_cmd: list[str], baseline_cmd: list[str], info: dict) -> None:
    """Warm-up (also pulls the shards into the page cache) and a correctness check."""
    _, out = timed(inspect_cmd)
    report = json.loads(out)
    totals = report["tensors"]["totals"]
    assert totals["tensors"] == info["tensors"], (totals, info)
    assert totals["bytes"] + totals["scale_bytes"] == info["tensor_bytes"], (totals, info)
    _, out = timed(baseline_cmd)
    assert out.split() == [str(info["tensors"]), str(info["tensor_bytes"])], out


def time_subprocesses(inspect_cmd: list[str], baseline_cmd: list[str],
                      repeat: int) -> tuple[list[float], list[float]]:
    inspect_runs, baseline_runs = [], []
    for i in range(repeat):  # alternate the order so drift hits both equally
        pair = [(inspect_cmd, inspect_runs), (baseline_cmd, baseline_runs)]
        for cmd, runs in (pair if i % 2 == 0 else pair[::-1]):
            runs.append(timed(cmd)[0])
    return inspect_runs, baseline_runs


def time_in_process(model: str, repeat: int) -> list[float]:
    from patcher.model.inspect_model import inspect_model
    from patcher.model.model_dir import ModelDir

    inspect_model(ModelDir.open(model))  # warm-up
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        inspect_model(ModelDir.open(model))
        runs.append(time.perf_counter() - t0)
    return runs


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    args = parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_inspect_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        info = ensure_checkpoint(workdir, args.shards, args.shard_mb, args.tensors_per_shard)
        model = info["path"]
        inspect_cmd = modelpatch_command() + ["inspect", "--json", model]
        baseline_cmd = [sys.executable, "-c", BASELINE, model]
        check_outputs(inspect_cmd, baseline_cmd, info)
        inspect_runs, baseline_runs = time_subprocesses(inspect_cmd, baseline_cmd, args.repeat)
        inproc_runs = time_in_process(model, args.repeat)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    inspect_s, baseline_s = stats(inspect_runs), stats(baseline_runs)
    ratio = baseline_s["median_s"] / inspect_s["median_s"]
    result = {
        "benchmark": "inspect",
        "model": {"shards": args.shards, "shard_mb": args.shard_mb,
                  "tensors": info["tensors"], "tensor_bytes": info["tensor_bytes"],
                  "generated_s": info["generated_s"]},
        "repeat": args.repeat,
        "inspect_cli": inspect_s,
        "baseline_safe_open_get_tensor": baseline_s,
        "speedup_median": round(ratio, 1),
        "inspect_in_process": stats(inproc_runs),
        "notes": "baseline reads the shards from the page cache (it cannot be dropped here), so "
                 "it is a lower bound for a cold read; subprocess times include interpreter "
                 "start-up (the baseline's includes importing torch)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "safetensors": version("safetensors"),
                    "torch": version("torch"), "modelpatch": version("modelpatch")},
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    print(f"bench_inspect: {info['tensors']} tensors / {args.shards} shards / "
          f"{info['tensor_bytes'] / 2**30:.2f} GiB: inspect {inspect_s['median_s']:.3f} s, "
          f"safe_open+get_tensor {baseline_s['median_s']:.3f} s ({ratio:.1f}x), "
          f"in-process {stats(inproc_runs)['median_s']:.3f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
