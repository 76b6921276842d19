"""Where shard tasks and file hashes run: the executor seam.

By default (no executor in effect) they run as they always have: shard tasks in this process or
its worker pool (``patcher.tensors.writing.shard_pool``), file hashes in threads
(``patcher.integrity.digests.hashing``). Inside ``using(executor)`` those two functions hand
their work to ``executor`` instead (``patcher.execute.ray_executor``: a Ray cluster that shares
the model's storage). Everything else (planning, staging, linking, the manifest, the commit)
stays with the caller, so an executor only ever sees self-contained tasks with absolute paths.

An executor has two methods, with the signatures and results of the local functions they stand
in for:

* ``run_shard_tasks(tasks, staging, *, jobs, on_progress, hash_sources) -> ShardResults``
* ``hash_files_stat(paths, *, jobs, on_progress) -> dict[path, HashResult]``

Standard library only: ``tensors`` and ``integrity`` consult it, neither may import ``execute``.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("modelpatch_executor", default=None)


def current():
    """The executor in effect, or None: run here."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(executor) -> Iterator[None]:
    """Send shard tasks and file hashes to ``executor`` (None: run them here) within the block."""
    token = _CURRENT.set(executor)
    try:
        yield
    finally:
        _CURRENT.reset(token)
