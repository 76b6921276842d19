"""Writing one GGUF file: the new header, then every kept tensor's bytes copied in bulk.

A ``GGUFTask`` rides in a plan's ``rewrite-shard`` entry like a safetensors ``ShardTask`` and is
written by the same shard writer (``patcher.tensors.writing.shard_writer.write_shard`` hands it to
``GGUFTask.write``): the output is hashed as it is written, the source ranges are copied by the
kernel (``copy_file_range``) and hashed from the page cache in the same pass. A resharded output
may draw its tensors from several files of a split set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import OperationFailed
from ..file_task import TaskKind
from .readback import check_written


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
            fds: dict[str, int] = {}
            try:
                source = self._hashed_source(hash_sources)
                digest = SourceDigest(_open(fds, source)) if source else None
                for name, path, offset, nbytes, pad in self.copies:
                    faults.point(f"tensor:{name}")
                    hash_while_copying(_open(fds, path), offset, nbytes, writer,
                                       on_progress=on_progress, source_digest=digest)
                    if pad:
                        writer.write(b"\0" * pad)
                    writeback(writer.size)      # the final fsync finds little left to write
                source_result = digest.result() if digest is not None else None
            finally:
                for fd in fds.values():
                    os.close(fd)
            if writer.size != self.file_size:
                raise OperationFailed(f"wrote {writer.size} bytes, expected {self.file_size}",
                                      where=target)
            check_written(target, self.copies)      # as a reader reads it, before any commit
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


def _open(fds: dict[str, int], path: str) -> int:
    if path not in fds:
        fds[path] = os.open(path, os.O_RDONLY)
    return fds[path]
