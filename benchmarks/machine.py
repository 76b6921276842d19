"""The machine a run measures on: the physical limits of its CPU and disk (measured at the start
of every run), what it is (CPU, RAM, file system) and the versions of what runs on it."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shlex
import shutil
import ssl
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from measure import CORES, GB, rmtree

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- physical limits


def _gbps(total: int, times: list[float]) -> dict:
    return {"best": total / min(times) / GB, "median": total / statistics.median(times) / GB}


def _timed(fn: Callable[[], object], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _write(path: Path, block: bytes, chunks: int, fsync: bool) -> None:
    with open(path, "wb", buffering=0) as f:
        for _ in range(chunks):  # noqa: FURB122  (big writes, as a copy makes them)
            f.write(block)
        if fsync:
            os.fsync(f.fileno())


def _write_limit(d: Path, block: bytes, chunks: int, fsync: bool) -> list[float]:
    """Two timed sequential writes of ``chunks`` blocks, each file removed after it. Without
    fsync, the page cache is flushed (untimed) before each, so none pays for dirty pages."""
    if not fsync:
        os.sync()
    times = []
    for i in range(2):
        path = d / f"{'s' if fsync else 'w'}{i}.bin"
        t0 = time.perf_counter()
        _write(path, block, chunks, fsync)
        times.append(time.perf_counter() - t0)
        path.unlink()
        if not fsync:
            os.sync()
    return times


def _cp_limit(d: Path, src: Path, cmd: str) -> list[float]:
    times = []
    for i in range(2):
        dst = d / f"cp{i}.bin"
        os.sync()
        t0 = time.perf_counter()
        subprocess.run(["sh", "-c", cmd.format(src=shlex.quote(str(src)),
                                               dst=shlex.quote(str(dst)))], check=True)
        times.append(time.perf_counter() - t0)
        dst.unlink()
    return times


def measure_limits(work: Path, nbytes: int) -> dict:
    """sha256 GB/s per core (memory and page-cached file), sequential write GB/s without and
    with fsync, and cp GB/s (page cache to page cache, and with sync)."""
    d = work / "limits"
    rmtree(d)
    d.mkdir(parents=True)
    block = os.urandom(64 << 20)
    chunks = max(1, nbytes // len(block))
    total = chunks * len(block)
    res: dict = {"bytes": total}

    def hash_mem():
        h = hashlib.sha256()
        for _ in range(chunks):
            h.update(block)
    res["sha256_mem_gbps_per_core"] = _gbps(total, _timed(hash_mem, 3))
    res["write_gbps_no_fsync"] = _gbps(total, _write_limit(d, block, chunks, False))
    res["write_gbps_fsync"] = _gbps(total, _write_limit(d, block, chunks, True))
    src = d / "src.bin"
    _write(src, block, chunks, True)

    def hash_file():
        with open(src, "rb") as f:
            hashlib.file_digest(f, "sha256")
    hash_file()
    res["sha256_file_gbps_per_core"] = _gbps(total, _timed(hash_file, 3))
    for label, cmd in (("cp_gbps", "cp {src} {dst}"), ("cp_sync_gbps", "cp {src} {dst} && sync")):
        res[label] = _gbps(total, _cp_limit(d, src, cmd))
    rmtree(d)
    return res


# --------------------------------------------------------------------------- the machine

def _cpu() -> tuple[str, str]:
    """The CPU's model name and its flags line from /proc/cpuinfo."""
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
    return cpu, flags


def _ram_bytes() -> int | None:
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return mem


def _mount(work: Path) -> dict:
    """The mount point, device, type and options of the file system that holds ``work``."""
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
    return fs


def machine_info(work: Path) -> dict:
    cpu, flags = _cpu()
    mem = _ram_bytes()
    fs = _mount(work)
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
