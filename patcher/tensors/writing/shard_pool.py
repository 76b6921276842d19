"""Running a rewrite's shard tasks: one after another, or several at a time in worker processes
or threads (``patcher.tensors.writing.shard_writer`` writes each one); collecting them as they
finish and stopping the rest on a failure, the GIL's turns while threads of this process write
shards, and how worker processes start and end."""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ... import collector, dispatch, interrupts
from ...fsops import fsync_path
from ...integrity.digests.hashing import HashResult
from ..tasks import ShardTask
from . import shard_writer
from .thread_budget import quiet_openmp, split, use_threads

# Devices whose shards, with --jobs N, are written by N threads of this process rather than by
# worker processes. Measured on a 16-core H200 machine (fp8-block-to-bf16 of a 2 GB model, 24
# shards, 3,872 computed tensors; the process figures with slower CUDA kernels than the
# threads'): on the GPU, threads -j 4 took 12.0 s and 26 CPU-s against 11.7 s and
# 41 CPU-s for 4 spawned processes (each imports torch and starts CUDA, 4.5 s and 6.4 CPU-s).
# On the CPU, threads -j 8 took 14.5 s and 42 CPU-s against 8.9 s and 68 CPU-s for processes:
# the Python between the kernels of thousands of small tensors, serialized by the GIL, costs
# more wall time than the processes' torch imports.
THREADED_DEVICES = ("cuda",)

# Below this many bytes of computed tensors, an unset --jobs writes in this process: a worker
# that computes must import torch (over a second) before its first tensor.
SMALL_COMPUTE = 256 << 20

# The GIL's switch interval while threads of this process write shards. A thread coming back
# from a call that released the GIL (a torch kernel or launch, a read, a write, sha256) waits
# for it until the thread holding it has run this long; the computing, reading and writing
# threads of every shard do that thousands of times a second. On a 16-core H200 machine,
# fp8-block-to-bf16 --device cuda -j 8 of a 2 GB model took 27.9 s at Python's default 5 ms and
# 15.1 s at 0.5 ms under benchmarks/sample_stacks.py (one run each, the first one the machine's
# first CUDA run); without the profiler, 14.4-16.0 s at 5 ms before the float64 kernels and
# 13.4 s at 0.5 ms after them.
SWITCH_INTERVAL = 0.0005


@contextlib.contextmanager
def short_gil_turns():
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, SWITCH_INTERVAL))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def gather(futures: dict, collect, on_progress, stop: threading.Event | None) -> None:
    """``collect(task, result)`` for each shard as it is done; on the first failure (or Ctrl-C)
    cancel those not started and tell the running threads to ``stop``, then raise."""
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                task = futures[future]
                collect(task, future.result())
                if on_progress:
                    on_progress(task.file_size)
    except BaseException:
        if stop is not None:
            stop.set()
        for future in pending:
            future.cancel()
        raise


def pool_context(computes: bool):
    """Workers that only copy bytes are forked: instant, and they never touch torch. Workers that
    compute are spawned (a fresh interpreter each, importing torch there): forked from this
    process they could hang in their first parallel torch op once this process has used OpenMP
    (GNU libgomp does not survive a fork), and CUDA cannot be used after a fork. A fork server
    would import torch only once, but its workers are not this process's children: their CPU
    time and memory would escape ``wait4``/``RUSAGE_CHILDREN``, and a worker could not tell
    which process to take down with it (``faults``)."""
    methods = multiprocessing.get_all_start_methods()
    if not computes and "fork" in methods:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def die_with(parent: int) -> None:
    """End this worker when ``parent`` (the apply) ends, however it ends: a worker left behind
    by a killed apply would go on writing into a staging directory nobody will commit (Linux
    ``PR_SET_PDEATHSIG``; elsewhere the pool's broken pipe ends it at its next task)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:      # it ended before the request took effect
        os._exit(1)


@dataclass(frozen=True)
class ShardResults:
    outputs: dict[str, str]              # output relpath -> sha256
    sources: dict[str, HashResult]       # source path -> its digest, computed while rewriting


def run_shard_tasks(tasks: list[ShardTask], staging: Path, *, jobs: int | None = None,
                    on_progress: Callable[[int], None] | None = None,
                    hash_sources: frozenset[str] = frozenset()) -> ShardResults:
    """Write every task's shard under ``staging``.

    A task whose one source file is in ``hash_sources`` and is read front to back also yields
    that file's sha256 (``patcher.integrity.digests.source_digest``), so that it is not read a
    second time.

    With ``jobs`` > 1 the shards are written ``jobs`` at a time, one task each, the biggest
    first: on a GPU (``THREADED_DEVICES``) by threads of this process, else by worker processes
    (``pool_context``). Left unset (None), ``patcher.thread_budget.split`` chooses,
    except that less than ``SMALL_COMPUTE`` bytes of computed tensors are written in turn. The
    first failure (or Ctrl-C) cancels the tasks not started yet and is raised once the running
    ones end (threads stop at their next tensor).

    Inside ``patcher.dispatch.using(executor)`` the executor runs them instead.
    """
    remote = dispatch.current()
    if remote is not None:
        return remote.run_shard_tasks(tasks, staging, jobs=jobs, on_progress=on_progress,
                                      hash_sources=hash_sources)
    computes = any(j.op != "copy" for t in tasks for j in t.jobs)
    if jobs is None and computes and sum(t.bytes_computed for t in tasks) < SMALL_COMPUTE:
        jobs = 1        # starting workers (each imports torch) would cost more than it saves
    jobs, threads = split(jobs, len(tasks), computes=computes)
    results = ShardResults({}, {})
    threaded = computes and all(t.device.split(":")[0] in THREADED_DEVICES for t in tasks)
    if computes and (jobs <= 1 or threaded):
        load_torch()        # here, so that its thread count is set before any thread runs
    if jobs <= 1:
        use_threads(threads)
        return _in_turn(tasks, staging, results, on_progress, hash_sources)
    order = sorted(tasks, key=lambda t: t.file_size, reverse=True)
    collect = functools.partial(_collect, results)
    if threaded:
        use_threads(threads)
        stop = threading.Event()
        with short_gil_turns(), ThreadPoolExecutor(jobs, thread_name_prefix="shard") as pool:
            futures = {pool.submit(shard_writer.write_shard, t, staging / t.output, None,
                                   hash_sources, stop=stop): t for t in order}
            gather(futures, collect, on_progress, stop)
        return results
    with contextlib.ExitStack() as stack:
        with interrupts.workers_started():       # Ctrl-C is this process's to handle
            pool = stack.enter_context(ProcessPoolExecutor(
                max_workers=jobs, mp_context=pool_context(computes), initializer=_init_worker,
                initargs=(threads, os.getpid(), computes)))
            futures = {pool.submit(shard_writer.write_shard, t, staging / t.output, None,
                                   hash_sources): t for t in order}
        gather(futures, collect, on_progress, None)
    return results


def _init_worker(threads: int, parent: int, computes: bool) -> None:
    die_with(parent)
    quiet_openmp()
    collector.ONE_COMMAND = True        # a worker ends with the apply that started it
    if computes:
        load_torch()
    use_threads(threads)


def load_torch() -> None:
    """Import torch and the tensor computations with the garbage collector paused, then (in a
    one-command process) frozen: importing torch makes enough objects to trigger full
    collections (three, 0.23 s, in a 2-core apply; ``gc.callbacks``), and the tensor work after
    it would rescan them all at each of its own."""
    with collector.paused(), interrupts.deferred():
        from ..compute import compute  # noqa: F401  (torch, the schemes and their kernels)


def _in_turn(tasks: list[ShardTask], staging: Path, results: ShardResults, on_progress,
             hash_sources: frozenset[str]) -> ShardResults:
    """Write the shards one after another, each one's fsync in a thread of its own while the
    next is written: an fsync waits for the disk (and its cache flush) however little is left
    to write, and nothing else would run meanwhile. Returns once every shard is durable; a
    failed fsync is raised then."""
    with ThreadPoolExecutor(1, thread_name_prefix="shard-fsync") as syncer:
        synced = []
        for task in tasks:
            target = staging / task.output
            _collect(results, task, shard_writer.write_shard(task, target, on_progress,
                                                             hash_sources, fsync=False))
            synced.append(syncer.submit(fsync_path, target))
        for future in synced:
            future.result()
    return results


def _collect(results: ShardResults, task: ShardTask,
             written: tuple[str, str | None, HashResult | None]) -> None:
    sha256, source, digest = written
    results.outputs[task.output] = sha256
    if source is not None and digest is not None:
        results.sources[source] = digest
