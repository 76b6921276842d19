"""Writing output files while hashing them, and copying byte ranges in bulk.

Every byte of an output goes through a ``HashingWriter``, so its sha256 comes out of the write
path and the file is never read back. ``hash_while_copying`` moves unchanged tensor bytes with the
kernel (``copy_file_range``, else ``sendfile``) while hashing the same range from a bounded mmap
window of the source.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from ...errors import OperationFailed
from .hashing import HashResult

ProgressFn = Callable[[int], None]

COPY_WINDOW = 64 << 20
"""hash_while_copying maps and copies this much of the source at a time (bounds mapped memory)."""

PARALLEL_MIN = 8 << 20
"""From this many bytes on, hash_while_copying runs the kernel copy and the source's digest in
threads beside the output's digest (hashlib and copy_file_range release the GIL): one pass over
the bytes costs the slowest of the three, not their sum."""


class HashingWriter:
    """Write through to a binary file object, computing the sha256 and size of what was written.

    Every byte of the output must go through :meth:`write` or :func:`hash_while_copying` so that
    ``sha256`` describes the file; the written file is then never read back. The wrapped file
    object stays owned (and closed) by the caller.

    Example:
        >>> with open(tmp, "wb") as f:  # doctest: +SKIP
        ...     w = HashingWriter(f)
        ...     w.write(header)
        ...     hash_while_copying(src_fd, offset, length, w)
        ...     f.flush(); os.fsync(f.fileno())
        >>> record = (w.sha256, w.size)  # doctest: +SKIP
    """

    def __init__(self, fileobj):
        self._f = fileobj
        self._h = hashlib.sha256()
        self._size = 0
        self._broken = False

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._size

    @property
    def sha256(self) -> str:
        """sha256 (lowercase hex) of the bytes written so far."""
        self._check()
        return self._h.hexdigest()

    @property
    def fileobj(self):
        return self._f

    def _check(self) -> None:
        if self._broken:
            raise OperationFailed("an earlier write failed; the output and its digest are "
                                  "incomplete")

    def write(self, data) -> int:
        """Write all of ``data`` (any C-contiguous buffer), hash it, and return its length."""
        self._check()
        view = memoryview(data)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        n = view.nbytes
        done = 0
        try:
            while done < n:
                k = self._f.write(view[done:])
                if k is None:  # a non-blocking raw file would do this; ours never are
                    raise BlockingIOError(errno.EAGAIN, "write would block")
                done += k
        except BaseException:
            self._broken = True
            raise
        self._h.update(view)
        self._size += n
        return n

    def flush(self) -> None:
        self._f.flush()

    def fileno(self) -> int:
        return self._f.fileno()


# How hash_while_copying moves bytes: the first that works is kept for the rest of the call.
_COPY_FALLBACK_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF,
                         errno.ETXTBSY, errno.EPERM, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def _copy_kernel(method: str, src_fd: int, dst_fd: int, src_off: int, dst_off: int,
                 count: int) -> int:
    """Copy up to ``count`` bytes in the kernel; return how many were copied (0: no progress)."""
    if method == "copy_file_range":
        return os.copy_file_range(src_fd, dst_fd, count, src_off, dst_off)
    # sendfile writes at the destination's file offset.
    os.lseek(dst_fd, dst_off, os.SEEK_SET)
    return os.sendfile(dst_fd, src_fd, src_off, count)


def hash_while_copying(src_fd: int, offset: int, length: int, dst: HashingWriter, *,
                       on_progress: ProgressFn | None = None, source_digest=None,
                       pool: ThreadPoolExecutor | None = None) -> int:
    """Append bytes ``[offset, offset + length)`` of ``src_fd`` to ``dst``, hashing them once.

    The range is hashed from an mmap of the source (no copy into Python) and copied into the
    destination by the kernel with ``os.copy_file_range`` (which reflinks on XFS/btrfs and copies
    server-side on NFS), falling back to ``sendfile`` and then to writing the mapped bytes. The
    digest and size of ``dst`` include the range; a ``source_digest``
    (``patcher.integrity.digests.source_digest.SourceDigest``) is fed the same mapped bytes. Returns
    ``length``. A ``pool`` of two threads, if given, runs the copy and the source's digest of
    ranges of ``PARALLEL_MIN`` bytes or more (a writer copying many ranges passes one, so that
    no call starts threads of its own); it stays the caller's to shut down.

    The source must not change while it is copied (base files are read-only in modelpatch): the
    bytes copied by the kernel are read a moment after the bytes hashed.

    Raises:
        OperationFailed: the source is shorter than ``offset + length``, or an I/O error.
    """
    if offset < 0 or length < 0:
        raise ValueError(f"bad range: offset={offset} length={length}")
    dst._check()
    f = dst.fileobj
    try:
        src_size = os.fstat(src_fd).st_size
        if offset + length > src_size:
            raise OperationFailed(
                f"source range [{offset}, {offset + length}) is past its end ({src_size} bytes)")
        if length == 0:
            return 0
        f.flush()
        dst_fd = f.fileno()
        dst_pos = f.tell()
    except OSError as exc:
        raise OperationFailed(f"cannot copy into the output: {exc.strerror or exc}") from exc

    methods = [m for m in ("copy_file_range", "sendfile") if hasattr(os, m)]
    done = 0
    # Per call (or per caller), not per module: a forked worker process must not inherit a
    # pool's dead threads.
    own = ThreadPoolExecutor(2, "hash-copy") if pool is None and length >= PARALLEL_MIN else None
    pool = (own or pool) if length >= PARALLEL_MIN else None
    try:
        while done < length:
            win_off = offset + done
            win_len = min(COPY_WINDOW, length - done)
            if done + win_len < length:
                _read_ahead(src_fd, win_off + win_len, min(COPY_WINDOW, length - done - win_len))
            _hash_and_copy_window(src_fd, win_off, win_len, dst, dst_fd, dst_pos + done, methods,
                                  source_digest, pool)
            done += win_len
            if on_progress is not None:
                on_progress(win_len)
        f.seek(dst_pos + length)  # the file object's position follows the copied bytes
    except BaseException as exc:
        dst._broken = True
        if isinstance(exc, OSError):
            raise OperationFailed(f"copy into the output failed: {exc.strerror or exc}") from exc
        raise
    finally:
        if own is not None:
            own.shutdown()
    dst._size += length
    return length


def _read_ahead(src_fd: int, offset: int, length: int) -> None:
    """Let the kernel read the next window while this one is hashed (advice only)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(src_fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass


def _hash_and_copy_window(src_fd: int, win_off: int, win_len: int, dst: HashingWriter,
                          dst_fd: int, dst_off: int, methods: list[str],
                          source_digest=None, pool: ThreadPoolExecutor | None = None) -> None:
    """Hash ``win_len`` bytes of ``src_fd`` at ``win_off`` into ``dst``'s digest from an mmap
    window, and copy the same bytes to ``dst_fd`` at ``dst_off`` (size bookkeeping is the
    caller's). With a ``pool``, the copy and the source's digest run in its threads meanwhile;
    every one of them is done when this returns."""
    gran = mmap.ALLOCATIONGRANULARITY
    map_off = win_off - win_off % gran
    skip = win_off - map_off
    mm = mmap.mmap(src_fd, skip + win_len, offset=map_off, access=mmap.ACCESS_READ)
    try:
        view = memoryview(mm)[skip:]
        try:
            def copy() -> None:
                copied = 0
                while copied < win_len:
                    k = _copy_in_kernel(methods, src_fd, dst_fd, win_off + copied,
                                        dst_off + copied, win_len - copied)
                    if k == 0:
                        # Last resort, and exact: write the very bytes that were hashed.
                        k = os.pwrite(dst_fd, view[copied:], dst_off + copied)
                    copied += k

            def feed_source() -> None:
                if source_digest is not None:
                    source_digest.feed(win_off, view)

            if pool is None:
                dst._h.update(view)
                feed_source()
                copy()
            else:
                side = [pool.submit(copy), pool.submit(feed_source)]
                try:
                    dst._h.update(view)
                finally:
                    errors = [f.exception() for f in side]   # waits for both
                for exc in errors:
                    if exc is not None:
                        raise exc
        finally:
            view.release()
    finally:
        mm.close()


def _copy_in_kernel(methods: list[str], src_fd: int, dst_fd: int, src_off: int, dst_off: int,
                    count: int) -> int:
    """Copy up to ``count`` bytes with the first of ``methods`` that makes progress; return how
    many were copied. A method that is unsupported here or makes no progress is dropped from
    ``methods`` for the rest of the call; 0 once none is left."""
    while methods:
        try:
            k = _copy_kernel(methods[0], src_fd, dst_fd, src_off, dst_off, count)
        except OSError as exc:
            if exc.errno not in _COPY_FALLBACK_ERRNOS:
                raise
            k = 0
        if k > 0:
            return k
        methods.pop(0)  # unsupported here, or no progress: next method
    return 0


def copy_hashed(src: Path, dst: Path) -> HashResult:
    """Copy ``src`` to a new read-only, fsynced ``dst`` in the kernel, hashing the bytes as they
    are copied (``hash_while_copying``); returns the digest with ``src``'s status before and after
    (``stable`` False if it changed meanwhile)."""
    from ...fsops import READ_ONLY

    with open(src, "rb") as fsrc:
        before = os.fstat(fsrc.fileno())
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb", buffering=0) as raw:
            writer = HashingWriter(raw)
            hash_while_copying(fsrc.fileno(), 0, before.st_size, writer)
            os.fsync(fd)
            os.fchmod(fd, READ_ONLY)
        after = os.fstat(fsrc.fileno())
    stable = (before.st_size == after.st_size and before.st_mtime_ns == after.st_mtime_ns
              and before.st_ctime_ns == after.st_ctime_ns)
    return HashResult(writer.sha256, writer.size, before, stable)
