"""What a Ray worker runs for ``patcher.execute.ray_executor``: plain functions over absolute
paths on the shared filesystem, each returning only small values (digests, sizes, stat fields).

Nothing here imports ray: the executor wraps these functions in ``ray.remote`` on the driver, and
a worker unpickles them by reference to this module (modelpatch must be installed on every node).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

from .. import __version__

PROBE_MARK = ".modelpatch-ray-probe-"


def write_shard(task, target: str, hash_sources: frozenset[str], cpus: int):
    """Write one shard task's file at ``target``; returns ``(sha256, source, source digest)``.

    Idempotent, so that a retry after a dead worker is safe: the partial file that worker left is
    removed first, and the task writes the same bytes again (the output is a pure function of the
    task and the base)."""
    from ..tensors.writing.shard_writer import write_shard as write
    from ..tensors.writing.thread_budget import quiet_openmp

    if task.bytes_computed:         # torch's threads: the CPUs Ray gave this task
        quiet_openmp()
        import torch

        torch.set_num_threads(cpus)
    if task.device.startswith("cuda:"):    # Ray shows this task only the GPU it was given
        task = dataclasses.replace(task, device="cuda")
    if os.path.lexists(target):
        os.unlink(target)
    sha256, source, digest = write(task, Path(target), None, hash_sources)
    return sha256, source, _portable(digest)


def hash_file(path: str):
    """sha256 of one file: ``(sha256, size, (size, mtime_ns, ctime_ns), stable)``."""
    from ..integrity.digests.hashing import hash_files_stat

    return _portable(hash_files_stat([path], jobs=1)[path])


def _portable(result):
    """A ``HashResult`` without its ``os.stat_result``: the device number of a network
    filesystem differs from node to node, so the driver stats the file itself
    (``ray_executor._localized``) and keeps only the fields every node agrees on."""
    if result is None:
        return None
    st = result.stat
    return result.sha256, result.size, (st.st_size, st.st_mtime_ns, st.st_ctime_ns), result.stable


def node_view(reads: list[tuple[str, int, int]], probes: list[tuple[str, str]]) -> dict:
    """What this node sees of the paths the driver will hand its tasks.

    ``reads``: ``(path, size, mtime_ns)`` as the driver sees them. ``probes``: ``(probe file,
    token)`` the driver wrote into each directory the tasks write to; seeing the token proves
    this is the same directory, not one of the same name, and a file created beside it proves
    this node may write there. Returns this node's name and version and the first problem, if any.
    """
    return {"host": socket.gethostname(), "version": __version__,
            "problem": _first_problem(reads, probes)}


def _first_problem(reads, probes) -> tuple[str, str] | None:
    for path, size, mtime_ns in reads:
        try:
            st = os.stat(path)
        except OSError as exc:
            return path, f"cannot see it ({exc.strerror})"
        if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            return path, (f"sees another file there (size {st.st_size}, mtime_ns {st.st_mtime_ns};"
                          f" the driver sees size {size}, mtime_ns {mtime_ns})")
    for probe, token in probes:
        directory = os.path.dirname(probe)
        try:
            with open(probe, encoding="ascii") as f:
                seen = f.read()
        except OSError as exc:
            return directory, f"cannot see the driver's staging directory ({exc.strerror})"
        if seen != token:
            return directory, "sees another directory of that name"
        mine = f"{probe}.{socket.gethostname()}.{os.getpid()}"
        try:
            os.close(os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.unlink(mine)
        except OSError as exc:
            return directory, f"cannot write there ({exc.strerror})"
    return None
