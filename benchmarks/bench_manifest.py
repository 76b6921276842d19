#!/usr/bin/env python
"""Manifest and change-log encoding at a real tensor count.

Builds the provenance statement of an apply that converts ``--tensors`` tensors (273k: the
Kimi-K2.5-NVFP4 count; each converted weight drops its scales, as nvfp4-to-bf16 does) and writes
it, once with ``patcher.canonical_json`` and once with the standard library's encoder
(``reference_canonical_json``), side by side in one process; CPU seconds of each, and whether
the bytes are equal.

Usage: python benchmarks/bench_manifest.py [--tensors 273000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from patcher.integrity import manifest  # noqa: E402
from patcher.integrity.canonical_json import reference_canonical_json  # noqa: E402

_SHARDS = 119


def change_log(tensors: int) -> list[dict]:
    """Entries shaped like the planner's: one ``tensor_converted`` per weight, one
    ``tensor_dropped`` per scale it uses up (two per weight here)."""
    out = []
    weights = tensors // 3
    for i in range(weights):
        layer, expert = divmod(i, 384)
        name = f"language_model.model.layers.{layer}.mlp.experts.{expert}.down_proj"
        shard = f"model-{i % _SHARDS + 1:05d}-of-{_SHARDS:05d}.safetensors"
        line = "/usr/lib/python3/site-packages/patcher/builtin_recipes/nvfp4-to-bf16.yaml:26:5"
        out.append({"after": {"dtype": "BF16", "shape": [7168, 2048]},
                    "before": {"dtype": "U8", "shape": [7168, 1024]},
                    "how": "dequantize:nvfp4-modelopt", "kind": "tensor_converted",
                    "recipe_line": line, "removed": [f"{name}.weight_scale",
                                                     f"{name}.weight_scale_2"],
                    "shard": shard, "tensor": f"{name}.weight"})
        for suffix, shape, dtype in (("weight_scale", [7168, 128], "F8_E4M3"),
                                     ("weight_scale_2", [], "F32")):
            out.append({"after": None, "before": {"dtype": dtype, "shape": shape},
                        "companion_of": f"{name}.weight", "dtype": dtype,
                        "kind": "tensor_dropped", "reason": "dequantize:nvfp4-modelopt",
                        "recipe_line": line, "shape": shape, "shard": shard,
                        "tensor": f"{name}.{suffix}"})
    return out


def build_and_write(changes: list[dict], directory: Path) -> bytes:
    files = {f"model-{i + 1:05d}-of-{_SHARDS:05d}.safetensors": ("ab" * 32, 5 << 30)
             for i in range(_SHARDS)}
    statement = manifest.build_statement(
        subjects=files, base_files=files, recipe={"name": "nvfp4-to-bf16", "sha256": "cd" * 32,
                                                  "text": "name: nvfp4-to-bf16\n"},
        options={"jobs": None}, changes=changes, started=0, finished=1, invocation_id="x",
        versions={"modelpatch": "0"})
    manifest.write_manifest(directory, statement)
    return (directory / manifest.MANIFEST_NAME).read_bytes()


def timed(fn) -> tuple[float, bytes]:
    start = time.process_time()
    data = fn()
    return time.process_time() - start, data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensors", type=int, default=273_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    changes = change_log(args.tensors)
    runs: dict[str, list[float]] = {"fast": [], "stdlib": []}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for _ in range(args.repeat):
            fast_s, fast = timed(lambda: build_and_write(changes, d))
            with mock.patch.object(manifest, "_canonical_json", reference_canonical_json), \
                    mock.patch("patcher.integrity.manifest.encode_array",
                               lambda items: (list(items), reference_canonical_json(list(items)))):
                slow_s, slow = timed(lambda: build_and_write(changes, d))
            runs["fast"].append(fast_s)
            runs["stdlib"].append(slow_s)
    result = {"tensors": args.tensors, "change_log_entries": len(changes),
              "manifest_bytes": len(fast), "bytes_equal": fast == slow,
              "cpu_s": {k: statistics.median(v) for k, v in runs.items()},
              "runs": runs}
    result["ratio_fast_vs_stdlib"] = result["cpu_s"]["fast"] / result["cpu_s"]["stdlib"]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
