#!/usr/bin/env python
"""The four speed and size targets, each side by side with the tool a user compares it with, in
one run, the commands of a job alternating round by round:

1. GGUF whole-file rewrite (a new chat template) of a 1-2 GB F16 GGUF against gguf-py's
   ``gguf_new_metadata.py`` (llama.cpp's ``gguf-new-metadata``): wall time <= 1.2x;
2. the header-only ``apply --in-place`` of the same file against one sha256 pass over it
   (hashlib, in a process of its own): <= 1.1x;
3. ``verify`` of the 16,823-tensor fp8-block-to-bf16 variant (bench_dequant_scaling.py's 0.25 GB,
   24-shard fp8-block model, converted) against hashlib over ``multiprocessing.Pool(cores)``
   (baselines.HASH_FILES): <= 1.2x;
4. the provenance manifest of ``nvfp4-to-bf16`` at Kimi-K2.5's scale (119 shards, 273k tensors),
   built from a change log shaped like the planner's (bench_manifest.py), without the 540 GB:
   <= 1 MB.

    PYTHONPATH=. python benchmarks/bench_speed_targets.py --gb 1 --rounds 3 [--before DIR]
        [--profile] [--only gguf inplace verify manifest]

``--before DIR``: a checkout of an earlier commit (``git archive REV | tar -x -C DIR``) whose
``modelpatch`` runs as one more command of jobs 1 and 2, in the same rounds. ``--profile``: a
cProfile of each modelpatch command (top functions by own time) into the report. Wall and CPU
seconds (user + system, from ``wait4``) per command; medians; the load average before and after.
Writes ``--report``.md and .json (default benchmarks/report/speed-targets).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
from baselines import HASH_FILES  # noqa: E402
from bench_gguf import TEMPLATE, make_gguf  # noqa: E402

PY = sys.executable
TARGETS = {"gguf": 1.2, "inplace": 1.1, "verify": 1.2, "manifest": 1_000_000}
CHAT = ("modelpatch: 1\nname: chat\ndescription: new template\ngguf:\n  metadata:\n"
        "    - {set: tokenizer.chat_template, from: chat_template.jinja}\n")
CTX = ("modelpatch: 1\nname: ctx\ndescription: context length\ngguf:\n  metadata:\n"
       "    - {set: \"{arch}.context_length\", value: 8192, type: uint32}\n")
SHA256 = ("import hashlib, sys\nwith open(sys.argv[1], 'rb') as f:\n"
          "    hashlib.file_digest(f, 'sha256')\n")
# records a file's digest in the digest cache, as a verify or an earlier apply would have
REMEMBER = ("import os, sys, time\nfrom patcher.integrity.digests.digest_cache import KnownDigests"
            "\np = sys.argv[1]\nt = time.time() - 60\nos.utime(p, (t, t))\n"
            "KnownDigests().digests([p])\n")


def run(argv: list[str], env: dict | None = None, profile: Path | None = None) -> dict:
    """Wall and CPU seconds of ``argv`` (its waited-for children included). A modelpatch command
    runs in the directory of its checkout: ``python -m`` puts the working directory first on the
    path, before PYTHONPATH."""
    if profile is not None:
        argv = [argv[0], "-m", "cProfile", "-o", str(profile), *argv[1:]]
    cwd = env.get("PYTHONPATH") if env is not None else None
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv[:6]} failed ({proc.returncode}): {err[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime}


def env_for(code: Path, cache: Path) -> dict:
    """The environment of a command run from the checkout ``code``: its byte code is written
    (in the warm-up round) and read, as from an installed package."""
    env = {**os.environ, "PYTHONPATH": str(code), "MODELPATCH_CACHE_DIR": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def at_rest(path: Path) -> None:
    """Wait until ``path`` was last changed 2 s ago (not timed): a file just written is not
    taken from the header or digest caches, and a user's model is not that fresh."""
    time.sleep(max(0.0, 2.1 - (time.time() - path.stat().st_ctime)))


def mp(*args) -> list[str]:
    return [PY, "-m", "patcher.cli", "-q", *map(str, args)]


def alternate(commands: dict, rounds: int) -> dict[str, list[dict]]:
    """Each command once per round, in turn, after a warm-up round that is not kept."""
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    for round_no in range(rounds + 1):
        for name, fn in commands.items():
            r = fn()
            if round_no:
                runs[name].append(r)
    return runs


def summary(runs: dict[str, list[dict]]) -> dict:
    return {name: {"wall_s": statistics.median(r["wall_s"] for r in rs),
                   "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                   "walls": [round(r["wall_s"], 3) for r in rs]} for name, rs in runs.items()}


def job_gguf(work: Path, codes: dict[str, Path], rounds: int) -> dict:
    base = work / "gguf" / "base"
    (work / "gguf" / "chat_template.jinja").write_text(TEMPLATE)
    recipe = work / "gguf" / "chat.yaml"
    recipe.write_text(CHAT)
    out = work / "gguf" / "out"
    new_meta = Path(__import__("gguf").__file__).parent / "scripts" / "gguf_new_metadata.py"

    def reference():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        return run([PY, str(new_meta), str(base / "model.gguf"), str(out / "model.gguf"),
                    "--chat-template-file", str(work / "gguf" / "chat_template.jinja"),
                    "--force"])

    def apply(code: Path, known: bool):
        def go():
            cache = work / "caches" / f"gguf-{code.name}-{known}"
            if not known:
                shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            return run(mp("apply", recipe, base, "-o", out), env_for(code, cache))
        return go

    commands = {"gguf_new_metadata.py": reference}
    for label, code in codes.items():
        commands[f"modelpatch apply ({label}), base digest known"] = apply(code, True)
        commands[f"modelpatch apply ({label}), base digest unknown"] = apply(code, False)
    res = summary(alternate(commands, rounds))
    shutil.rmtree(out, ignore_errors=True)
    return {"commands": res, "bytes": (base / "model.gguf").stat().st_size,
            "ratios": {k: res[k]["wall_s"] / res["gguf_new_metadata.py"]["wall_s"]
                       for k in res if k != "gguf_new_metadata.py"}}


def job_inplace(work: Path, codes: dict[str, Path], rounds: int) -> dict:
    base = work / "gguf" / "base" / "model.gguf"
    recipe = work / "gguf" / "ctx.yaml"
    recipe.write_text(CTX)
    live = work / "inplace" / "model.gguf"

    def fresh_copy(cache: Path, known: bool, code: Path) -> None:
        """A new copy of the base (not timed), made durable; its digest in the cache or not."""
        shutil.rmtree(live.parent, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        live.parent.mkdir(parents=True)
        subprocess.run(["cp", str(base), str(live)], check=True)
        subprocess.run(["sync", str(live)], check=True)
        if known:
            subprocess.run([PY, "-c", REMEMBER, str(live)], check=True, env=env_for(code, cache),
                           cwd=code)
        at_rest(live)

    def apply(code: Path, known: bool):
        def go():
            cache = work / "caches" / f"inplace-{code.name}"
            fresh_copy(cache, known, code)
            return run(mp("apply", recipe, live, "--in-place"), env_for(code, cache))
        return go

    commands = {"sha256, one pass (hashlib)": lambda: run([PY, "-c", SHA256, str(base)])}
    for label, code in codes.items():
        commands[f"apply --in-place ({label}), base digest known"] = apply(code, True)
        commands[f"apply --in-place ({label}), base digest unknown"] = apply(code, False)
    res = summary(alternate(commands, rounds))
    shutil.rmtree(live.parent, ignore_errors=True)
    yard = res["sha256, one pass (hashlib)"]["wall_s"]
    return {"commands": res, "bytes": base.stat().st_size,
            "ratios": {k: res[k]["wall_s"] / yard for k in res if k.startswith("apply")}}


def job_verify(work: Path, rounds: int) -> dict:
    import synth

    model = work / "fp8" / "base"
    variant = work / "fp8" / "variant"
    info = synth.generate(model, size_gb=0.25, shards=24, fmt="fp8-block", kv_cache="none",
                          sync=False)
    if not (variant / "modelpatch.provenance.json").is_file():
        run(mp("apply", "fp8-block-to-bf16", model, "-o", variant, "--force"),
            env_for(REPO, work / "caches" / "fp8-apply"))
    script = work / "hash_files.py"
    script.write_text(HASH_FILES)
    cores = len(os.sched_getaffinity(0))
    cache = work / "caches" / "verify"
    commands = {
        "modelpatch verify": lambda: run(mp("verify", variant), env_for(REPO, cache)),
        f"hashlib Pool({cores})": lambda: run([PY, str(script), str(variant), str(cores)])}
    res = summary(alternate(commands, rounds))
    manifest = variant / "modelpatch.provenance.json"
    return {"commands": res, "tensors": info["tensors"],
            "variant_bytes": sum(p.stat().st_size for p in variant.iterdir() if p.is_file()),
            "manifest_bytes": manifest.stat().st_size,
            "ratios": {"modelpatch verify": res["modelpatch verify"]["wall_s"]
                       / res[f"hashlib Pool({cores})"]["wall_s"]}}


def job_manifest(work: Path) -> dict:
    import bench_manifest

    changes = bench_manifest.change_log(273_000)
    where = work / "manifest"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    start = time.process_time()
    data = bench_manifest.build_and_write(changes, where)
    built = time.process_time() - start
    from patcher.integrity.manifest import read_manifest

    start = time.process_time()
    read_manifest(where)
    return {"tensors": 273_000, "shards": 119, "change_log_entries": len(changes),
            "manifest_bytes": len(data), "build_cpu_s": built,
            "read_cpu_s": time.process_time() - start}


def profiles(work: Path, codes: dict[str, Path], out: Path) -> dict[str, str]:
    """cProfile of each modelpatch command of jobs 1 and 2 (digest known), top 15 by own time."""
    import pstats

    texts = {}
    base = work / "gguf" / "base"
    for label, code in codes.items():
        for what in ("apply", "apply --in-place"):
            cache = work / "caches" / f"profile-{label}"
            if what == "apply":
                shutil.rmtree(work / "gguf" / "out", ignore_errors=True)
                argv = mp("apply", work / "gguf" / "chat.yaml", base, "-o", work / "gguf" / "out")
                run(argv, env_for(code, cache))                 # the base's digest now known
                shutil.rmtree(work / "gguf" / "out", ignore_errors=True)
            else:
                live = work / "inplace" / "model.gguf"
                shutil.rmtree(live.parent, ignore_errors=True)
                live.parent.mkdir(parents=True)
                subprocess.run(["cp", str(base / "model.gguf"), str(live)], check=True)
                subprocess.run([PY, "-c", REMEMBER, str(live)], check=True,
                               env=env_for(code, cache), cwd=code)
                at_rest(live)
                argv = mp("apply", work / "gguf" / "ctx.yaml", live, "--in-place")
            prof = work / f"profile-{label}-{what.replace(' ', '')}.pstats"
            r = run(argv, env_for(code, cache), profile=prof)
            text = out.parent / f"{out.name}-profile-{label}-{what.replace(' --', '-')}.txt"
            with open(text, "w") as f:
                f.write(f"# {what} ({label}), base digest known: {r['wall_s']:.2f} s wall, "
                        f"{r['cpu_s']:.2f} CPU-s under cProfile; load average "
                        f"{os.getloadavg()[0]:.1f}\n")
                pstats.Stats(str(prof), stream=f).sort_stats("tottime").print_stats(15)
            texts[f"{what} ({label})"] = text.name
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/modelpatch-bench-targets"))
    ap.add_argument("--before", type=Path, default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--only", nargs="*", default=["gguf", "inplace", "verify", "manifest"])
    ap.add_argument("--report", type=Path, default=BENCH / "report" / "speed-targets")
    args = ap.parse_args()
    work = args.workdir
    (work / "gguf" / "base").mkdir(parents=True, exist_ok=True)
    gguf_file = work / "gguf" / "base" / "model.gguf"
    if not gguf_file.exists():
        make_gguf(gguf_file, args.gb)
    codes = {"this": REPO, **({"before": args.before.resolve()} if args.before else {})}
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "cores": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(),
              "argv": sys.argv[1:], "targets": TARGETS}
    if "gguf" in args.only:
        result["gguf"] = job_gguf(work, codes, args.rounds)
    if "inplace" in args.only:
        result["inplace"] = job_inplace(work, codes, args.rounds)
    if "verify" in args.only:
        result["verify"] = job_verify(work, args.rounds)
    if "manifest" in args.only:
        result["manifest"] = job_manifest(work)
    if args.profile:
        result["profiles"] = profiles(work, codes, args.report)
    result["load_after"] = os.getloadavg()
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
