"""Writing one GGUF file: the new header, then every kept tensor's bytes copied in bulk.

A ``GGUFTask`` rides in a plan's ``rewrite-shard`` entry like a safetensors ``ShardTask`` and is
written by the same shard writer (``patcher.tensors.writing.shard_writer.write_shard`` hands it to
``GGUFTask.write``): the output is hashed as it is written, the source ranges are copied by the
kernel (``copy_file_range``, which reflinks where the file system shares extents) and hashed
from the page cache in the same pass; the base's digest, unless already known, is taken from
that same pass too. The read-back (``patcher.gguf.readback.check_written``) reads the header
only, while the data is being copied: nothing is read twice. A resharded output may draw its
tensors from several files of a split set.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import OperationFailed
from ..tensors.tasks import TaskKind
from .readback import start_layout_check, written_layout


@dataclass(frozen=True)
class GGUFTask:
    output: str                              # relpath
    header: bytes                            # already padded to the alignment
    # (tensor, absolute path of its base file, absolute offset there, nbytes, padding after)
    copies: tuple[tuple[str, str, int, int, int], ...]
    changed: tuple[str, ...] = ()            # summary lines
    header_in_place: bool = False            # --in-place: only the header region is written
    jobs: tuple = ()                         # no computed tensors: no worker needs torch
    device: str = "cpu"

    @property
    def kind(self) -> TaskKind:
        return TaskKind.GGUF_HEADER if self.header_in_place else TaskKind.GGUF

    def source_paths(self) -> set[str]:
        return {path for _, path, _, _, _ in self.copies}

    @property
    def file_size(self) -> int:
        return len(self.header) + sum(n + pad for _, _, _, n, pad in self.copies)

    @property
    def bytes_copied(self) -> int:
        return sum(n for _, _, _, n, _ in self.copies)

    bytes_computed = 0

    def summary(self) -> dict:
        return {"tensors": len(self.copies), "bytes_copied": self.bytes_copied,
                "bytes_computed": 0, "changed": list(self.changed)}

    def write(self, target: Path, on_progress: Callable[[int], None] | None = None,
              hash_sources: frozenset[str] = frozenset(), *,
              fsync: bool = True) -> tuple[str, str | None, object]:
        """Write the file to ``target`` (which must not exist) and fsync it (unless ``fsync`` is
        False: then the caller makes it durable). Returns its sha256 and, when all
        tensors come from one source that is in ``hash_sources`` and are read in ascending
        order, the source path with its digest, computed from the same reads
        (``patcher.integrity.digests.source_digest``)."""
        from .. import faults
        from ..integrity.digests.hash_writer import HashingWriter, hash_while_copying
        from ..integrity.digests.source_digest import SourceDigest
        from ..tensors.writing.shard_writer import Writeback

        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb", buffering=0) as raw:
            writer, writeback = HashingWriter(raw), Writeback(raw.fileno())
            writer.write(self.header)
            if on_progress:
                on_progress(len(self.header))
            # The file gets its final size now, so a reader can read the header (as one will,
            # before any commit) while the data is copied behind it.
            os.ftruncate(raw.fileno(), self.file_size)
            checked = start_layout_check(target, written_layout(len(self.header), self.copies))
            fds: dict = {}
            pool = ThreadPoolExecutor(2, "hash-copy")   # one for the file, not one per tensor
            # the write-out is started from a thread of its own: sync_file_range blocks while
            # the disk's queue is full, and the hashing must not wait for it
            flusher = ThreadPoolExecutor(1, "write-out")
            try:
                source = self._hashed_source(hash_sources)
                digest = SourceDigest(_open(fds, source)) if source else None
                for name, path, offset, nbytes, pad in self.copies:
                    faults.point(f"tensor:{name}")
                    hash_while_copying(_open(fds, path), offset, nbytes, writer,
                                       on_progress=on_progress, source_digest=digest,
                                       pool=pool)
                    if pad:
                        writer.write(b"\0" * pad)
                    flusher.submit(writeback, writer.size)   # the fsync finds little left
                source_result = digest.result() if digest is not None else None
                _check_unchanged(fds, target)
            except BaseException:
                _wait_quietly(checked)
                raise
            finally:
                pool.shutdown()
                flusher.shutdown()
                for fd in fds.values():
                    if isinstance(fd, int):
                        os.close(fd)
            checked()                           # as a reader reads it, before any commit
            if writer.size != self.file_size:
                raise OperationFailed(f"wrote {writer.size} bytes, expected {self.file_size}",
                                      where=target)
            if fsync:
                os.fsync(raw.fileno())
            os.fchmod(raw.fileno(), 0o444)
        if source_result is None:
            return writer.sha256, None, None
        return writer.sha256, source, source_result

    def _hashed_source(self, hash_sources: frozenset[str]) -> str | None:
        """The one source file, if it is to be hashed and is read front to back."""
        paths = {path for _, path, _, _, _ in self.copies}
        offsets = [offset for _, _, offset, _, _ in self.copies]
        if len(paths) != 1 or offsets != sorted(offsets):
            return None
        (path,) = paths
        return path if path in hash_sources else None


def _wait_quietly(checked) -> None:
    """Let a read-back still running finish before the write's own error propagates."""
    try:
        checked()
    except Exception:      # noqa: BLE001 - the write's error is the one to report
        pass


def _open(fds: dict[str, int], path: str) -> int:
    """The file descriptor of ``path`` (opened once per write); ``fds`` also keeps each file's
    state when it was opened, under ``(path,)``."""
    if path not in fds:
        fds[path] = os.open(path, os.O_RDONLY)
        fds[(path,)] = _state(os.fstat(fds[path]))
    return fds[path]


def _state(st: os.stat_result) -> tuple:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _check_unchanged(fds: dict[str, int], target) -> None:
    """The bytes hashed (from a mapping) and the bytes the kernel copied a moment later are the
    same only if no source changed meanwhile; the output is not read back to compare them, so
    each source's size, mtime and ctime must be what they were when it was opened."""
    for path, fd in list(fds.items()):
        if isinstance(path, str) and fds[(path,)] != _state(os.fstat(fd)):
            raise OperationFailed(f"the base file {path} changed while it was copied", where=target,
                                  hint="nothing was written; run the command again")
