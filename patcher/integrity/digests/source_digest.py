"""The sha256 of a base shard, computed from the bytes a shard rewrite reads anyway.

A first-time apply needs the digest of every base shard it replaces (the provenance manifest and
the revert data record them). Hashing them in a pass of their own reads every byte twice: once to
hash, once to rewrite, which on a 500 GB checkpoint that is not in the page cache is a second full
read of the disk. A rewrite that reads its one source file front to back (dropping, renaming,
casting or dequantizing tensors in place; the scales a dequantization also reads may lie
anywhere in the file) instead feeds each range it reads to a ``SourceDigest``, which reads only
the gaps itself (the header, dropped tensors, the scales not yet passed) and the tail.
A shard rewrite feeds it from two threads (the sources of computed tensors as they are read, the
ranges it copies as they are copied; ``patcher.tensors.writing``): a range the digest has already
passed, having read that gap from the file itself, is skipped, so the digest never depends on the
order the two threads arrive in, only on what the file holds.

The digest counts only if the file did not change while it was read (size, mtime and ctime the
same before and after), as for ``hashing.hash_files_stat``.
"""

from __future__ import annotations

import hashlib
import os
import threading

from ...errors import OperationFailed
from .hashing import CHUNK_SIZE, HashResult


class SourceDigest:
    """sha256 of the whole file behind ``fd``, fed ranges of it by one or two threads."""

    def __init__(self, fd: int):
        self.fd = fd
        self.before = os.fstat(fd)
        self.position = 0
        self.hash = hashlib.sha256()
        self._buf: bytearray | None = None
        self._lock = threading.Lock()

    def feed(self, offset: int, data, ahead: bool = True) -> None:
        """``data`` is the file's content at ``offset``. The part of it the digest has already
        passed (read from the file itself, as a gap before a later range) is skipped. With
        ``ahead=False`` a range that starts past the digest's position is ignored instead of
        reading the gap up to it: the digest reads those bytes itself when it gets there."""
        view = memoryview(data).cast("B")
        with self._lock:
            end = offset + view.nbytes
            if end <= self.position or (not ahead and offset > self.position):
                return
            if offset < self.position:
                view, offset = view[self.position - offset:], self.position
            self._read_to(offset)
            self.hash.update(view)
            self.position = end

    def result(self) -> HashResult:
        """Hash the rest of the file and return the digest; ``stable`` says whether the file
        stayed the same while it was read."""
        with self._lock:
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
