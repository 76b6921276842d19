#!/usr/bin/env python
"""Benchmark modelpatch's tensor transforms against the scripts people write by hand.

Generates a synthetic DeepSeek-V3-shaped checkpoint of about ``--size-gb`` GB in shards of about
``--shard-mb`` MB: FP8-block projections (``weight`` F8_E4M3 + ``weight_scale_inv`` F32, MoE
experts included), BF16 embeddings, norms, router and lm_head, and per layer the ModelOpt FP8
KV-cache scales ``self_attn.k_proj.k_scale`` / ``self_attn.v_proj.v_scale`` (F32 scalars). Its
config declares block FP8 (``quant_method: fp8``) but no FP8 KV cache, so both ``drop-kv-scales``
and ``fp8-block-to-bf16`` apply to it. Every shard holds KV scales, so ``drop-kv-scales`` rewrites
every shard.

Then, after one warm-up of each command, ``--repeat`` rounds, alternating the commands within each
round, every command a subprocess whose wall time and peak RSS (``ru_maxrss`` of the child and its
own children, from ``wait4``) are recorded:

(a) ``modelpatch apply drop-kv-scales`` (sha256 of every output shard computed while writing;
    base shards hashed for the provenance manifest), with a cold digest cache (a fresh
    ``MODELPATCH_CACHE_DIR`` per run: everything hashed) and a warm one (the base digests
    remembered from the warm-up), against a plain script: ``safetensors.torch.load_file``, drop the
    KV scales, ``save_file`` per shard, index rewritten (no hashing at all);
(b) ``modelpatch apply fp8-block-to-bf16`` against ``cp`` of the same number of bytes (the BF16
    output shards copied to a new directory; on ext4 cp copies in the kernel with
    copy_file_range) and against a plain torch script in the style of DeepSeek's
    ``inference/fp8_cast_bf16.py`` on CPU (``load_file`` per shard, dequantize every FP8 weight
    with its ``weight_scale_inv``, ``save_file``; the scale of a weight in another shard is read
    from that shard, the two most recent shards cached, as that script does).

The page cache cannot be dropped fairly for every command, so every command reads its input from
memory after the warm-up: the figures compare CPU and memory work, not disk speed.

Usage:
    python benchmarks/bench_tensor.py [--size-gb 2] [--shard-mb 512] [--repeat 3] [--quick]
                                      [--jobs N] [--workdir DIR] [--keep]

Results go to stdout as JSON; a summary goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_tensor_model import describe, make_model

REPO = Path(__file__).resolve().parents[1]

KV_SCALE_RE = r"(^|\.)(k_proj\.k_scale|v_proj\.v_scale|self_attn\.k_scale|self_attn\.v_scale)$"

LOAD_SAVE_DROP = r"""
import json, os, re, sys
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
pattern = re.compile(sys.argv[3])
index = json.load(open(os.path.join(src, "model.safetensors.index.json")))
os.makedirs(dst)
dropped = set()
for shard in sorted(set(index["weight_map"].values())):
    tensors = load_file(os.path.join(src, shard))
    kept = {}
    for name, tensor in tensors.items():
        if pattern.search(name):
            dropped.add(name)
        else:
            kept[name] = tensor
    save_file(kept, os.path.join(dst, shard), metadata={"format": "pt"})
    del tensors, kept
index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k not in dropped}
with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
    json.dump(index, f, indent=2)
"""

# DeepSeek's inference/fp8_cast_bf16.py, on CPU: its Triton weight_dequant becomes the same
# float32 product in torch.
FP8_CAST_BF16 = r"""
import json, os, sys
from glob import glob
import torch
from safetensors.torch import load_file, save_file

def weight_dequant(x, s, block_size=128):
    m, n = x.shape
    s = s.repeat_interleave(block_size, 0)[:m].repeat_interleave(block_size, 1)[:, :n]
    return (x.to(torch.float32) * s).to(torch.get_default_dtype())

def main(fp8_path, bf16_path):
    torch.set_default_dtype(torch.bfloat16)
    os.makedirs(bf16_path, exist_ok=True)
    with open(os.path.join(fp8_path, "model.safetensors.index.json")) as f:
        model_index = json.load(f)
    weight_map = model_index["weight_map"]
    loaded_files = {}
    fp8_weight_names = []

    def get_tensor(tensor_name):
        file_name = weight_map[tensor_name]
        if file_name not in loaded_files:
            loaded_files[file_name] = load_file(os.path.join(fp8_path, file_name))
        return loaded_files[file_name][tensor_name]

    for safetensor_file in sorted(glob(os.path.join(fp8_path, "*.safetensors"))):
        file_name = os.path.basename(safetensor_file)
        current_state_dict = load_file(safetensor_file)
        loaded_files[file_name] = current_state_dict
        new_state_dict = {}
        for weight_name, weight in current_state_dict.items():
            if weight_name.endswith("_scale_inv"):
                continue
            elif weight.element_size() == 1:
                scale_inv = get_tensor(f"{weight_name}_scale_inv")
                fp8_weight_names.append(weight_name)
                new_state_dict[weight_name] = weight_dequant(weight, scale_inv)
            else:
                new_state_dict[weight_name] = weight
        save_file(new_state_dict, os.path.join(bf16_path, file_name), metadata={"format": "pt"})
        if len(loaded_files) > 2:
            del loaded_files[next(iter(loaded_files))]
    for weight_name in fp8_weight_names:
        weight_map.pop(f"{weight_name}_scale_inv", None)
    with open(os.path.join(bf16_path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)

main(sys.argv[1], sys.argv[2])
"""


# --------------------------------------------------------------------------- measuring

def measure(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; wall seconds, CPU seconds (user + system, the child and its children) and
    the peak RSS of the child (and its children) in bytes."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss": usage.ru_maxrss * 1024}


def _out_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.safetensors"))


def _clean(*paths: Path) -> None:
    for p in paths:
        if p.exists():
            subprocess.run(["chmod", "-R", "u+w", str(p)], check=True)
            shutil.rmtree(p)


def _stats(runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    return {"wall_s_median": statistics.median(walls), "wall_s": walls,
            "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
            "peak_rss_max": max(r["peak_rss"] for r in runs),
            **({"out_bytes": runs[0]["out_bytes"]} if "out_bytes" in runs[0] else {})}


def _generate(args, work: Path) -> Path:
    """The synthetic model in ``work`` (reused when complete), written by a child process: this
    one must stay small, because a child's ru_maxrss starts from the RSS of the process that
    forked it."""
    model = work / "model"
    print(f"generating {args.size_gb} GB in ~{args.shard_mb} MB shards under {work} ...",
          file=sys.stderr)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--generate", str(model), "--size-gb",
                    str(args.size_gb), "--shard-mb", str(args.shard_mb)], check=True)
    print(f"  ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return model


class _Commands:
    """The commands compared, each a function that runs it once and returns its figures."""

    def __init__(self, args, work: Path, model: Path):
        self.args, self.work, self.model = args, work, model
        script = Path(sys.executable).with_name("modelpatch")
        self.mp = [str(script)] if script.exists() else [
            sys.executable, "-c", "from patcher.cli import main; main()"]
        self.jobs = ["--jobs", str(args.jobs)] if args.jobs else []
        self.base_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        self.warm_cache = work / "cache-warm"
        self.scripts = work / "scripts"
        self.scripts.mkdir(exist_ok=True)
        (self.scripts / "load_save_drop.py").write_text(LOAD_SAVE_DROP)
        (self.scripts / "fp8_cast_bf16_cpu.py").write_text(FP8_CAST_BF16)
        self.bf16_ref = work / "bf16-for-cp"
        self.counter = iter(range(10**6))

    def mp_apply(self, recipe: str, out: Path, warm: bool, device: str = "cpu") -> dict:
        if warm:
            env, cache = dict(self.base_env, MODELPATCH_CACHE_DIR=str(self.warm_cache)), None
        else:
            cache = self.work / f"cache-cold-{next(self.counter)}"
            env = dict(self.base_env, MODELPATCH_CACHE_DIR=str(cache))
        r = measure(self.mp + ["apply", recipe, str(self.model), "-o", str(out), "-q",
                               "--device", device] + self.jobs, env)
        r["out_bytes"] = _out_bytes(out)
        _clean(out, *([cache] if cache else []))
        return r

    def plain(self, script: str, out: Path, *extra: str) -> dict:
        r = measure([sys.executable, str(self.scripts / script), str(self.model), str(out),
                     *extra], self.base_env)
        r["out_bytes"] = _out_bytes(out)
        _clean(out)
        return r

    def cp(self) -> dict:
        dst = self.work / "cp-out"
        dst.mkdir()
        files = sorted(str(p) for p in self.bf16_ref.glob("*.safetensors"))
        r = measure(["cp", *files, str(dst)], self.base_env)
        r["out_bytes"] = _out_bytes(dst)
        _clean(dst)
        return r

    def all(self) -> dict:
        work, device = self.work, self.args.device
        commands = {
            "drop_kv/modelpatch_cold_cache":
                lambda: self.mp_apply("drop-kv-scales", work / "o1", False),
            "drop_kv/modelpatch_warm_cache":
                lambda: self.mp_apply("drop-kv-scales", work / "o2", True),
            "drop_kv/load_save": lambda: self.plain("load_save_drop.py", work / "o3", KV_SCALE_RE),
            "fp8_to_bf16/modelpatch":
                lambda: self.mp_apply("fp8-block-to-bf16", work / "o4", False),
            "fp8_to_bf16/cp_same_bytes": self.cp,
            "fp8_to_bf16/torch_script": lambda: self.plain("fp8_cast_bf16_cpu.py", work / "o5"),
        }
        if device != "cpu":
            commands[f"fp8_to_bf16/modelpatch_{device}"] = lambda: self.mp_apply(
                "fp8-block-to-bf16", work / "o6", False, device)
        return commands

    def warm_up(self) -> None:
        """The page cache, the warm digest cache, and the BF16 files cp copies."""
        _clean(self.bf16_ref)
        measure(self.mp + ["apply", "fp8-block-to-bf16", str(self.model), "-o",
                           str(self.bf16_ref), "-q"],
                dict(self.base_env, MODELPATCH_CACHE_DIR=str(self.warm_cache)))


def _rounds(commands: dict, repeat: int) -> dict[str, list[dict]]:
    """One warm-up of each command, then ``repeat`` rounds, the order reversed every other."""
    for name, fn in commands.items():
        print(f"  warm-up {name}", file=sys.stderr)
        fn()
    results: dict[str, list[dict]] = {name: [] for name in commands}
    for round_ in range(repeat):
        order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
        for name in order:
            results[name].append(commands[name]())
        print(f"  round {round_ + 1}/{repeat} done", file=sys.stderr)
    return results


def _summary(stats: dict, device: str) -> dict:
    def ratio(a, b, key):
        return stats[a][key] / stats[b][key]

    def gbps(name):
        return stats[name]["out_bytes"] / stats[name]["wall_s_median"] / 1e9

    drop, load_save = "drop_kv/modelpatch_", "drop_kv/load_save"
    return {
        "drop_kv_time_ratio_cold_cache": ratio(drop + "cold_cache", load_save, "wall_s_median"),
        "drop_kv_time_ratio_warm_cache": ratio(drop + "warm_cache", load_save, "wall_s_median"),
        "drop_kv_cpu_ratio_cold_cache": ratio(drop + "cold_cache", load_save, "cpu_s_median"),
        "drop_kv_cpu_ratio_warm_cache": ratio(drop + "warm_cache", load_save, "cpu_s_median"),
        "drop_kv_rss_ratio": ratio(drop + "cold_cache", load_save, "peak_rss_max"),
        "fp8_to_bf16_gbps_modelpatch": gbps("fp8_to_bf16/modelpatch"),
        "fp8_to_bf16_gbps_cp": gbps("fp8_to_bf16/cp_same_bytes"),
        "fp8_to_bf16_gbps_torch_script": gbps("fp8_to_bf16/torch_script"),
        **({f"fp8_to_bf16_gbps_modelpatch_{device}":
            gbps(f"fp8_to_bf16/modelpatch_{device}")} if device != "cpu" else {}),
        "fp8_to_bf16_rss_modelpatch": stats["fp8_to_bf16/modelpatch"]["peak_rss_max"],
        "fp8_to_bf16_rss_torch_script": stats["fp8_to_bf16/torch_script"]["peak_rss_max"],
    }


def run_benchmark(args) -> dict:
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-tensor-"))
    work.mkdir(parents=True, exist_ok=True)
    model = _generate(args, work)
    runner = _Commands(args, work, model)
    commands = runner.all()
    runner.warm_up()
    stats = {name: _stats(runs) for name, runs in _rounds(commands, args.repeat).items()}
    desc = describe(model)
    if not args.keep:
        _clean(runner.bf16_ref)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "benchmark": "bench_tensor",
        "params": {"size_gb": args.size_gb, "shard_mb": args.shard_mb, "repeat": args.repeat,
                   "jobs": args.jobs, "device": args.device},
        "model": desc,
        "machine": {"python": platform.python_version(), "cpus": len(os.sched_getaffinity(0)),
                    "load_before": os.getloadavg(),
                    "platform": platform.platform(),
                    "torch": importlib.metadata.version("torch"),
                    "safetensors": importlib.metadata.version("safetensors")},
        "results": stats,
        "summary": _summary(stats, args.device),
    }


def _print_summary(report: dict) -> None:
    s, m = report["summary"], report["model"]
    mb = 2**20
    lines = [(f"model: {m['bytes'] / 1e9:.2f} GB, {m['shards']} shards (largest "
              f"{m['largest_shard'] / mb:.0f} MiB), {m['tensors']} tensors, "
              f"{m['kv_scales']} KV scales")]
    for name, st in report["results"].items():
        extra = (f"  {st['out_bytes'] / st['wall_s_median'] / 1e9:5.2f} GB/s"
                 if "out_bytes" in st else "")
        lines.append(f"  {name:<32} {st['wall_s_median']:7.2f} s  cpu {st['cpu_s_median']:6.2f} s"
                     f"  peak RSS "
                     f"{st['peak_rss_max'] / mb:7.0f} MiB{extra}")
    lines.append(f"drop-kv-scales vs load/save: time {s['drop_kv_time_ratio_cold_cache']:.2f}x "
                 f"(cold digest cache), {s['drop_kv_time_ratio_warm_cache']:.2f}x (warm); "
                 f"peak RSS {s['drop_kv_rss_ratio']:.2f}x   (targets <= 1.0x, <= 0.5x); CPU time "
                 f"{s['drop_kv_cpu_ratio_cold_cache']:.2f}x cold, "
                 f"{s['drop_kv_cpu_ratio_warm_cache']:.2f}x warm")
    lines.append(f"fp8-block-to-bf16: {s['fp8_to_bf16_gbps_modelpatch']:.2f} GB/s of output; cp "
                 f"{s['fp8_to_bf16_gbps_cp']:.2f} GB/s; torch script "
                 f"{s['fp8_to_bf16_gbps_torch_script']:.2f} GB/s")
    print("\n".join(lines), file=sys.stderr)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--shard-mb", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None,
                        help="modelpatch --jobs (default: all cores)")
    parser.add_argument("--device", default="cpu",
                        help="also time fp8-block-to-bf16 with modelpatch --device DEVICE")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: 0.25 GB in 64 MB shards, 2 rounds")
    parser.add_argument("--workdir", default=None,
                        help="keep the generated model here and reuse it")
    parser.add_argument("--keep", action="store_true", help="keep outputs in --workdir")
    parser.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.generate:
        make_model(Path(args.generate), args.size_gb, args.shard_mb)
        return 0
    if args.quick:
        args.size_gb, args.shard_mb, args.repeat = 0.25, 64, 2
    report = run_benchmark(args)
    print(json.dumps(report, indent=2))
    _print_summary(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
