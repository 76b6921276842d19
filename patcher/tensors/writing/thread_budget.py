"""How a tensor rewrite shares the machine's cores: shard workers x torch threads.

The rule: ``workers x torch intra-op threads <= cores``, where cores are the CPUs this
process may run on (``hashing.default_jobs``: taskset and cpusets respected).

* ``-j N`` is the number of shards written at a time (1: one after another, in this process),
  never more than there are shards to write: by N worker processes, or on a GPU by N threads of
  this process (``patcher.tensors.writing.shard_pool.THREADED_DEVICES`` says why). Each gets
  ``cores // N`` torch threads (at least one), so ``-j 1`` uses every core through torch and
  ``-j <cores>`` one each.
* Unset, half as many workers as cores (at least one, at most one per shard), each with two
  torch threads. Measured side by side on a 16-core H200 machine (24 shards, 2 GB models):
  fp8-block-to-bf16 took 8.93 s and 67.9 CPU-s with 8 workers against 8.64 s and 109.3 CPU-s
  with 16; nvfp4-to-bf16 9.87 s and 73.2 CPU-s against 10.03 s and 115.0 CPU-s: past half the
  cores the output's fsync'd writes bound the time, and every further worker only adds its own
  start (a fresh interpreter importing torch) and its contention. Each worker also keeps its own
  read-compute-write pipeline busy (``patcher.shard_pipeline``), which the torch threads of one
  process cannot: those parallelize each 1M-element chunk of a kernel and then wait for one
  another. On 2 cores the rule gives one process with two torch threads (18.8 s against 21.1 s
  for two workers there, fp8-block-to-bf16 of a 0.5 GB model).
* Each worker's reader and writer threads are not counted: they wait on the compute or the
  disk most of the time, and their work (reads out of the page cache, sha256 of what is
  written) is work the compute would otherwise wait for.
* OpenMP threads sleep when idle (``OMP_WAIT_POLICY=PASSIVE``, unless the environment sets it):
  by default they spin for a while after each parallel region, which burns a core per thread
  between the many small regions of a chunked kernel and, on a loaded machine, stalls the
  threads that have work (measured on the 2-core machine: ``-j 1`` 74.7 s and 21 CPU-s
  spinning, 18.8 s and 6.7 CPU-s passive).
"""

from __future__ import annotations

import os
import sys

from ...integrity.digests.hashing import default_jobs


def split(jobs: int | None, tasks: int, cores: int | None = None, *,
          computes: bool = True) -> tuple[int, int]:
    """``(workers, torch threads per worker)`` for ``tasks`` shards and ``-j jobs``. Shards that
    are only copied (no torch) get one worker per core by default: each is one sha256 stream."""
    cores = cores or default_jobs()
    workers = max(1, min(jobs or (cores // 2 if computes else cores), tasks))
    return workers, max(1, cores // workers)


def quiet_openmp() -> None:
    """Let idle OpenMP threads sleep instead of spinning: must run before torch is imported
    (libgomp reads the variable when it loads). A value the user set is kept."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# Threads torch should use in this process, once it is loaded (None: as it is).
_pending: int | None = None


def use_threads(threads: int) -> None:
    """Give torch ``threads`` intra-op threads: now if it is loaded, else at ``apply_threads``
    (this module does not import torch)."""
    global _pending
    _pending = threads
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def apply_threads() -> None:
    """Called once torch is loaded, before its first kernel: the count ``use_threads`` left."""
    global _pending
    if _pending is not None:
        sys.modules["torch"].set_num_threads(_pending)
        _pending = None
