#!/usr/bin/env python
"""Dequantization at the hardware's speed on one machine, side by side: the -j scaling curve of
fp8-block-to-bf16 and nvfp4-to-bf16 on the CPU against the hand-written torch scripts, the CUDA path
against the best CPU run and the fsync write bandwidth, verify against hashlib Pool(cores), and the
manifest encoding at 273k tensors.

Every command is a subprocess; wall time, and CPU seconds from ``wait4`` (its whole tree). Rounds
alternate their order. Results go to ``--out/dequant-scaling-<label>.json`` (one file per machine,
committed), and ``dequant-scaling.md`` plus ``dequant_scaling.png`` are rendered from every such
file there, so rerunning on one machine keeps the figures of the others (``--render`` only renders).

Usage: python benchmarks/bench_dequant_scaling.py --label LABEL [--fp8-gb 2] [--nvfp4-gb 2]
       [--shards 24] [--rounds 2] [--jobs 1,2,4,8,16] [--cuda] [--cuda-jobs 1,4,8] [--workdir DIR]
       [--budget-s 520] [--recipes fp8-block-to-bf16,nvfp4-to-bf16]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import baselines  # noqa: E402
from baselines_dequant import FP8_CAST_BF16_DEVICE, NVFP4_TO_BF16  # noqa: E402

PY = sys.executable
GB = 1e9


def run(cmd: list, env: dict | None = None) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                         f"{err.decode()[-2000:]}")
    return {"wall_s": wall, "stdout": out.decode()}


def run_timed(cmd: list, env: dict | None = None) -> dict:
    """Wall and CPU seconds of ``cmd`` and everything it waited for."""
    before = os.times()
    r = run(cmd, env)
    after = os.times()
    r["cpu_s"] = ((after.children_user - before.children_user)
                  + (after.children_system - before.children_system))
    r["stdout"] = r["stdout"][-400:]
    return r


def limits(work: Path) -> dict:
    data = os.urandom(1 << 20) * 1024
    start = time.perf_counter()
    hashlib.sha256(data).digest()
    sha = len(data) / (time.perf_counter() - start) / GB
    path = work / "fsync.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(2):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    write = 2 * len(data) / (time.perf_counter() - start) / GB
    path.unlink()
    return {"sha256_gbps_per_core": sha, "fsync_write_gbps": write}


def env_for(cache: Path, extra: dict | None = None) -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, MODELPATCH_CACHE_DIR=str(cache))
    env.update(extra or {})
    return env


def out_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.glob("*.safetensors"))


def subjects(d: Path) -> dict:
    doc = json.loads((d / "modelpatch.provenance.json").read_text())
    return {s["name"]: s["digest"]["sha256"] for s in doc["subject"]}


class Case:
    def __init__(self, work: Path, recipe: str, model: Path, script: Path):
        self.work, self.recipe, self.model, self.script = work, recipe, model, script
        self.digests: dict[str, dict] = {}

    def mp(self, name: str, jobs: str | None, device: str = "cpu", extra: dict | None = None):
        def go():
            out, cache = self.work / "out", self.work / "cache"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
            os.sync()
            cmd = [PY, "-m", "patcher.cli", "apply", self.recipe, self.model, "-o", out, "-q",
                   "--device", device] + (["-j", jobs] if jobs else [])
            r = run_timed(cmd, env_for(cache, extra))
            r["out_bytes"] = out_bytes(out)
            self.digests[name] = subjects(out)
            return r
        return go

    def script_run(self, device: str = "cpu"):
        def go():
            out = self.work / "out"
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            r = run_timed([PY, self.script, self.model, out, device])
            r["out_bytes"] = out_bytes(out)
            return r
        return go


def rounds(commands: dict, n: int, deadline: float) -> dict:
    runs: dict[str, list] = {k: [] for k in commands}
    for i in range(n):
        order = list(commands) if i % 2 == 0 else list(reversed(commands))
        for name in order:
            if time.monotonic() > deadline and runs[name]:
                continue
            runs[name].append(commands[name]())
            print(f"  {name}: {runs[name][-1]['wall_s']:.2f} s, "
                  f"{runs[name][-1]['cpu_s']:.1f} CPU-s", flush=True)
    return {k: {"wall_s": statistics.median(r["wall_s"] for r in v),
                "cpu_s": statistics.median(r["cpu_s"] for r in v),
                "out_bytes": v[0]["out_bytes"], "runs": [(r["wall_s"], r["cpu_s"]) for r in v]}
            for k, v in runs.items() if v}


CUDA_JOBS = ["1", "4", "8"]
RECIPES = (("fp8-block", "fp8-block-to-bf16"), ("nvfp4", "nvfp4-to-bf16"))


def cuda_case(case: Case, n: int, deadline: float) -> dict:
    gpu = {"torch_script_cuda": case.script_run("cuda")}
    gpu.update({f"cuda_j{j}": case.mp(f"cuda_j{j}", j, "cuda") for j in CUDA_JOBS})
    return rounds(gpu, n, deadline)


def profile(case: Case, device: str) -> str:
    """cProfile of an in-process ``apply -j 1`` (the CPU time of this process only)."""
    out, cache = case.work / "out", case.work / "cache"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    code = ("import cProfile, pstats, sys; from patcher.cli import main; "
            f"sys.argv = ['modelpatch', 'apply', {case.recipe!r}, {str(case.model)!r}, '-o', "
            f"{str(out)!r}, '-q', '-j', '1', '--device', {device!r}]\n"
            "p = cProfile.Profile(); p.enable()\n"
            "try: main()\nexcept SystemExit: pass\n"
            "p.disable(); pstats.Stats(p).sort_stats('tottime').print_stats(18)")
    r = run([PY, "-c", code], env_for(cache))
    text = r["stdout"]
    return text[max(0, text.find("function calls")):]


def tensor_case(case: Case, jobs: list[str], cuda: bool, n: int, deadline: float) -> dict:
    commands = {"torch_script": case.script_run()}
    commands.update({f"j{j}": case.mp(f"j{j}", j) for j in jobs})
    split = str(max(1, len(os.sched_getaffinity(0)) // 2))   # what an unset -j chooses
    if split not in jobs:
        commands["default"] = case.mp("default", None)
    res = {"cpu": rounds(commands, n, deadline)}
    if "default" not in res["cpu"]:
        res["cpu"]["default"] = res["cpu"][f"j{split}"]
        case.digests["default"] = case.digests[f"j{split}"]
    if cuda:            # the budget trims later rounds, never a whole part
        res["cuda"] = cuda_case(case, n, deadline)
    ref = case.digests.get("default")
    res["identical_to_default"] = {k: v == ref for k, v in case.digests.items()}
    return res


def verify_case(work: Path, case: Case, n: int) -> dict:
    out, cores = work / "out", str(len(os.sched_getaffinity(0)))
    case.mp("verify-setup", None)()
    script = work / "hash_files.py"
    script.write_text(baselines.HASH_FILES)
    commands = {"modelpatch_verify": lambda: run_timed(
                    [PY, "-m", "patcher.cli", "verify", out, "-q"], env_for(work / "vcache")),
                "hashlib_pool": lambda: run_timed([PY, script, out, cores])}
    for c in commands.values():
        c()                                                   # warm-up
    res = {}
    for name, r in rounds({k: (lambda f=f: dict(f(), out_bytes=out_bytes(out)))
                           for k, f in commands.items()}, n, float("inf")).items():
        res[name] = r
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", required=False, default=platform.node())
    p.add_argument("--fp8-gb", type=float, default=2.0)
    p.add_argument("--nvfp4-gb", type=float, default=2.0)
    p.add_argument("--shards", type=int, default=24)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--jobs", default="1,2,4,8,16")
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--cuda-jobs", default=",".join(CUDA_JOBS))
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/mp-dequant-scaling"))
    p.add_argument("--out", type=Path, default=BENCH / "report")
    p.add_argument("--budget-s", type=float, default=520)
    p.add_argument("--manifest-tensors", type=int, default=273_000)
    p.add_argument("--parts", default="cpu,cuda,verify,manifest,openmp,import",
                   help="also: profile; results update the machine's stored file")
    p.add_argument("--recipes", default="fp8-block-to-bf16,nvfp4-to-bf16",
                   help="which recipes' models to build and measure")
    p.add_argument("--render", action="store_true", help="only render the stored results")
    args = p.parse_args()
    if not args.render:
        measure(args)
    from dequant_scaling_report import render
    render(args.out)


def measure(args) -> None:
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    jobs = [j for j in args.jobs.split(",") if int(j) <= cores]
    CUDA_JOBS[:] = args.cuda_jobs.split(",")
    out_path = args.out / f"dequant-scaling-{args.label}.json"
    parts = set(args.parts.split(","))
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    result.update({"label": args.label, "cores": cores, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                         time.gmtime()),
              "cpu": platform.processor() or platform.machine(), "limits": limits(work)})
    print(result["limits"], flush=True)
    if args.cuda:
        import torch
        result["gpu"] = torch.cuda.get_device_name(0)
    models = {}
    recipes = [(fmt, recipe) for fmt, recipe in RECIPES if recipe in args.recipes.split(",")]
    sizes = {"fp8-block": args.fp8_gb, "nvfp4": args.nvfp4_gb}
    for fmt, size in ((fmt, sizes[fmt]) for fmt, _ in recipes):
        models[fmt] = work / f"{fmt}-{size:g}"
        run([PY, BENCH / "synth.py", models[fmt], "--size-gb", size, "--shards", args.shards,
             "--format", fmt, "--kv-cache", "none"])
        subprocess.run(["cat", *models[fmt].glob("*.safetensors")], stdout=subprocess.DEVNULL)
    scripts = {"fp8-block": work / "fp8_cast_bf16.py", "nvfp4": work / "nvfp4_to_bf16.py"}
    scripts["fp8-block"].write_text(FP8_CAST_BF16_DEVICE)
    scripts["nvfp4"].write_text(NVFP4_TO_BF16)
    def save():
        result["runtime_s"] = time.monotonic() - t0
        out_path.write_text(json.dumps(result, indent=1))
        if os.environ.get("OUT"):
            shutil.copy(out_path, os.environ["OUT"])

    for fmt, recipe in recipes:
        print(recipe, flush=True)
        case = Case(work, recipe, models[fmt], scripts[fmt])
        if "cpu" in parts:
            result[recipe] = tensor_case(case, jobs, "cuda" in parts and args.cuda,
                                         args.rounds, deadline)
        elif "cuda" in parts and args.cuda:
            result.setdefault(recipe, {})["cuda"] = cuda_case(case, args.rounds, deadline)
            case.mp("default", None)()          # the CPU bytes the CUDA ones must equal
            result[recipe].setdefault("identical_to_default", {}).update(
                {k: v == case.digests["default"] for k, v in case.digests.items()
                 if k.startswith("cuda")})
        if "profile" in parts and time.monotonic() < deadline:
            for device in ("cpu", "cuda") if args.cuda else ("cpu",):
                result.setdefault("profiles", {})[f"{recipe} {device} -j 1"] = profile(case,
                                                                                       device)
        save()
    if "import" in parts:
        starts = {"python_import_torch": "import torch"}
        if args.cuda:
            starts["python_import_torch_cuda_init"] = ("import torch; "
                                                       "torch.zeros(1, device='cuda')")
        result["torch_import"] = rounds({k: lambda c=c: dict(run_timed([PY, "-c", c]),
                                                             out_bytes=0)
                                         for k, c in starts.items()}, 3, float("inf"))
        save()
    if "verify" in parts:
        print("verify", flush=True)
        case = Case(work, "fp8-block-to-bf16", models["fp8-block"], scripts["fp8-block"])
        result["verify"] = verify_case(work, case, 3)
        save()
    if "manifest" in parts and time.monotonic() < deadline:
        r = run([PY, BENCH / "bench_manifest.py", "--repeat", "1",
                 "--tensors", args.manifest_tensors],
                env_for(work / "cache"))
        result["manifest_273k"] = json.loads(r["stdout"][r["stdout"].index("{"):]) \
            if "{" in r["stdout"] else None
        save()
    if "openmp" in parts and time.monotonic() < deadline:
        print("openmp spinning (-j 1)", flush=True)
        case = Case(work, "fp8-block-to-bf16", models["fp8-block"], scripts["fp8-block"])
        result["openmp_wait_policy_j1"] = rounds(
            {"passive": case.mp("p", "1"), "active": case.mp("a", "1", extra={
                "OMP_WAIT_POLICY": "ACTIVE"})}, 1, float("inf"))
        save()


if __name__ == "__main__":
    main()
