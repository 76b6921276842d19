#!/usr/bin/env python
"""``--executor ray`` on a local Ray cluster of 1..N worker processes against the local
executor at the same parallelism, the per-task figures, and from them a projection (labelled as
one) for a 540 GB -> 2 TB dequantization across k nodes.

Same parallelism: each measurement runs in a child process pinned to N cores (``taskset``), so
the local executor (``jobs=N``: N workers, cores // N = 1 torch thread each; with N = 1 the
driver itself) and the Ray cluster (``ray.init(num_cpus=N)``, one CPU per task, ``jobs=N`` tasks
in flight: N workers, one torch thread each) get the same cores. Both time ``api.apply`` in one
driver, rounds + 1 times: the first imports torch (and starts Ray's workers); the local pool
starts its workers on every call (``-j 1`` has none), Ray keeps them. ``ray.init`` is timed
apart. Needs ray (``pip install -e '.[ray]'``).

Usage: python benchmarks/bench_ray.py [--gb 0.4] [--shards 8] [--workers 1,2] [--rounds 2]
       [--workdir /var/tmp/mp-bench-ray] [--out benchmarks/report]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

GB = 1e9
RECIPE = "fp8-block-to-bf16"


def one(args) -> dict:
    """One measurement, in this process (pinned by the parent): ``local`` or ``ray``."""
    import contextlib

    from patcher import api

    model, out, n = Path(args.model), Path(args.workdir) / "out", args.workers
    shutil.rmtree(out, ignore_errors=True)
    result, on_ray = {"init_s": 0.0, "apply_s": []}, contextlib.nullcontext()
    if args.one == "ray":
        import ray

        from patcher.execute.ray_executor import executing_on_ray

        t0 = time.perf_counter()
        ray.init(num_cpus=n, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
        result["init_s"] = time.perf_counter() - t0
        on_ray = executing_on_ray(cpus_per_task=1)
    with on_ray:
        for _ in range(args.rounds + 1):          # the first: torch and the workers start
            t0 = time.perf_counter()
            api.apply(RECIPE, model, out=out, jobs=n)
            result["apply_s"].append(time.perf_counter() - t0)
            shutil.rmtree(out)
    return result


def per_task(model: Path, work: Path) -> dict:
    """The largest shard task written here with one torch thread: bytes read and written, and
    seconds (dequantize, write, fsync, sha256 of the output and of its source)."""
    import torch

    from patcher import api
    from patcher.tensors.writing.shard_writer import write_shard

    torch.set_num_threads(1)
    the_plan = api.plan(RECIPE, model)
    task = max((fp.shard_task for fp in the_plan.files if fp.shard_task is not None),
               key=lambda t: t.file_size)
    read = sum(s.nbytes for j in task.jobs for s in j.inputs)
    source = task.jobs[0].inputs[0].path
    runs = []
    for i in range(3):
        target = work / f"task-{i}.safetensors"
        target.unlink(missing_ok=True)
        t0 = time.perf_counter()
        write_shard(task, target, None, frozenset({source}))
        runs.append(time.perf_counter() - t0)
        target.unlink()
    best = min(runs[1:])
    return {"read_bytes": read, "written_bytes": task.file_size, "seconds": runs,
            "out_gbps_per_core": task.file_size / best / GB,
            "in_gbps_per_core": read / best / GB}


def measure(args) -> dict:
    import machine
    import synth

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = Path(synth.generate(work / "model", size_gb=args.gb, shards=args.shards,
                                fmt="fp8-block")["path"])
    results = {"model": {"gb": args.gb, "shards": args.shards,
                         "bytes": sum(p.stat().st_size for p in model.iterdir())},
               "cores": os.cpu_count(), "machine": machine.machine_info(work),
               "limits": machine.measure_limits(work, 512 << 20),
               "per_task": per_task(model, work), "runs": {}}
    for n in args.workers:
        for executor in ("local", "ray"):
            cpus = f"0-{n - 1}"
            cmd = ["taskset", "-c", cpus, sys.executable, __file__, "--one", executor,
                   "--workers", str(n), "--model", str(model), "--workdir", str(work),
                   "--rounds", str(args.rounds)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
            results["runs"][f"{executor}-{n}"] = json.loads(done.stdout.strip().splitlines()[-1])
            print(executor, n, results["runs"][f"{executor}-{n}"], file=sys.stderr)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=0.4)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workdir", default="/var/tmp/mp-bench-ray")
    p.add_argument("--out", default=str(BENCH / "report"))
    p.add_argument("--one", choices=("local", "ray"), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        args.workers = int(args.workers)
        print(json.dumps(one(args)))
        return 0
    args.workers = [int(n) for n in args.workers.split(",")]
    results = measure(args)
    out = Path(args.out)
    (out / "ray.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    from ray_report import render

    (out / "ray.md").write_text(render(results))
    print(out / "ray.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

