"""How a tensor rewrite shares the machine's cores: worker processes x torch threads.

The rule (issue 20): ``workers x torch intra-op threads <= cores``, where cores are the CPUs this
process may run on (``hashing.default_jobs``: taskset and cpusets respected).

* ``-j N`` is the number of worker processes (1: the rewrite runs in this process), never more
  than there are shards to write. Each gets ``cores // N`` torch threads (at least one), so
  ``-j 1`` uses every core through torch and ``-j <cores>`` one each.
* Unset, one worker per shard up to the number of cores: shards are independent and a worker
  keeps its own read-compute-write pipeline busy (``patcher.shard_pipeline``), which one
  process with many torch threads cannot (its reading, hashing and writing are serial, and
  torch parallelizes each 1M-element chunk of a kernel across threads that then wait for one
  another). The cores left over when there are fewer shards than cores go to torch threads.
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

from .hashing import default_jobs


def split(jobs: int | None, tasks: int, cores: int | None = None) -> tuple[int, int]:
    """``(workers, torch threads per worker)`` for ``tasks`` shards and ``-j jobs``."""
    cores = cores or default_jobs()
    workers = max(1, min(jobs or cores, tasks))
    return workers, max(1, cores // workers)


def quiet_openmp() -> None:
    """Let idle OpenMP threads sleep instead of spinning: must run before torch is imported
    (libgomp reads the variable when it loads). A value the user set is kept."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
