"""How ``patcher.tensors.writing.shard_writer`` runs several shards at a time: collecting them as they
finish and stopping the rest on a failure, the GIL's turns while threads of this process write
shards, and how worker processes start and end."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, wait

# The GIL's switch interval while threads of this process write shards. A thread coming back
# from a call that released the GIL (a torch kernel or launch, a read, a write, sha256) waits
# for it until the thread holding it has run this long; the computing, reading and writing
# threads of every shard do that thousands of times a second. On a 16-core H200 machine,
# fp8-block-to-bf16 --device cuda -j 8 of a 2 GB model took 27.9 s at Python's default 5 ms and
# 15.1 s at 0.5 ms under benchmarks/sample_stacks.py (one run each, the first one the machine's
# first CUDA run); without the profiler, 14.4-16.0 s at 5 ms before the float64 kernels and
# 13.4 s at 0.5 ms after them (benchmarks/report/issue20.md).
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
