#!/usr/bin/env python
"""The modelpatch benchmark suite: every case, side by side with what users do today, one report.

    python benchmarks/run.py [--quick | --tiny] [--sizes 1,2,4,8] [--repeat N] [--warmup N]
                             [--workdir DIR] [--out benchmarks/report] [--cases 1,2,3,4,5,6]

Cases (each modelpatch command against its baseline, alternated within every round, the order
reversed every other round, after ``--warmup`` untimed rounds; medians over ``--repeat`` rounds):

1. config-only patch ``apply sm120-fp16-kv``, first time (a fresh, empty digest cache) and with
   digests known (a warm cache), against ``cp -r`` + a JSON edit (python json load/dump of
   config.json and hf_quant_config.json), without and with a final ``sync``;
2. ``verify`` against hashlib sha256 per file, serially and in a ``multiprocessing.Pool`` with one
   process per core;
3. ``apply drop-kv-scales`` (every shard holds KV scales, so every shard is rewritten) against
   safetensors ``load_file``/``save_file`` per shard (the script of benchmarks/bench_tensor.py),
   wall time and peak RSS;
4. ``apply fp8-block-to-bf16`` against a CPU torch script in the style of DeepSeek's
   ``fp8_cast_bf16.py`` (from bench_tensor.py) and against ``cp`` of the same output bytes;
5. ``inspect`` against opening every shard with ``safe_open`` + ``get_tensor`` (the baseline of
   benchmarks/bench_inspect.py) and with ``safe_open`` reading headers only;
6. cold start: ``modelpatch --help`` and a config-only ``plan``, with torch's import time named.

Cases 1-3 run at every size of ``--sizes`` (GB; shards of ``--shard-mb``), the scaling study;
cases 4-6 at one size. Every command is a subprocess started by a small wrapper interpreter that
reports its wall time and ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` (the peak RSS of the largest
process in the command's tree; measured from a small wrapper, because a child forked from a big
parent starts with the parent's pages), and for cases 3 and 4 also the sampled peak of the whole
tree's summed RSS. Inputs are read from the page cache (warmed by the warm-up round).

Writes ``OUT/report.md``, ``OUT/report.json`` and ``OUT/*.png``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from baselines import write_scripts
from cases_config import case_config_only, case_tensor_count
from cases_read import case_cold_start, case_inspect, case_verify
from cases_tensor import case_drop_kv, case_fp8
from machine import machine_info, measure_limits, versions
from measure import CORES, EXTRA_ROUNDS, GB, Bench, log, preload, rmtree
from models import check_space, prepare_models
from plots import plots
from report_md import markdown
from targets import evaluate_targets

# --------------------------------------------------------------------------- arguments

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="small sizes: 0.25 and 0.5 GB in 62.5 MB shards, fp8 case 0.25 GB")
    p.add_argument("--tiny", action="store_true",
                   help="smoke size: one 0.02 GB model in 10 MB shards, 1 round, no warm-up")
    p.add_argument("--sizes", default=None, help="model sizes in GB for cases 1-3 (default "
                   "1,2,4,8)")
    p.add_argument("--shard-mb", type=float, default=None, help="shard size (default 500)")
    p.add_argument("--fp8-size", type=float, default=None,
                   help="fp8-block model size in GB for case 4 (default 1)")
    p.add_argument("--many-gb", type=float, default=None,
                   help="size of the many-tensor model of case 1b (default 2.2 GB in 119 shards: "
                        "about the 273k tensors of nvidia/Kimi-K2.5-NVFP4)")
    p.add_argument("--many-shards", type=int, default=None)
    p.add_argument("--repeat", type=int, default=None,
                   help="timed rounds (default 2; quick 2, tiny 1)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default 1)")
    p.add_argument("--cases", default="1,2,3,4,5,6", help="which cases to run")
    p.add_argument("--extra-rounds", type=int, default=None,
                   help="at the largest size of cases 1-3, up to this many more rounds while "
                        "a command's runs differ by more than 1.25x (default 1; tiny 0)")
    p.add_argument("--budget-min", type=float, default=14.0,
                   help="extra rounds are only run while the whole run stays within this "
                        "many minutes (default 14)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where models and outputs go (default: a temporary directory beside "
                        "the system temp dir, removed afterwards); generated models are kept "
                        "and reused when given")
    p.add_argument("--out", type=Path, default=BENCH / "report", help="report directory")
    p.add_argument("--keep", action="store_true", help="keep the workdir's models")
    args = p.parse_args(argv)
    if args.quick and args.tiny:
        p.error("--quick and --tiny exclude each other")
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    defaults = {"full": ("1,2,4,8", 500, 1.0, 2, 1, 2.2, 119),
                "quick": ("0.25,0.5", 62.5, 0.25, 2, 1, 0.25, 30),
                "tiny": ("0.02", 10, 0.02, 1, 0, 0.02, 4)}[mode]
    args.mode = mode
    args.sizes = [float(s) for s in (args.sizes or defaults[0]).split(",") if s.strip()]
    args.shard_mb = args.shard_mb or defaults[1]
    args.fp8_size = args.fp8_size or defaults[2]
    args.repeat = args.repeat if args.repeat is not None else defaults[3]
    args.warmup = args.warmup if args.warmup is not None else defaults[4]
    args.many_gb = args.many_gb or defaults[5]
    args.many_shards = args.many_shards or defaults[6]
    args.cases = sorted({int(c) for c in args.cases.split(",") if c.strip()})
    if args.extra_rounds is None:
        args.extra_rounds = 0 if mode == "tiny" else 1
    return args




# --------------------------------------------------------------------------- the time budget

class Budget:
    """Whether the whole run stays within ``--budget-min`` minutes if the case running now at
    the largest size does one more round (EXTRA_ROUNDS["budget_ok"])."""

    def __init__(self, args, t_start: float):
        self.args, self.t_start = args, t_start
        self.sizes = sorted(args.sizes)
        self.spent: dict[tuple[int, float], float] = {}   # (case, size) -> seconds

    def reserve_after(self, case: int, size: float) -> float:
        """Estimated seconds of the work still to come after ``case`` at ``size`` (only used at
        the largest size): the later cases at this size, scaled from the size before it, and
        cases 4-6."""
        args, sizes = self.args, self.sizes
        prev = [s_ for s_ in sizes if s_ < size]
        est = 0.0
        for later in (c for c in (1, 2, 3) if c > case and c in args.cases):
            if prev:
                factor = size / prev[-1] * (1.7 if later == 3 else 1)  # case 3: 2 more cmds
                est += self.spent.get((later, prev[-1]), 0.0) * factor
        rounds = args.warmup + args.repeat
        est += (1 in args.cases) * (rounds * 8 * args.many_gb / 2.2 + 10)
        est += (4 in args.cases) * rounds * 30 * args.fp8_size
        est += (5 in args.cases) * (rounds * 8 * max(sizes) / 8 + 5)
        est += (6 in args.cases) * 35
        return est

    def ok_for(self, case: int, size: float):
        def ok(cost: float) -> bool:
            elapsed = time.perf_counter() - self.t_start
            return elapsed + cost + self.reserve_after(case, size) <= self.args.budget_min * 60
        return ok


# --------------------------------------------------------------------------- running the cases

SCALING = ((1, "config_only", "config-only patch"), (2, "verify", "verify"),
           (3, "drop_kv_scales", "drop-kv-scales"))


def scaling_case(b: Bench, case: int, args, pair: dict, size: float, warmup: int,
                 tensor_scripts: dict) -> dict:
    """Case 1, 2 or 3 at one size of the model ``pair`` (the FP8-KV model and its no-KV twin)."""
    kv, nokv = Path(pair["kv"]["path"]), Path(pair["nokv"]["path"])
    extras = size == max(args.sizes)
    if case == 1:
        return case_config_only(b, kv, size, args, warmup, extras=extras)
    if case == 2:
        return case_verify(b, kv, size, args, warmup)
    return case_drop_kv(b, nokv, kv, size, args, tensor_scripts, warmup, extras=extras)


def run_scaling(b: Bench, args, models: dict, cases: dict, tensor_scripts: dict,
                budget: Budget) -> None:
    """Cases 1-3 at every size, smallest first."""
    sizes = sorted(args.sizes)
    for size in sizes:
        pair = models["sizes"][size]
        gb = pair["kv"]["file_bytes"] / GB
        # The warm-up rounds run at the smallest size; larger models read the same
        # page-cached shards (hardlinks), and preload() makes sure they are cached.
        warmup = args.warmup if size == min(sizes) else 0
        log(f"preloading {size:g} GB into the page cache: "
            f"{preload(Path(pair['kv']['path'])):.1f} s")
        for case, key, label in SCALING:
            if case not in args.cases:
                continue
            log(f"case {case}: {label}, {size:g} GB")
            EXTRA_ROUNDS["budget_ok"] = budget.ok_for(case, size)
            t0 = time.perf_counter()
            r = scaling_case(b, case, args, pair, size, warmup, tensor_scripts)
            budget.spent[(case, size)] = time.perf_counter() - t0
            cases.setdefault(key, {"by_size": {}})["by_size"][size] = dict(r, model_gb=gb)


def run_single(b: Bench, args, models: dict, cases: dict) -> None:
    """Cases 1b and 4-6, at one size each."""
    if 1 in args.cases:
        log("case 1b: config-only patch at a real tensor count")
        many = models["many_tensors"]
        cases["config_only_tensor_count"] = case_tensor_count(b, Path(many["path"]), many, args)
    if 4 in args.cases:
        log("case 4: fp8-block-to-bf16")
        fp8 = models["fp8"]
        cases["fp8_to_bf16"] = dict(case_fp8(b, Path(fp8["path"]), args),
                                    model_gb=fp8["file_bytes"] / GB)
    big = models["sizes"][max(args.sizes)]["kv"]
    if 5 in args.cases:
        log("case 5: inspect")
        cases["inspect"] = dict(case_inspect(b, Path(big["path"]), big, args),
                                model_gb=big["file_bytes"] / GB, shards=big["shards"],
                                tensors=big["tensors"])
    if 6 in args.cases:
        log("case 6: cold start")
        cases["cold_start"] = case_cold_start(b, Path(big["path"]), args)


# --------------------------------------------------------------------------- the report

def new_report(args, argv, work: Path, notes: list[str]) -> dict:
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "benchmarks/run.py"] + (argv or sys.argv[1:])),
        "mode": args.mode,
        "args": {"sizes": args.sizes, "shard_mb": args.shard_mb, "fp8_size": args.fp8_size,
                 "repeat": args.repeat, "warmup": args.warmup, "cases": args.cases,
                 "extra_rounds": args.extra_rounds, "budget_min": args.budget_min,
                 "workdir": str(work)},
        "machine": machine_info(work), "versions": versions(), "cases": {}, "notes": notes,
    }


def note_starved_pool(report: dict) -> None:
    """A note when case 2's Pool baseline could not use every core (other work held them)."""
    starved = {size: v["pool_parallelism"]
               for size, v in report["cases"].get("verify", {}).get("by_size", {}).items()
               if v["pool_parallelism"] < 0.75 * CORES and v["model_gb"] >= 0.5}
    if starved:
        report["notes"].append(
            f"The hashlib Pool({CORES}) baseline of case 2 ran with a parallelism (CPU "
            f"seconds / wall seconds) of " + ", ".join(
                f"{p:.2f} at {s:g} GB" for s, p in sorted(starved.items()))
            + f" instead of up to {CORES}: other work held the other core(s) much of "
            f"the time, so the multi-core figures of this run are closer to one-core "
            f"ones (modelpatch parallelizes hashing and shard rewrites; the load/save "
            f"and cp baselines are single-threaded).")


def finish_report(report: dict, out_dir: Path, t_start: float) -> None:
    """Targets, plots, report.json and report.md."""
    report["machine"]["load_avg_end"] = os.getloadavg()
    note_starved_pool(report)
    # Keys of by_size become strings in JSON; use strings throughout for one shape.
    for case in report["cases"].values():
        if "by_size" in case:
            case["by_size"] = {f"{s:g}": v for s, v in case["by_size"].items()}
    report["models"]["sizes"] = {f"{s:g}": v for s, v in report["models"]["sizes"].items()}
    report["targets"] = evaluate_targets(report)
    report["plots"] = plots(report, out_dir)
    report["runtime_s"] = time.perf_counter() - t_start
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out_dir / "report.md").write_text(markdown(report))
    log(f"report: {out_dir / 'report.md'} ({report['runtime_s']:.0f} s)")
    for t in report["targets"]:
        log(f"  {t['verdict']:<6} {t['id']}: {t['measured']:.3f} (limit {t['limit']})")


# --------------------------------------------------------------------------- main

def make_workdir(args) -> tuple[Path, bool]:
    """The work directory, and whether it is this run's own (a temporary one)."""
    own_work = args.workdir is None
    work = (Path(tempfile.mkdtemp(prefix="modelpatch-bench-", dir="/var/tmp"))
            if own_work and os.path.isdir("/var/tmp") else
            Path(tempfile.mkdtemp(prefix="modelpatch-bench-")) if own_work else args.workdir)
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    return work, own_work


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    work, own_work = make_workdir(args)
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    check_space(args, work, notes)
    tensor_scripts = write_scripts(work / "scripts", args.cases)
    b = Bench(work, work / "scripts")
    EXTRA_ROUNDS["allowed"] = args.extra_rounds
    report = new_report(args, argv, work, notes)
    try:
        limit_bytes = int(min(1.0, max(args.sizes) / 4) * 2**30)
        log(f"physical limits on {limit_bytes / 2**20:.0f} MiB ...")
        report["limits"] = measure_limits(work, limit_bytes)
        report["models"] = models = prepare_models(args, work)
        run_scaling(b, args, models, report["cases"], tensor_scripts, Budget(args, t_start))
        run_single(b, args, models, report["cases"])
    finally:
        if own_work and not args.keep:
            rmtree(work)
        else:
            rmtree(work / "out")
            rmtree(work / "tmp")
            rmtree(work / "caches")
    finish_report(report, out_dir, t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
