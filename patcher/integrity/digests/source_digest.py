"""The sha256 of a base shard, computed from the bytes a shard rewrite reads anyway.

A first-time apply needs the digest of every base shard it replaces (the provenance manifest and
the revert data record them). Hashing them in a pass of their own reads every byte twice: once to
hash, once to rewrite, which on a 500 GB checkpoint that is not in the page cache is a second full
read of the disk. A rewrite that reads its one source file front to back (dropping, renaming,
casting or dequantizing tensors in place) instead feeds each range it reads to a
``SourceDigest``, which reads only the gaps itself (the header, dropped tensors) and the tail.

The digest counts only if the file did not change while it was read (size, mtime and ctime the
same before and after), as for ``hashing.hash_files_stat``.
"""

from __future__ import annotations

import hashlib
import os

from ...errors import OperationFailed
from .hashing import CHUNK_SIZE, HashResult
from ...tensors.tasks import ShardTask


def single_source_in_order(task: ShardTask) -> str | None:
    """The one file ``task`` reads, if it reads it in ascending, non-overlapping ranges (so a
    ``SourceDigest`` can follow along); else None."""
    path, end = None, 0
    for job in task.jobs:
        for src in job.inputs:
            if path is None:
                path = src.path
            if src.path != path or src.offset < end:
                return None
            end = src.offset + src.nbytes
    return path


class SourceDigest:
    """sha256 of the whole file behind ``fd``, fed the ranges its reader reads, in order."""

    def __init__(self, fd: int):
        self.fd = fd
        self.before = os.fstat(fd)
        self.position = 0
        self.hash = hashlib.sha256()
        self.in_order = True
        self._buf: bytearray | None = None

    def feed(self, offset: int, data) -> None:
        """``data`` is the file's content at ``offset``. A range behind the position already
        hashed (reads out of order) gives the digest up; ``result`` then returns None."""
        if not self.in_order:
            return
        if offset < self.position:
            self.in_order = False
            return
        self._read_to(offset)
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.position += view.nbytes

    def result(self) -> HashResult | None:
        """Hash the rest of the file and return the digest, or None if it cannot be trusted."""
        if not self.in_order:
            return None
        self._read_to(None)
        after = os.fstat(self.fd)
        stable = (self.position == self.before.st_size == after.st_size
                  and self.before.st_mtime_ns == after.st_mtime_ns
                  and self.before.st_ctime_ns == after.st_ctime_ns)
        return HashResult(self.hash.hexdigest(), self.position, self.before, stable)

    def _read_to(self, end: int | None) -> None:
        """Hash the file from the current position to ``end`` (None: to its end)."""
        if self._buf is None:
            self._buf = bytearray(CHUNK_SIZE)
        view = memoryview(self._buf)
        while end is None or self.position < end:
            want = CHUNK_SIZE if end is None else min(CHUNK_SIZE, end - self.position)
            n = os.preadv(self.fd, [view[:want]], self.position)
            if n == 0:
                if end is not None:
                    raise OperationFailed(f"unexpected end of file at byte {self.position}")
                break
            self.hash.update(view[:n])
            self.position += n
