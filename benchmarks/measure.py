"""Measuring commands: the wrapper that times one subprocess, rounds of alternating commands,
and the statistics and ratios of their runs (benchmarks/README.md, "Method")."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PY = sys.executable
GB = 1e9
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

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
def sample():
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
    sampler = threading.Thread(target=sample, daemon=True)
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


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def modelpatch_cmd() -> list[str]:
    exe = Path(PY).with_name("modelpatch")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("modelpatch")
    return [found] if found else [PY, "-c", "from patcher.cli import main; main()"]


class Bench:
    """The work directory of a run, the environment of its commands, and ``measure``."""

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

    def measure(self, cmd: list[str], *, env: dict | None = None, sample: bool = False) -> dict:
        """Run ``cmd`` under the wrapper; its figures, stdout and stderr. Exits on failure."""
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
        if r["rc"] != 0:
            raise SystemExit(f"run.py: command failed ({r['rc']}): {shlex.join(spec['cmd'])}\n"
                             f"{r['stderr'][-3000:]}")
        return r


def finish(r: dict) -> dict:
    r["cpu_s"] = r.get("user_s", 0) + r.get("sys_s", 0)
    return r


def rmtree(path: Path) -> None:
    if not (path.exists() or path.is_symlink()):
        return

    def onerror(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o755)
        os.chmod(p, 0o755) if os.path.isdir(p) else None
        func(p)

    shutil.rmtree(path, onerror=onerror)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


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


# --------------------------------------------------------------------------- rounds

# run.py sets "allowed" (--extra-rounds) and, per case and size, "budget_ok" (cost -> bool).
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


# --------------------------------------------------------------------------- statistics

def stats(runs: list[dict], key: str = "wall_s") -> dict:
    vals = [r[key] for r in runs if r.get(key) is not None]
    if not vals:
        return {}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "runs": vals}


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


def pair_ratios(results: dict[str, list[dict]], a: str, b: str) -> list[float]:
    """a / b within each round (the two ran minutes apart at most, under the same load)."""
    return [x["wall_s"] / y["wall_s"] for x, y in zip(results[a], results[b])]


def med(summary: dict, name: str, key: str = "wall_s") -> float:
    return summary[name][key]["median"]


def ratio(summary: dict, a: str, b: str, key: str = "wall_s") -> float | None:
    """median(a) / median(b); None when either command did not run here."""
    if a not in summary or b not in summary or not summary[a].get(key) \
            or not summary[b].get(key):
        return None
    return med(summary, a, key) / med(summary, b, key)
