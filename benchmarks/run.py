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
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import synth

PY = sys.executable
GB = 1e9
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

# --------------------------------------------------------------------------- child scripts

# Runs one command and prints, as JSON on its own stdout: wall_s (until the command itself
# exits), rc, maxrss (getrusage(RUSAGE_CHILDREN).ru_maxrss: the largest process of the command's
# tree), and with "sample" the sampled peaks of the tree's summed RSS and of its largest process.
# The wrapper makes itself a child subreaper, so descendants that outlive their parent (a
# multiprocessing fork server and the workers it forked, which modelpatch itself never waits
# for) are reparented to it and reaped here: their peak RSS then counts in RUSAGE_CHILDREN too.
WRAPPER = r"""
import ctypes, json, os, resource, subprocess, sys, threading, time
spec = json.loads(sys.argv[1])
try:
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
    subreaper = True
except (OSError, AttributeError):
    subreaper = False
out = open(spec["stdout"], "wb")
err = open(spec["stderr"], "wb")
tree_peak, proc_peak = [0], [0]
done = threading.Event()
def sample(pid):
    import psutil
    me = psutil.Process()
    while not done.is_set():
        total = 0
        try:
            procs = me.children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                rss = p.memory_info().rss
            except psutil.Error:
                continue
            total += rss
            proc_peak[0] = max(proc_peak[0], rss)
        tree_peak[0] = max(tree_peak[0], total)
        done.wait(0.05)
t0 = time.perf_counter()
proc = subprocess.Popen(spec["cmd"], stdout=out, stderr=err, cwd=spec.get("cwd"),
                        env=spec.get("env"))
sampler = None
if spec.get("sample"):
    sampler = threading.Thread(target=sample, args=(proc.pid,), daemon=True)
    sampler.start()
rc = proc.wait()
wall = time.perf_counter() - t0
stragglers = 0
deadline = time.monotonic() + 30
while subreaper:                       # reap what the command left behind (fork servers ...)
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    else:
        stragglers += 1
done.set()
if sampler is not None:
    sampler.join()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "rc": rc, "maxrss": ru.ru_maxrss * 1024,
                  "tree_peak": tree_peak[0] or None, "proc_peak": proc_peak[0] or None,
                  "stragglers": stragglers, "user_s": ru.ru_utime, "sys_s": ru.ru_stime}))
"""

EDIT_JSON = r"""
import json, os, sys
d = sys.argv[1]
path = os.path.join(d, "config.json")
with open(path) as f:
    config = json.load(f)
for scope in (config, config.get("text_config") or {}):
    quant = scope.get("quantization_config")
    if isinstance(quant, dict):
        quant.pop("kv_cache_scheme", None)
with open(path, "w") as f:
    json.dump(config, f, indent=4)
path = os.path.join(d, "hf_quant_config.json")
if os.path.exists(path):
    with open(path) as f:
        hq = json.load(f)
    hq.get("quantization", {}).pop("kv_cache_quant_algo", None)
    hq.pop("kv_cache_quant_algo", None)
    with open(path, "w") as f:
        json.dump(hq, f, indent=4)
"""

HASH_FILES = r"""
import hashlib, os, sys
from multiprocessing import Pool

def digest(path):
    with open(path, "rb") as f:
        return path, hashlib.file_digest(f, "sha256").hexdigest()

root, jobs = sys.argv[1], int(sys.argv[2])
files = sorted((os.path.join(root, n) for n in os.listdir(root)
                if n != "modelpatch.provenance.json" and os.path.isfile(os.path.join(root, n))),
               key=os.path.getsize, reverse=True)
if jobs == 1:
    results = [digest(p) for p in files]
else:
    with Pool(jobs) as pool:
        results = pool.map(digest, files, chunksize=1)
print(len(results), sum(os.path.getsize(p) for p in files))
"""

SAFE_OPEN_HEADERS = r"""
import sys
from pathlib import Path
from safetensors import safe_open

count = 0
for path in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with safe_open(str(path), framework="pt") as f:
        f.metadata()
        for name in f.keys():
            s = f.get_slice(name)
            s.get_shape(), s.get_dtype()
            count += 1
print(count)
"""


def bench_tensor_scripts() -> dict:
    """The baselines of benchmarks/bench_tensor.py (owned by the tensor-transform work)."""
    try:
        import bench_tensor
        return {"load_save_drop": bench_tensor.LOAD_SAVE_DROP,
                "fp8_cast_bf16": bench_tensor.FP8_CAST_BF16,
                "kv_scale_re": bench_tensor.KV_SCALE_RE}
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"run.py: cases 3 and 4 reuse the baselines of benchmarks/"
                         f"bench_tensor.py, which cannot be imported: {exc!r}")


def bench_inspect_baseline() -> str:
    """The safe_open + get_tensor baseline of benchmarks/bench_inspect.py."""
    try:
        import bench_inspect
        return bench_inspect.BASELINE
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"run.py: case 5 reuses benchmarks/bench_inspect.py's baseline, which "
                         f"cannot be imported: {exc!r}")


def modelpatch_cmd() -> list[str]:
    exe = Path(PY).with_name("modelpatch")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("modelpatch")
    return [found] if found else [PY, "-c", "from patcher.cli import main; main()"]


# --------------------------------------------------------------------------- measuring

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, work: Path, scripts: Path):
        self.work, self.scripts = work, scripts
        self.tmp = work / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        (work / "out").mkdir(exist_ok=True)
        (work / "caches").mkdir(exist_ok=True)
        self.mp = modelpatch_cmd()
        self.base_env = {k: v for k, v in os.environ.items()
                         if k not in ("MODELPATCH_DEBUG", "MODELPATCH_CACHE_DIR")}
        # modelpatch commands that are not given a cache of their own use this one, never the
        # user's ~/.cache/modelpatch.
        self.base_env["MODELPATCH_CACHE_DIR"] = str(work / "caches" / "default")
        self._n = 0

    def env(self, cache: Path | None = None) -> dict:
        env = dict(self.base_env)
        if cache is not None:
            env["MODELPATCH_CACHE_DIR"] = str(cache)
        return env

    def fresh(self, stem: str) -> Path:
        self._n += 1
        return self.tmp / f"{stem}-{self._n}"

    def measure(self, cmd: list[str], *, env: dict | None = None, sample: bool = False,
                check: bool = True) -> dict:
        out, err = self.fresh("stdout"), self.fresh("stderr")
        spec = {"cmd": [str(c) for c in cmd], "env": env or self.base_env, "stdout": str(out),
                "stderr": str(err), "sample": sample}
        proc = subprocess.run([PY, "-c", WRAPPER, json.dumps(spec)], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"run.py: the measuring wrapper failed:\n{proc.stderr[-3000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["stdout"] = out.read_text(errors="replace")
        r["stderr"] = err.read_text(errors="replace")
        out.unlink()
        err.unlink()
        if check and r["rc"] != 0:
            raise SystemExit(f"run.py: command failed ({r['rc']}): {shlex.join(spec['cmd'])}\n"
                             f"{r['stderr'][-3000:]}")
        return r


def rmtree(path: Path) -> None:
    if not (path.exists() or path.is_symlink()):
        return

    def onerror(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o755)
        os.chmod(p, 0o755) if os.path.isdir(p) else None
        func(p)

    shutil.rmtree(path, onerror=onerror)


def stats(runs: list[dict], key: str = "wall_s") -> dict:
    vals = [r[key] for r in runs if r.get(key) is not None]
    if not vals:
        return {}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "runs": vals}


EXTRA_ROUNDS = {"allowed": 0, "budget_ok": lambda cost: False}
SPREAD_LIMIT = 1.25


def alternate(commands: dict[str, Callable[[], dict]], repeat: int, warmup: int,
              label: str, extra: bool = False) -> dict[str, list[dict]]:
    """Warm-up rounds (discarded), then ``repeat`` rounds, the order of the commands reversed
    every other round. With ``extra``, up to EXTRA_ROUNDS["allowed"] more rounds while some
    command's runs still differ by more than SPREAD_LIMIT (max / min) and the time budget of the
    whole run allows another round."""
    names = list(commands)
    for w in range(warmup):
        for name in names:
            commands[name]()
        log(f"  {label}: warm-up {w + 1}/{warmup} done")
    results: dict[str, list[dict]] = {n: [] for n in names}

    def one_round(i: int) -> float:
        t0 = time.perf_counter()
        for name in (names if i % 2 == 0 else names[::-1]):
            results[name].append(commands[name]())
        log(f"  {label}: round {i + 1}: " + ", ".join(
            f"{n} {results[n][-1]['wall_s']:.2f}s" for n in names))
        return time.perf_counter() - t0

    cost = 0.0
    for i in range(repeat):
        cost = one_round(i)
    for i in range(repeat, repeat + (EXTRA_ROUNDS["allowed"] if extra else 0)):
        spread = max(max(w) / min(w) for w in
                     ([r["wall_s"] for r in results[n]] for n in names))
        if spread <= SPREAD_LIMIT:
            break
        if not EXTRA_ROUNDS["budget_ok"](cost):
            log(f"  {label}: runs differ by {spread:.2f}x, but no time is left for another round")
            break
        log(f"  {label}: runs differ by {spread:.2f}x: one more round")
        cost = one_round(i)
    return results


def pair_ratios(results: dict[str, list[dict]], a: str, b: str) -> list[float]:
    """a / b within each round (the two ran minutes apart at most, under the same load)."""
    return [x["wall_s"] / y["wall_s"] for x, y in zip(results[a], results[b])]


def summarize(results: dict[str, list[dict]], rss: bool = False) -> dict:
    out = {}
    for name, runs in results.items():
        entry = {"wall_s": stats(runs)}
        if rss:
            # The larger of ru_maxrss and the sampled largest process (they agree when every
            # process of the tree was reaped inside it).
            for r in runs:
                r["peak"] = max(r["maxrss"], r.get("proc_peak") or 0)
            entry["peak_rss"] = stats(runs, "peak")
            entry["ru_maxrss"] = stats(runs, "maxrss")
            entry["tree_peak_rss"] = stats(runs, "tree_peak")
        extra = {k: runs[-1][k] for k in ("bytes_hashed", "out_bytes", "files_hashed")
                 if k in runs[-1]}
        if extra:
            entry.update(extra)
        entry["cpu_s"] = stats(runs, "cpu_s")
        out[name] = entry
    return out


def med(summary: dict, name: str, key: str = "wall_s") -> float:
    return summary[name][key]["median"]


def ratio(summary: dict, a: str, b: str, key: str = "wall_s") -> float | None:
    """median(a) / median(b); None when either command did not run here."""
    if a not in summary or b not in summary or not summary[a].get(key) \
            or not summary[b].get(key):
        return None
    return med(summary, a, key) / med(summary, b, key)


def preload(model: Path) -> float:
    """Read every file of ``model`` once (untimed), so that the timed runs find it in the page
    cache whatever ran before. Returns the seconds it took."""
    t0 = time.perf_counter()
    buf = bytearray(8 << 20)
    for p in sorted(model.iterdir()):
        if p.is_file():
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
    return time.perf_counter() - t0


def finish(r: dict) -> dict:
    r["cpu_s"] = r.get("user_s", 0) + r.get("sys_s", 0)
    return r


# --------------------------------------------------------------------------- physical limits

def measure_limits(work: Path, nbytes: int) -> dict:
    """sha256 GB/s per core (memory and page-cached file), sequential write GB/s without and
    with fsync, and cp GB/s (page cache to page cache, and with sync)."""
    import hashlib

    d = work / "limits"
    rmtree(d)
    d.mkdir(parents=True)
    block = os.urandom(64 << 20)
    chunks = max(1, nbytes // len(block))
    total = chunks * len(block)
    res: dict = {"bytes": total}

    def best(fn, n=3):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times), statistics.median(times)

    def hash_mem():
        h = hashlib.sha256()
        for _ in range(chunks):
            h.update(block)
    t_min, t_med = best(hash_mem)
    res["sha256_mem_gbps_per_core"] = {"best": total / t_min / GB, "median": total / t_med / GB}

    src = d / "src.bin"

    def write(path: Path, fsync: bool):
        with open(path, "wb", buffering=0) as f:
            for _ in range(chunks):  # noqa: FURB122  (big writes, as a copy makes them)
                f.write(block)
            if fsync:
                os.fsync(f.fileno())

    os.sync()
    wt = []
    for i in range(2):
        t0 = time.perf_counter()
        write(d / f"w{i}.bin", False)
        wt.append(time.perf_counter() - t0)
        (d / f"w{i}.bin").unlink()
        os.sync()
    res["write_gbps_no_fsync"] = {"best": total / min(wt) / GB,
                                  "median": total / statistics.median(wt) / GB}
    wt = []
    for i in range(2):
        t0 = time.perf_counter()
        write(d / f"s{i}.bin", True)
        wt.append(time.perf_counter() - t0)
        (d / f"s{i}.bin").unlink()
    res["write_gbps_fsync"] = {"best": total / min(wt) / GB,
                               "median": total / statistics.median(wt) / GB}
    write(src, True)

    def hash_file():
        with open(src, "rb") as f:
            hashlib.file_digest(f, "sha256")
    hash_file()
    t_min, t_med = best(hash_file)
    res["sha256_file_gbps_per_core"] = {"best": total / t_min / GB, "median": total / t_med / GB}

    for label, cmd in (("cp_gbps", "cp {src} {dst}"), ("cp_sync_gbps", "cp {src} {dst} && sync")):
        times = []
        for i in range(2):
            dst = d / f"cp{i}.bin"
            os.sync()
            t0 = time.perf_counter()
            subprocess.run(["sh", "-c", cmd.format(src=shlex.quote(str(src)),
                                                   dst=shlex.quote(str(dst)))], check=True)
            times.append(time.perf_counter() - t0)
            dst.unlink()
        res[label] = {"best": total / min(times) / GB,
                      "median": total / statistics.median(times) / GB}
    rmtree(d)
    return res


# --------------------------------------------------------------------------- models

def prepare_models(args, work: Path) -> dict:
    """nvfp4 models per size (FP8 KV declared, and a no-KV twin sharing every shard), and the
    fp8-block model for case 4. The largest is written first; smaller ones hardlink its shards."""
    models: dict = {"sizes": {}, "fp8": None}
    generated: list[Path] = []
    t0 = time.perf_counter()
    for size in sorted(args.sizes, reverse=True):
        shards = max(1, round(size * 1000 / args.shard_mb))
        kv = work / "models" / f"nvfp4-{size:g}gb"
        nokv = work / "models" / f"nvfp4-{size:g}gb-nokv"
        log(f"model {size:g} GB / {shards} shards ...")
        info = synth.generate(kv, size_gb=size, shards=shards, link_from=generated)
        generated.append(kv)
        info_nokv = synth.generate(nokv, size_gb=size, shards=shards, kv_cache="none",
                                   link_from=[kv])
        for i in (info, info_nokv):
            i.pop("shard_headers", None)
        models["sizes"][size] = {"kv": info, "nokv": info_nokv}
    if 1 in args.cases:
        log(f"many-tensor model {args.many_gb:g} GB / {args.many_shards} shards ...")
        info = synth.generate(work / "models" / "nvfp4-many-tensors", size_gb=args.many_gb,
                              shards=args.many_shards)
        info.pop("shard_headers", None)
        models["many_tensors"] = info
    if 4 in args.cases:
        shards = max(1, round(args.fp8_size * 1000 / args.shard_mb))
        log(f"fp8-block model {args.fp8_size:g} GB / {shards} shards ...")
        info = synth.generate(work / "models" / f"fp8-{args.fp8_size:g}gb", size_gb=args.fp8_size,
                              shards=shards, fmt="fp8-block")
        info.pop("shard_headers", None)
        models["fp8"] = info
    models["generation_s"] = time.perf_counter() - t0
    return models


def dir_bytes(path: Path, pattern: str = "*.safetensors") -> int:
    return sum(p.stat().st_size for p in path.glob(pattern))


# --------------------------------------------------------------------------- cases

def case_config_only(b: Bench, model: Path, size: float, args, warmup: int,
                     extras: bool = False) -> dict:
    """``extras`` (the largest size): also apply to the same model laid out as a Hugging Face
    cache snapshot, first time: the shards' sha256 digests are their blob names."""
    out = b.work / "out" / "c1"
    warm_cache = b.work / "caches" / f"c1-warm-{size:g}"
    rmtree(warm_cache)
    edit = b.scripts / "edit_json.py"

    def mp(cache: Path | None, base: Path = model):
        def run():
            cold = cache is None
            c = b.fresh("cache-cold") if cold else cache
            rmtree(out)
            os.sync()
            r = b.measure(b.mp + ["apply", "sm120-fp16-kv", base, "-o", out, "--force", "-q",
                                  "--json"], env=b.env(c))
            r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
            rmtree(out)
            if cold:
                rmtree(c)
            return finish(r)
        return run

    def cp(sync: bool):
        def run():
            rmtree(out)
            os.sync()
            sh = (f"cp -r {shlex.quote(str(model))} {shlex.quote(str(out))} && "
                  f"{shlex.quote(PY)} {shlex.quote(str(edit))} {shlex.quote(str(out))}"
                  + (" && sync" if sync else ""))
            r = b.measure(["sh", "-c", sh])
            rmtree(out)
            return finish(r)
        return run

    # The warm cache: one untimed apply records every base file (they are aged past 2 s).
    b.measure(b.mp + ["apply", "sm120-fp16-kv", model, "-o", out, "--force", "-q", "--json"],
              env=b.env(warm_cache))
    rmtree(out)
    commands = {"modelpatch_first_time": mp(None), "cp_r_json_edit": cp(False),
                "modelpatch_digests_known": mp(warm_cache), "cp_r_json_edit_sync": cp(True)}
    snapshot = None
    if extras:
        snapshot = synth.hf_cache_snapshot(model, b.work / "hf-cache", f"synth/{model.name}")
        commands["modelpatch_first_time_hf_cache"] = mp(None, snapshot)
    runs = alternate(commands, args.repeat, warmup, f"config-only {size:g} GB",
                     extra=size == max(args.sizes))
    res = summarize(runs)
    rmtree(warm_cache)
    if snapshot is not None:
        rmtree(b.work / "hf-cache")
    return {"commands": res, "rounds": len(runs["cp_r_json_edit"]),
            "pair_ratios": {"first_time_vs_cp": pair_ratios(runs, "modelpatch_first_time",
                                                            "cp_r_json_edit")},
            "ratios": {
        "first_time_vs_cp": ratio(res, "modelpatch_first_time", "cp_r_json_edit"),
        "first_time_vs_cp_sync": ratio(res, "modelpatch_first_time", "cp_r_json_edit_sync"),
        "digests_known_vs_cp": ratio(res, "modelpatch_digests_known", "cp_r_json_edit"),
        "first_time_hf_cache_vs_cp": ratio(res, "modelpatch_first_time_hf_cache",
                                           "cp_r_json_edit"),
    }}


def case_verify(b: Bench, model: Path, size: float, args, warmup: int) -> dict:
    variant = b.work / "out" / f"variant-{size:g}"
    cache = b.work / "caches" / "verify"
    b.measure(b.mp + ["apply", "sm120-fp16-kv", model, "-o", variant, "--force", "-q"],
              env=b.env(b.fresh("cache-variant")))
    hash_script = b.scripts / "hash_files.py"

    def verify():
        r = b.measure(b.mp + ["verify", variant, "--json", "-q"], env=b.env(cache))
        rep = json.loads(r["stdout"])
        if not rep["ok"]:
            raise SystemExit(f"run.py: verify reported a mismatch in {variant}: {rep}")
        r["bytes_hashed"] = rep["hashed_bytes"]
        r["files_hashed"] = rep["hashed_files"]
        return finish(r)

    def hashlib_(jobs: int):
        def run():
            r = b.measure([PY, hash_script, variant, str(jobs)])
            files, nbytes = r["stdout"].split()
            r["files_hashed"], r["bytes_hashed"] = int(files), int(nbytes)
            return finish(r)
        return run

    commands = {"modelpatch_verify": verify, "hashlib_serial": hashlib_(1),
                f"hashlib_pool{CORES}": hashlib_(CORES)}
    runs = alternate(commands, args.repeat, warmup, f"verify {size:g} GB",
                     extra=size == max(args.sizes))
    res = summarize(runs)
    rmtree(variant)
    rmtree(cache)
    nbytes = res["modelpatch_verify"]["bytes_hashed"]
    return {"commands": res, "bytes": nbytes, "rounds": len(runs["modelpatch_verify"]),
            "pair_ratios": {"verify_vs_hashlib_pool": pair_ratios(
                runs, "modelpatch_verify", f"hashlib_pool{CORES}")},
            "ratios": {
        "verify_vs_hashlib_pool": ratio(res, "modelpatch_verify", f"hashlib_pool{CORES}"),
        "verify_vs_hashlib_serial": ratio(res, "modelpatch_verify", "hashlib_serial"),
    }, "pool_parallelism": med(res, f"hashlib_pool{CORES}", "cpu_s")
                           / med(res, f"hashlib_pool{CORES}"),
        "verify_gbps": nbytes / med(res, "modelpatch_verify") / GB,
        "hashlib_pool_gbps": nbytes / med(res, f"hashlib_pool{CORES}") / GB,
        "hashlib_serial_gbps": nbytes / med(res, "hashlib_serial") / GB}


def case_drop_kv(b: Bench, model: Path, twin: Path, size: float, args, scripts: dict,
                 warmup: int, extras: bool) -> dict:
    """``extras``: also run modelpatch with digests known and the script followed by ``sync``
    (done at the largest size only: each run rewrites the whole model, at disk speed)."""
    out = b.work / "out" / "c3"
    warm_cache = b.work / "caches" / f"c3-warm-{size:g}"
    rmtree(warm_cache)
    load_save = b.scripts / "load_save_drop.py"

    def mp(cache: Path | None):
        def run():
            cold = cache is None
            c = b.fresh("cache-cold") if cold else cache
            rmtree(out)
            os.sync()
            r = b.measure(b.mp + ["apply", "drop-kv-scales", model, "-o", out, "--force", "-q",
                                  "--json"], env=b.env(c), sample=True)
            r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
            r["out_bytes"] = dir_bytes(out)
            rmtree(out)
            if cold:
                rmtree(c)
            return finish(r)
        return run

    def plain(sync: bool):
        def run():
            rmtree(out)
            os.sync()
            cmd = [PY, load_save, model, out, scripts["kv_scale_re"]]
            if sync:
                cmd = ["sh", "-c", shlex.join(str(c) for c in cmd) + " && sync"]
            r = b.measure(cmd, sample=True)
            r["out_bytes"] = dir_bytes(out)
            rmtree(out)
            return finish(r)
        return run

    commands = {"modelpatch_first_time": mp(None), "load_save": plain(False)}
    if extras:
        # The warm cache, without rewriting the model: the no-KV twin's shards are hardlinks of
        # the FP8-KV model's (same inodes), so a config-only apply to that model records them.
        b.measure(b.mp + ["apply", "sm120-fp16-kv", twin, "-o", out, "--force", "-q"],
                  env=b.env(warm_cache))
        rmtree(out)
        commands.update({"modelpatch_digests_known": mp(warm_cache),
                         "load_save_sync": plain(True)})
    runs = alternate(commands, args.repeat, warmup, f"drop-kv-scales {size:g} GB", extra=extras)
    res = summarize(runs, rss=True)
    rmtree(warm_cache)
    return {"commands": res, "rounds": len(runs["load_save"]),
            "pair_ratios": {"time_first_time_vs_load_save": pair_ratios(
                runs, "modelpatch_first_time", "load_save")},
            "ratios": {
        "time_first_time_vs_load_save": ratio(res, "modelpatch_first_time", "load_save"),
        "time_digests_known_vs_load_save": ratio(res, "modelpatch_digests_known", "load_save"),
        "time_first_time_vs_load_save_sync": ratio(res, "modelpatch_first_time",
                                                   "load_save_sync"),
        "time_digests_known_vs_load_save_sync": ratio(res, "modelpatch_digests_known",
                                                      "load_save_sync"),
        "peak_rss_vs_load_save": ratio(res, "modelpatch_first_time", "load_save", "peak_rss"),
        "tree_peak_rss_vs_load_save": ratio(res, "modelpatch_first_time", "load_save",
                                            "tree_peak_rss"),
    }}


def case_fp8(b: Bench, model: Path, args) -> dict:
    out = b.work / "out" / "c4"
    ref = b.work / "out" / "c4-bf16-ref"
    cast = b.scripts / "fp8_cast_bf16_cpu.py"
    rmtree(ref)

    def mp():
        rmtree(out)
        os.sync()
        c = b.fresh("cache-cold")
        r = b.measure(b.mp + ["apply", "fp8-block-to-bf16", model, "-o", out, "-q", "--json"],
                      env=b.env(c), sample=True)
        r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
        r["out_bytes"] = dir_bytes(out)
        if not ref.exists():
            out.rename(ref)       # the BF16 shards that cp_same_bytes copies
        rmtree(out)
        rmtree(c)
        return finish(r)
    def torch_script():
        rmtree(out)
        os.sync()
        r = b.measure([PY, cast, model, out], sample=True)
        r["out_bytes"] = dir_bytes(out)
        rmtree(out)
        return finish(r)

    def cp():
        if not ref.exists():
            mp()
        rmtree(out)
        out.mkdir(parents=True)
        os.sync()
        r = b.measure(["cp", *sorted(ref.glob("*.safetensors")), out], sample=True)
        r["out_bytes"] = dir_bytes(out)
        rmtree(out)
        return finish(r)

    # modelpatch runs first in the first round, so cp finds its output there.
    commands = {"modelpatch": mp, "torch_fp8_cast_bf16": torch_script, "cp_same_bytes": cp}
    res = summarize(alternate(commands, args.repeat, args.warmup, "fp8-block-to-bf16"),
                    rss=True)
    rmtree(ref)
    gbps = {n: res[n]["out_bytes"] / med(res, n) / GB for n in res}
    return {"commands": res, "output_gbps": gbps, "ratios": {
        "time_vs_torch_script": ratio(res, "modelpatch", "torch_fp8_cast_bf16"),
        "time_vs_cp_same_bytes": ratio(res, "modelpatch", "cp_same_bytes"),
        "peak_rss_vs_torch_script": ratio(res, "modelpatch", "torch_fp8_cast_bf16", "peak_rss"),
    }}


JSON_HEADERS = r"""
import json, struct, sys
from pathlib import Path

count = 0
for path in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        count += len(json.loads(f.read(n))) - 1
print(count)
"""


def case_tensor_count(b: Bench, model: Path, info: dict, args) -> dict:
    """Config-only work at a real tensor count: the known-digest apply and plan read every shard
    header, so their cost follows the number of tensors, not bytes."""
    out = b.work / "out" / "c1b"
    warm_cache = b.work / "caches" / "c1b-warm"
    rmtree(warm_cache)
    headers = b.scripts / "json_headers.py"
    headers.write_text(JSON_HEADERS)
    b.measure(b.mp + ["apply", "sm120-fp16-kv", model, "-o", out, "--force", "-q"],
              env=b.env(warm_cache))
    rmtree(out)

    def known():
        rmtree(out)
        os.sync()
        r = b.measure(b.mp + ["apply", "sm120-fp16-kv", model, "-o", out, "--force", "-q",
                              "--json"], env=b.env(warm_cache))
        r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
        rmtree(out)
        return finish(r)

    def plan():
        return finish(b.measure(b.mp + ["plan", "sm120-fp16-kv", model]))

    def floor():
        r = b.measure([PY, headers, model])
        if int(r["stdout"]) != info["tensors"]:
            raise SystemExit(f"run.py: json_headers counted {r['stdout']!r}")
        return finish(r)

    commands = {"modelpatch_digests_known": known, "modelpatch_plan": plan,
                "python_json_loads_headers": floor}
    res = summarize(alternate(commands, args.repeat, args.warmup, "config-only, many tensors"))
    rmtree(warm_cache)
    return {"commands": res, "model_gb": info["file_bytes"] / GB, "shards": info["shards"],
            "tensors": info["tensors"]}


def case_inspect(b: Bench, model: Path, info: dict, args) -> dict:
    baseline = b.scripts / "safe_open_get_tensor.py"
    headers = b.scripts / "safe_open_headers.py"

    def inspect():
        r = b.measure(b.mp + ["inspect", "--json", model])
        totals = json.loads(r["stdout"])["tensors"]["totals"]
        if totals["tensors"] != info["tensors"]:
            raise SystemExit(f"run.py: inspect counted {totals['tensors']} tensors, "
                             f"expected {info['tensors']}")
        return finish(r)

    def get_tensor():
        r = b.measure([PY, baseline, model])
        if r["stdout"].split() != [str(info["tensors"]), str(info["tensor_bytes"])]:
            raise SystemExit(f"run.py: safe_open baseline read {r['stdout']!r}")
        return finish(r)

    def hdr():
        return finish(b.measure([PY, headers, model]))

    commands = {"modelpatch_inspect": inspect, "safe_open_get_tensor": get_tensor,
                "safe_open_headers_only": hdr}
    res = summarize(alternate(commands, args.repeat, args.warmup, "inspect"))
    return {"commands": res, "ratios": {
        "inspect_vs_safe_open_get_tensor": ratio(res, "modelpatch_inspect",
                                                 "safe_open_get_tensor"),
        "inspect_vs_safe_open_headers_only": ratio(res, "modelpatch_inspect",
                                                   "safe_open_headers_only"),
    }}


def importtime(b: Bench, argv: list[str]) -> dict:
    """Run the CLI under ``python -X importtime``: was torch imported, and at what cost?"""
    code = ("import sys; sys.argv = " + repr(["modelpatch"] + argv) +
            "; from patcher.cli import main; main()")
    proc = subprocess.run([PY, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          env=b.base_env, check=False)
    cumulative: dict[str, int] = {}
    total_self = 0
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        try:
            self_us, cum_us, name = int(parts[0]), int(parts[1]), parts[2].strip()
        except (ValueError, IndexError):
            continue          # the column header
        total_self += self_us
        cumulative.setdefault(name, cum_us)
    return {"torch_imported": "torch" in cumulative,
            "torch_import_s": cumulative.get("torch", 0) / 1e6,
            "patcher_cli_import_s": cumulative.get("patcher.cli", 0) / 1e6,
            "all_imports_s": total_self / 1e6, "modules": len(cumulative)}


def case_cold_start(b: Bench, model: Path, args) -> dict:
    def run(cmd):
        return lambda: finish(b.measure(cmd))

    commands = {"modelpatch_help": run(b.mp + ["--help"]),
                "modelpatch_plan_config_only": run(b.mp + ["plan", "sm120-fp16-kv", model]),
                "python_bare": run([PY, "-c", "pass"]),
                "python_import_torch": run([PY, "-c", "import torch"])}
    tiny = args.mode == "tiny"
    res = summarize(alternate(commands, 1 if tiny else max(args.repeat, 3), 0 if tiny else 1,
                              "cold start"))
    return {"commands": res,
            "torch_import_cost_s": med(res, "python_import_torch") - med(res, "python_bare"),
            "importtime": {"help": importtime(b, ["--help"]),
                           "plan": importtime(b, ["plan", "sm120-fp16-kv", str(model)])}}


# --------------------------------------------------------------------------- environment

def machine_info(work: Path) -> dict:
    cpu = "unknown"
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    real = os.path.realpath(work)
    fs = {"mount": None, "device": None, "type": None, "options": None}
    try:
        best = ""
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, typ, opts = line.split()[:4]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best = mnt
                fs = {"mount": mnt, "device": dev, "type": typ, "options": opts}
    except OSError:
        pass
    du = shutil.disk_usage(work)
    return {"cpu": cpu, "sha_ni": " sha_ni" in flags, "cores": CORES,
            "logical_cpus": os.cpu_count(), "ram_bytes": mem,
            "disk": {"total_bytes": du.total, "free_bytes_at_start": du.free, **fs},
            "kernel": platform.release(), "platform": platform.platform(),
            "load_avg_start": os.getloadavg()}


def versions() -> dict:
    v = {"python": platform.python_version(), "openssl": ssl.OPENSSL_VERSION}
    for dist in ("modelpatch", "torch", "safetensors", "huggingface_hub", "numpy", "matplotlib",
                 "click"):
        try:
            v[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            v[dist] = None
    try:
        v["cp"] = subprocess.run(["cp", "--version"], capture_output=True, text=True,
                                 check=False).stdout.splitlines()[0]
    except (OSError, IndexError):
        v["cp"] = None
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "patcher"],
                               capture_output=True, text=True, check=False).stdout.strip()
        v["git_commit"] = head or None
        v["patcher_uncommitted_changes"] = bool(dirty)
    except OSError:
        v["git_commit"] = None
    return v


# --------------------------------------------------------------------------- targets

def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def evaluate_targets(report: dict) -> list[dict]:
    cases = report["cases"]
    out = []
    if "config_only" in cases:
        by = cases["config_only"]["by_size"]
        big = max(by, key=float)
        r = by[big]
        out.append({"id": "config_only_first_time", "issues": [3, 7],
                    "target": "apply sm120-fp16-kv, first time (cold digest cache) <= 0.15 x "
                              "(cp -r + JSON edit), cp WITHOUT a final sync",
                    "at_gb": float(big), "measured": r["ratios"]["first_time_vs_cp"],
                    "limit": 0.15,
                    "verdict": verdict(r["ratios"]["first_time_vs_cp"] <= 0.15),
                    "per_size": {s: by[s]["ratios"]["first_time_vs_cp"] for s in by},
                    "per_round": r["pair_ratios"]["first_time_vs_cp"],
                    "also": {"vs_cp_with_sync": r["ratios"]["first_time_vs_cp_sync"],
                             "verdict_vs_cp_with_sync": verdict(
                                 r["ratios"]["first_time_vs_cp_sync"] <= 0.15),
                             "from_hf_cache_snapshot": r["ratios"].get(
                                 "first_time_hf_cache_vs_cp"),
                             "verdict_from_hf_cache_snapshot": verdict(
                                 (r["ratios"].get("first_time_hf_cache_vs_cp") or 9) <= 0.15)}})
        known = med(r["commands"], "modelpatch_digests_known")
        out.append({"id": "config_only_digests_known", "issues": [3, 7],
                    "target": "apply sm120-fp16-kv with digests known < 1 s (wall, incl. "
                              "interpreter start-up)",
                    "at_gb": float(big), "measured": known, "limit": 1.0,
                    "verdict": verdict(known < 1.0),
                    "per_size": {s: med(by[s]["commands"], "modelpatch_digests_known")
                                 for s in by}})
    if "config_only_tensor_count" in cases:
        c = cases["config_only_tensor_count"]
        known = med(c["commands"], "modelpatch_digests_known")
        out.append({"id": "config_only_digests_known_tensor_count", "issues": [3],
                    "target": f"the same < 1 s, at {c['tensors']} tensors in {c['shards']} "
                              "shards (" + ("about nvidia/Kimi-K2.5-NVFP4's count"
                                            if c["tensors"] > 200_000 else
                                            "a reduced stand-in for Kimi-K2.5-NVFP4's ~273k")
                              + "; beyond issue 3's 8 GB / 16-shard spec)",
                    "at_gb": c["model_gb"], "measured": known, "limit": 1.0,
                    "verdict": verdict(known < 1.0), "per_size": {},
                    "per_round": c["commands"]["modelpatch_digests_known"]["wall_s"]["runs"]})
    if "verify" in cases:
        by = cases["verify"]["by_size"]
        big = max(by, key=float)
        m = by[big]["ratios"]["verify_vs_hashlib_pool"]
        out.append({"id": "verify_vs_hashlib", "issues": [3, 7],
                    "target": f"verify <= 1.1 x hashlib sha256 per file in {CORES} processes "
                              "(the per-core hashlib limit on all cores)",
                    "at_gb": float(big), "measured": m, "limit": 1.1,
                    "verdict": verdict(m <= 1.1),
                    "per_size": {s: by[s]["ratios"]["verify_vs_hashlib_pool"] for s in by},
                    "per_round": by[big]["pair_ratios"]["verify_vs_hashlib_pool"]})
    if "drop_kv_scales" in cases:
        by = cases["drop_kv_scales"]["by_size"]
        big = max(by, key=float)
        r = by[big]["ratios"]
        out.append({"id": "drop_kv_time", "issues": [4, 7],
                    "target": "drop-kv-scales wall time <= 1.0 x load_file/save_file script "
                              "(modelpatch first time: cold digest cache, sha256 included; "
                              "script without sync)",
                    "at_gb": float(big), "measured": r["time_first_time_vs_load_save"],
                    "limit": 1.0, "verdict": verdict(r["time_first_time_vs_load_save"] <= 1.0),
                    "per_size": {s: by[s]["ratios"]["time_first_time_vs_load_save"] for s in by},
                    "per_round": by[big]["pair_ratios"]["time_first_time_vs_load_save"],
                    "also": {"digests_known": r["time_digests_known_vs_load_save"],
                             "first_time_vs_script_with_sync":
                                 r["time_first_time_vs_load_save_sync"]}})
        out.append({"id": "drop_kv_peak_rss", "issues": [4, 7],
                    "target": "drop-kv-scales peak RSS <= 0.5 x load_file/save_file script "
                              "(the largest process of each command)",
                    "at_gb": float(big), "measured": r["peak_rss_vs_load_save"], "limit": 0.5,
                    "verdict": verdict(r["peak_rss_vs_load_save"] <= 0.5),
                    "per_size": {s: by[s]["ratios"]["peak_rss_vs_load_save"] for s in by},
                    "also": {"whole_tree_sampled": r["tree_peak_rss_vs_load_save"],
                             "verdict_whole_tree": verdict(
                                 r["tree_peak_rss_vs_load_save"] <= 0.5)}})
    return out


# --------------------------------------------------------------------------- plots

def plots(report: dict, out: Path) -> list[str]:
    try:
        import matplotlib
    except ModuleNotFoundError:
        log("plots skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    cases = report["cases"]
    limits = report.get("limits", {})
    sha = limits.get("sha256_file_gbps_per_core", {}).get("best")

    def series(ax, by: dict, names: dict, key="wall_s", scale=1.0):
        sizes = sorted(by, key=float)
        xs = [by[s]["model_gb"] for s in sizes]
        for name, label in names.items():
            have = [s for s in sizes if by[s]["commands"].get(name, {}).get(key)]
            if not have:
                continue
            px = [by[s]["model_gb"] for s in have]
            ys = [by[s]["commands"][name][key]["median"] * scale for s in have]
            lo = [y - by[s]["commands"][name][key]["min"] * scale for y, s in zip(ys, have)]
            hi = [by[s]["commands"][name][key]["max"] * scale - y for y, s in zip(ys, have)]
            ax.errorbar(px, ys, yerr=[lo, hi], marker="o", capsize=3, label=label)
        return xs

    def finish_fig(fig, ax, name, title, ylabel="seconds (median, min-max bars)"):
        ax.set_xlabel("model size (GB)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)

    if "config_only" in cases:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        series(ax, cases["config_only"]["by_size"], {
            "modelpatch_first_time": "modelpatch apply, first time (hashes everything)",
            "modelpatch_digests_known": "modelpatch apply, digests known",
            "cp_r_json_edit": "cp -r + JSON edit",
            "cp_r_json_edit_sync": "cp -r + JSON edit + sync",
            "modelpatch_first_time_hf_cache": "modelpatch apply, first time, HF cache snapshot"})
        finish_fig(fig, ax, "case1_config_only.png", "Config-only patch (sm120-fp16-kv)")
    if "verify" in cases:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = series(ax, cases["verify"]["by_size"], {
            "modelpatch_verify": "modelpatch verify", "hashlib_serial": "hashlib, 1 process",
            f"hashlib_pool{CORES}": f"hashlib, Pool({CORES})"})
        if sha:
            ax.plot([0] + xs, [0] + [x / (sha * CORES) for x in xs], "k--", lw=1,
                    label=f"sha256 limit: {CORES} cores x {sha:.2f} GB/s")
            ax.plot([0] + xs, [0] + [x / sha for x in xs], "k:", lw=1,
                    label=f"sha256 limit: 1 core x {sha:.2f} GB/s")
        finish_fig(fig, ax, "case2_verify.png", "verify vs hashlib sha256")
    if "drop_kv_scales" in cases:
        by = cases["drop_kv_scales"]["by_size"]
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        names = {"modelpatch_first_time": "modelpatch, first time",
                 "modelpatch_digests_known": "modelpatch, digests known",
                 "load_save": "load_file/save_file", "load_save_sync": "load_file/save_file + sync"}
        xs = series(ax, by, names)
        wf = limits.get("write_gbps_fsync", {}).get("median")
        if wf:
            ax.plot([0] + xs, [0] + [x / wf for x in xs], "k--", lw=1,
                    label=f"write limit with fsync: {wf:.2f} GB/s")
        ax.set_xlabel("model size (GB)")
        ax.set_ylabel("seconds (median, min-max bars)")
        ax.set_title("drop-kv-scales: wall time")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        series(ax2, by, {k: v for k, v in names.items() if "sync" not in k}, key="peak_rss",
               scale=1 / 2**20)
        finish_fig(fig, ax2, "case3_drop_kv_scales.png", "drop-kv-scales: peak RSS (ru_maxrss)",
                   ylabel="MiB (median, min-max bars)")
    return made


# --------------------------------------------------------------------------- report

def fmt_s(x: float | None) -> str:
    return "-" if x is None else (f"{x:.3f} s" if x < 10 else f"{x:.1f} s")


def fr(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def fmt_mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f} MiB"


def markdown(report: dict) -> str:
    m, v, lim = report["machine"], report["versions"], report.get("limits", {})
    L: list[str] = []
    add = L.append
    add("# modelpatch benchmark report\n")
    add(f"Generated {report['date']} by `{report['command']}` in "
        f"**{report['runtime_s'] / 60:.1f} min** ({report['runtime_s']:.0f} s). "
        f"Mode: {report['mode']}; sizes {', '.join(f'{s:g}' for s in report['args']['sizes'])} "
        f"GB (nominal) in shards of {report['args']['shard_mb']:g} MB; {report['args']['repeat']} "
        f"timed round(s) per command, medians (at the largest size of cases 1-3, up to "
        f"{report['args']['extra_rounds']} more while runs differ by over {SPREAD_LIMIT}x and "
        f"the {report['args']['budget_min']:g}-minute budget allows); "
        f"{report['args']['warmup']} warm-up round(s) "
        f"before the smallest size of cases 1-3 and before each of cases 4-6 (larger sizes read "
        f"the same page-cached, hardlinked shards, preloaded before timing).\n")
    add("## Targets\n")
    add("| target | issues | at | measured | limit | verdict |")
    add("|---|---|---|---|---|---|")
    for t in report["targets"]:
        unit = " s" if t["id"].startswith("config_only_digests_known") else "x"
        add(f"| {t['target']} | {', '.join(map(str, t['issues']))} | {t['at_gb']:g} GB | "
            f"{t['measured']:.3f}{unit} | {t['limit']}{unit} | **{t['verdict']}** |"
            .replace(f"| {t['at_gb']:g} GB |", f"| {t['at_gb']:.3g} GB |"))
    add("")
    for t in report["targets"]:
        per = ", ".join(f"{float(s):g} GB: {x:.3f}" for s, x in sorted(t["per_size"].items(),
                                                                      key=lambda i: float(i[0])))
        line = f"- `{t['id']}`" + (f" per size: {per}." if per else ":")
        if t.get("per_round"):
            what = ("seconds" if t["id"].startswith("config_only_digests_known")
                    else "modelpatch / the baseline run next to it")
            line += (f" At {t['at_gb']:.3g} GB, per round ({what}): "
                     + ", ".join(f"{x:.3f}" for x in t["per_round"]) + ".")
        if "also" in t:
            line += " Also: " + "; ".join(
                f"{k} {x:.3f}" if isinstance(x, float) else f"{k} {x}"
                for k, x in t["also"].items()) + "."
        add(line)
    add("")
    if report.get("notes"):
        add("## Notes\n")
        for n in report["notes"]:
            add(f"- {n}")
        add("")
    add("## Machine and versions\n")
    add(f"- CPU: {m['cpu']} ({m['cores']} cores usable, {m['logical_cpus']} logical; SHA-NI "
        f"{'yes' if m['sha_ni'] else 'no'}); RAM {m['ram_bytes'] / 2**30:.1f} GiB; kernel "
        f"{m['kernel']}")
    d = m["disk"]
    add(f"- Disk: {d['device']} mounted on {d['mount']} ({d['type']}, {d['options']}); "
        f"{d['total_bytes'] / 1e9:.0f} GB, {d['free_bytes_at_start'] / 1e9:.0f} GB free at start")
    add(f"- Load average at start {', '.join(f'{x:.2f}' for x in m['load_avg_start'])}; at end "
        f"{', '.join(f'{x:.2f}' for x in m['load_avg_end'])} (other work on the machine shares "
        f"its cores and disk; alternating the commands spreads that noise over both sides)")
    add("- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    add("")
    if lim:
        add("## Physical limits measured in this run\n")
        add(f"On {lim['bytes'] / 2**20:.0f} MiB (best / median of the tries):\n")
        add("| limit | best | median |")
        add("|---|---|---|")
        for key, label in (("sha256_mem_gbps_per_core", "sha256, bytes in memory, 1 core"),
                           ("sha256_file_gbps_per_core",
                            "sha256 of a page-cached file (hashlib.file_digest), 1 core"),
                           ("write_gbps_no_fsync", "sequential write, no fsync (page cache)"),
                           ("write_gbps_fsync", "sequential write + fsync (disk)"),
                           ("cp_gbps", "cp of a page-cached file (no sync)"),
                           ("cp_sync_gbps", "cp + sync")):
            add(f"| {label} | {lim[key]['best']:.2f} GB/s | {lim[key]['median']:.2f} GB/s |")
        add("")
    add("## Models\n")
    add("| nominal | real tensor bytes | shards | tensors | layers | hidden | written | "
        "hardlinked |")
    add("|---|---|---|---|---|---|---|---|")
    for size, pair in sorted(report["models"]["sizes"].items(), key=lambda i: float(i[0])):
        i = pair["kv"]
        add(f"| {float(size):g} GB nvfp4 (Kimi-K2.5 shape) | {i['tensor_bytes'] / GB:.3f} GB | "
            f"{i['shards']} | {i['tensors']} | {i['layers']} | {i['dims']['hidden']} | "
            f"{i['bytes_written'] / GB:.2f} GB | {i['bytes_linked'] / GB:.2f} GB |")
    if report["models"].get("fp8"):
        i = report["models"]["fp8"]
        add(f"| {i['params']['size_gb']:g} GB fp8-block (DeepSeek-V3 shape) | "
            f"{i['tensor_bytes'] / GB:.3f} GB | {i['shards']} | {i['tensors']} | {i['layers']} | "
            f"{i['dims']['hidden']} | {i['bytes_written'] / GB:.2f} GB | "
            f"{i['bytes_linked'] / GB:.2f} GB |")
    reused = any(p["kv"].get("reused") for p in report["models"]["sizes"].values())
    add(f"\nThe no-KV twin of each nvfp4 model (config without the FP8 KV cache, for "
        f"drop-kv-scales) hardlinks every shard. Generation took "
        f"{report['models']['generation_s']:.0f} s"
        f"{' (models reused from an earlier run in the same workdir)' if reused else ''}.\n")

    cases = report["cases"]

    def table(by: dict, names: list[str], rss: bool = False):
        head = "| size | " + " | ".join(names) + " |"
        add(head)
        add("|---" * (len(names) + 1) + "|")
        for s in sorted(by, key=float):
            cells = []
            for n in names:
                c = by[s]["commands"].get(n)
                if c is None:
                    cells.append("-")
                    continue
                cell = f"{fmt_s(c['wall_s']['median'])} ({c['wall_s']['min']:.2f}-" \
                       f"{c['wall_s']['max']:.2f})"
                if rss:
                    cell += f", {fmt_mib(c['peak_rss']['median'])}"
                    if c.get("tree_peak_rss"):
                        cell += f" (tree {fmt_mib(c['tree_peak_rss']['median'])})"
                cells.append(cell)
            add(f"| {by[s]['model_gb']:.2f} GB | " + " | ".join(cells) + " |")
        add("")

    if "config_only" in cases:
        by = cases["config_only"]["by_size"]
        add("## 1. Config-only patch: `apply sm120-fp16-kv` vs `cp -r` + JSON edit\n")
        add("Wall time, median (min-max). `first_time`: an empty digest cache, so every base file "
            "is hashed once (the manifest needs every digest); `digests_known`: a warm cache. "
            "The target compares first_time with `cp -r` + edit WITHOUT `sync` (what a user sees "
            "at the prompt, although cp leaves the copy in dirty page cache, not yet on disk); "
            "modelpatch fsyncs what it writes. The ratio against `cp -r` + edit + `sync` "
            "(durable, like modelpatch) is shown as well. At the largest size, "
            "`first_time_hf_cache` applies to the same model laid out as a Hugging Face cache "
            "snapshot (as `hf download` leaves it; the motivating case): first time too (empty "
            "digest cache), but the shards' sha256 are their blob names, so only the small "
            "non-LFS files are hashed.\n")
        table(by, ["modelpatch_first_time", "modelpatch_digests_known", "cp_r_json_edit",
                   "cp_r_json_edit_sync", "modelpatch_first_time_hf_cache"])
        add("| size | first_time / cp | first_time / (cp+sync) | digests_known / cp | "
            "first_time from HF cache / cp | bytes hashed first time | bytes hashed, known | "
            "bytes hashed, HF cache |")
        add("|---|---|---|---|---|---|---|---|")
        for s in sorted(by, key=float):
            r, c = by[s]["ratios"], by[s]["commands"]
            hf = c.get("modelpatch_first_time_hf_cache")
            add(f"| {by[s]['model_gb']:.2f} GB | {r['first_time_vs_cp']:.3f} | "
                f"{r['first_time_vs_cp_sync']:.3f} | {r['digests_known_vs_cp']:.3f} | "
                f"{fr(r.get('first_time_hf_cache_vs_cp'))} | "
                f"{c['modelpatch_first_time']['bytes_hashed'] / GB:.3f} GB | "
                f"{c['modelpatch_digests_known']['bytes_hashed']} B | "
                f"{hf['bytes_hashed'] if hf else '-'}{' B' if hf else ''} |")
        add("\n![config-only](case1_config_only.png)\n")
    if "config_only_tensor_count" in cases:
        c = cases["config_only_tensor_count"]
        add(f"## 1b. Config-only patch at a real tensor count ({c['tensors']} tensors, "
            f"{c['shards']} shards, {c['model_gb']:.2f} GB)\n")
        add("nvidia/Kimi-K2.5-NVFP4 has about 273k tensors (61 layers x 384 experts x 3 "
            "projections x 4 NVFP4 tensors, and more) in 119 shards. With digests known, a "
            "config-only "
            "apply reads no tensor data, but `plan` and `apply` parse every shard header; "
            "`python_json_loads_headers` is the floor of any Python reader that parses them "
            "all (`json.loads` of every header, nothing else).\n")
        add("| command | wall (median, min-max) |")
        add("|---|---|")
        for n, e in c["commands"].items():
            add(f"| {n} | {fmt_s(e['wall_s']['median'])} ({e['wall_s']['min']:.3f}-"
                f"{e['wall_s']['max']:.3f}) |")
        add("")
    if "verify" in cases:
        by = cases["verify"]["by_size"]
        add(f"## 2. `verify` vs hashlib sha256 per file (1 process, Pool({CORES}))\n")
        table(by, ["modelpatch_verify", "hashlib_serial", f"hashlib_pool{CORES}"])
        add(f"| size | verify / Pool({CORES}) | verify / serial | verify GB/s | Pool GB/s | "
            "serial GB/s | Pool parallelism (CPU s / wall s) |")
        add("|---|---|---|---|---|---|---|")
        for s in sorted(by, key=float):
            r = by[s]
            add(f"| {r['model_gb']:.2f} GB | {r['ratios']['verify_vs_hashlib_pool']:.3f} | "
                f"{r['ratios']['verify_vs_hashlib_serial']:.3f} | {r['verify_gbps']:.2f} | "
                f"{r['hashlib_pool_gbps']:.2f} | {r['hashlib_serial_gbps']:.2f} | "
                f"{r['pool_parallelism']:.2f} |")
        add(f"\nPool parallelism near {CORES} means the baseline had every core; near 1, other "
            "work held the other core(s) and every multi-core figure of that moment is "
            "effectively a one-core figure.")
        add("\n![verify](case2_verify.png)\n")
    if "drop_kv_scales" in cases:
        by = cases["drop_kv_scales"]["by_size"]
        add("## 3. `apply drop-kv-scales` (every shard rewritten) vs load_file/save_file per "
            "shard\n")
        add("Wall time median (min-max), peak RSS of the largest process (median; "
            "ru_maxrss of the command's tree, the measuring wrapper being its child subreaper so "
            "that fork-server workers are counted, checked against a 50 ms sampling), "
            "and in brackets the peak of the whole process tree's summed RSS, sampled every 50 ms "
            "(pages that forked workers share with their parent count once per process, so it "
            "is an upper bound). "
            "modelpatch hashes what it writes and fsyncs every shard; the script does neither "
            "(`load_save_sync` adds a final `sync`). First time also hashes every base shard "
            "(the provenance manifest records the base's digests). `digests_known` and "
            "`load_save_sync` run at the largest size only: every run rewrites the whole model "
            "at disk speed, and the time budget of one run does not allow them everywhere.\n")
        table(by, ["modelpatch_first_time", "modelpatch_digests_known", "load_save",
                   "load_save_sync"], rss=True)
        add("| size | time first / script | time known / script | time first / (script+sync) "
            "| time known / (script+sync) | peak RSS ratio | tree peak RSS ratio |")
        add("|---|---|---|---|---|---|---|")
        for s in sorted(by, key=float):
            r = by[s]["ratios"]
            add(f"| {by[s]['model_gb']:.2f} GB | {fr(r['time_first_time_vs_load_save'])} | "
                f"{fr(r['time_digests_known_vs_load_save'])} | "
                f"{fr(r['time_first_time_vs_load_save_sync'])} | "
                f"{fr(r['time_digests_known_vs_load_save_sync'])} | "
                f"{fr(r['peak_rss_vs_load_save'])} | {fr(r['tree_peak_rss_vs_load_save'])} |")
        add("\n![drop-kv-scales](case3_drop_kv_scales.png)\n")
    if "fp8_to_bf16" in cases:
        c = cases["fp8_to_bf16"]
        add("## 4. `apply fp8-block-to-bf16` vs a CPU torch script (fp8_cast_bf16.py style) "
            "and cp of the same bytes\n")
        add(f"Model: {c['model_gb']:.2f} GB fp8-block, output "
            f"{c['commands']['modelpatch']['out_bytes'] / GB:.2f} GB BF16.\n")
        add("| command | wall (median, min-max) | output GB/s | peak RSS | tree peak RSS |")
        add("|---|---|---|---|---|")
        for n, e in c["commands"].items():
            add(f"| {n} | {fmt_s(e['wall_s']['median'])} ({e['wall_s']['min']:.2f}-"
                f"{e['wall_s']['max']:.2f}) | {c['output_gbps'][n]:.2f} | "
                f"{fmt_mib(e['peak_rss']['median'])} | "
                f"{fmt_mib((e.get('tree_peak_rss') or {}).get('median'))} |")
        r = c["ratios"]
        add(f"\nmodelpatch / torch script: {r['time_vs_torch_script']:.3f}x time, "
            f"{r['peak_rss_vs_torch_script']:.3f}x peak RSS; modelpatch / cp of the same bytes: "
            f"{r['time_vs_cp_same_bytes']:.3f}x time.\n")
    if "inspect" in cases:
        c = cases["inspect"]
        add(f"## 5. `inspect` vs safe_open ({c['model_gb']:.2f} GB, {c['shards']} shards, "
            f"{c['tensors']} tensors)\n")
        add("| command | wall (median, min-max) |")
        add("|---|---|")
        for n, e in c["commands"].items():
            add(f"| {n} | {fmt_s(e['wall_s']['median'])} ({e['wall_s']['min']:.3f}-"
                f"{e['wall_s']['max']:.3f}) |")
        r = c["ratios"]
        add(f"\ninspect / (safe_open + get_tensor): {r['inspect_vs_safe_open_get_tensor']:.3f}; "
            f"inspect / (safe_open, headers only): "
            f"{r['inspect_vs_safe_open_headers_only']:.3f}. Both baselines import torch "
            f"(`framework=\"pt\"`).\n")
    if "cold_start" in cases:
        c = cases["cold_start"]
        add("## 6. Cold start\n")
        add("| command | wall (median, min-max) |")
        add("|---|---|")
        for n, e in c["commands"].items():
            add(f"| {n} | {fmt_s(e['wall_s']['median'])} ({e['wall_s']['min']:.3f}-"
                f"{e['wall_s']['max']:.3f}) |")
        add("")
        for k, it in c["importtime"].items():
            torch_part = (f"torch imported, {it['torch_import_s']:.3f} s of it"
                          if it["torch_imported"] else "torch NOT imported")
            add(f"- `{k}` under `python -X importtime`: {it['modules']} modules, "
                f"{it['all_imports_s']:.3f} s importing (patcher.cli "
                f"{it['patcher_cli_import_s']:.3f} s); {torch_part}.")
        pays = any(i["torch_imported"] for i in c["importtime"].values())
        add(f"- Importing torch costs {c['torch_import_cost_s']:.3f} s in a fresh interpreter "
            f"(`python -c 'import torch'` minus `python -c pass`); config-only commands "
            f"{'pay it' if pays else 'never pay it'}.")
        add("")
    add("## How to read this\n")
    add("See benchmarks/README.md. Ratios are modelpatch / baseline (below 1: modelpatch is "
        "faster or smaller). Every input is read from the page cache; outputs are written to "
        "the same disk. Figures are medians of the timed rounds; the JSON report holds every "
        "run.")
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------- main

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


def check_space(args, work: Path, notes: list[str]) -> None:
    """Drop the largest sizes that cannot fit: base + a full copy (cp) + a full rewrite."""
    free = shutil.disk_usage(work).free
    sizes = sorted(args.sizes)
    while sizes:
        biggest = sizes[-1]
        need = (biggest + sum(args.shard_mb / 1000 for _ in sizes[:-1])) * GB  # base + tails
        need += 2 * biggest * GB                                               # cp / rewrite
        need += 3.5 * args.fp8_size * GB if 4 in args.cases else 0
        if need * 1.1 < free:
            break
        notes.append(f"{biggest:g} GB left out: it needs about {need / GB:.0f} GB of disk, "
                     f"{free / GB:.0f} GB free")
        sizes.pop()
    if not sizes:
        raise SystemExit("run.py: not enough disk space for even the smallest size")
    args.sizes = sizes


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    own_work = args.workdir is None
    work = (Path(tempfile.mkdtemp(prefix="modelpatch-bench-", dir="/var/tmp"))
            if own_work and os.path.isdir("/var/tmp") else
            Path(tempfile.mkdtemp(prefix="modelpatch-bench-")) if own_work else args.workdir)
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    check_space(args, work, notes)
    scripts_dir = work / "scripts"
    scripts_dir.mkdir(exist_ok=True)
    tensor_scripts = bench_tensor_scripts() if {3, 4} & set(args.cases) else {}
    (scripts_dir / "edit_json.py").write_text(EDIT_JSON)
    (scripts_dir / "hash_files.py").write_text(HASH_FILES)
    (scripts_dir / "safe_open_headers.py").write_text(SAFE_OPEN_HEADERS)
    if 5 in args.cases:
        (scripts_dir / "safe_open_get_tensor.py").write_text(bench_inspect_baseline())
    if tensor_scripts:
        (scripts_dir / "load_save_drop.py").write_text(tensor_scripts["load_save_drop"])
        (scripts_dir / "fp8_cast_bf16_cpu.py").write_text(tensor_scripts["fp8_cast_bf16"])
    b = Bench(work, scripts_dir)
    EXTRA_ROUNDS["allowed"] = args.extra_rounds
    report: dict = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "benchmarks/run.py"] + (argv or sys.argv[1:])),
        "mode": args.mode,
        "args": {"sizes": args.sizes, "shard_mb": args.shard_mb, "fp8_size": args.fp8_size,
                 "repeat": args.repeat, "warmup": args.warmup, "cases": args.cases,
                 "extra_rounds": args.extra_rounds, "budget_min": args.budget_min,
                 "workdir": str(work)},
        "machine": machine_info(work), "versions": versions(), "cases": {}, "notes": notes,
    }
    try:
        limit_bytes = int(min(1.0, max(args.sizes) / 4) * 2**30)
        log(f"physical limits on {limit_bytes / 2**20:.0f} MiB ...")
        report["limits"] = measure_limits(work, limit_bytes)
        models = prepare_models(args, work)
        report["models"] = models
        cases = report["cases"]
        sizes = sorted(args.sizes)
        spent: dict[tuple[int, float], float] = {}   # (case, size) -> seconds

        def reserve_after(case: int, size: float) -> float:
            """Estimated seconds of the work still to come after ``case`` at ``size`` (only
            used at the largest size): the later cases at this size, scaled from the size
            before it, and cases 4-6."""
            prev = [s_ for s_ in sizes if s_ < size]
            est = 0.0
            for later in (c for c in (1, 2, 3) if c > case and c in args.cases):
                if prev:
                    factor = size / prev[-1] * (1.7 if later == 3 else 1)  # case 3: 2 more cmds
                    est += spent.get((later, prev[-1]), 0.0) * factor
            rounds = args.warmup + args.repeat
            est += (1 in args.cases) * (rounds * 8 * args.many_gb / 2.2 + 10)
            est += (4 in args.cases) * rounds * 30 * args.fp8_size
            est += (5 in args.cases) * (rounds * 8 * max(sizes) / 8 + 5)
            est += (6 in args.cases) * 35
            return est

        def budget_for(case: int, size: float):
            def ok(cost: float) -> bool:
                elapsed = time.perf_counter() - t_start
                return elapsed + cost + reserve_after(case, size) <= args.budget_min * 60
            return ok

        for size in sizes:
            pair = models["sizes"][size]
            kv, nokv = Path(pair["kv"]["path"]), Path(pair["nokv"]["path"])
            gb = pair["kv"]["file_bytes"] / GB
            # The warm-up rounds run at the smallest size; larger models read the same
            # page-cached shards (hardlinks), and preload() makes sure they are cached.
            warmup = args.warmup if size == min(sizes) else 0
            log(f"preloading {size:g} GB into the page cache: {preload(kv):.1f} s")
            for case, key, label in ((1, "config_only", "config-only patch"),
                                     (2, "verify", "verify"),
                                     (3, "drop_kv_scales", "drop-kv-scales")):
                if case not in args.cases:
                    continue
                log(f"case {case}: {label}, {size:g} GB")
                EXTRA_ROUNDS["budget_ok"] = budget_for(case, size)
                t0 = time.perf_counter()
                if case == 1:
                    r = case_config_only(b, kv, size, args, warmup,
                                         extras=size == max(sizes))
                elif case == 2:
                    r = case_verify(b, kv, size, args, warmup)
                else:
                    r = case_drop_kv(b, nokv, kv, size, args, tensor_scripts, warmup,
                                     extras=size == max(sizes))
                spent[(case, size)] = time.perf_counter() - t0
                cases.setdefault(key, {"by_size": {}})["by_size"][size] = dict(r, model_gb=gb)
        if 1 in args.cases:
            log("case 1b: config-only patch at a real tensor count")
            many = models["many_tensors"]
            cases["config_only_tensor_count"] = case_tensor_count(b, Path(many["path"]), many,
                                                                  args)
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
    finally:
        if own_work and not args.keep:
            rmtree(work)
        else:
            rmtree(work / "out")
            rmtree(work / "tmp")
            rmtree(work / "caches")
    report["machine"]["load_avg_end"] = os.getloadavg()
    starved = {size: v["pool_parallelism"]
               for size, v in report["cases"].get("verify", {}).get("by_size", {}).items()
               if v["pool_parallelism"] < 0.75 * CORES and v["model_gb"] >= 0.5}
    if starved:
        notes.append(f"The hashlib Pool({CORES}) baseline of case 2 ran with a parallelism (CPU "
                     f"seconds / wall seconds) of " + ", ".join(
                         f"{p:.2f} at {s:g} GB" for s, p in sorted(starved.items()))
                     + f" instead of up to {CORES}: other work held the other core(s) much of "
                     f"the time, so the multi-core figures of this run are closer to one-core "
                     f"ones (modelpatch parallelizes hashing and shard rewrites; the load/save "
                     f"and cp baselines are single-threaded).")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
