"""Content-addressed blob store of the embedded hub: ``blobs/sha256/ab/abcdef...``.

One read-only file per distinct content. A blob is written to ``tmp/``, hashed while written,
fsynced, checked against the expected digest and only then renamed to its final name, so a crash
leaves at most a stray temp file, never a partial blob. Blobs are never garbage-collected.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .durable_files import fsync_dir
from ..request_errors import BadRequest


class BlobStore:
    """Blobs under ``blobs`` (named by sha256), written through temp files in ``tmp``. Creates
    both directories."""

    def __init__(self, blobs: Path, tmp: Path):
        self.tmp = tmp
        self.blobs = blobs
        for d in (self.tmp, self.blobs):
            d.mkdir(parents=True, exist_ok=True)

    def blob_path(self, sha256: str) -> Path:
        return self.blobs / sha256[:2] / sha256

    def blob_size(self, sha256: str) -> int | None:
        try:
            return self.blob_path(sha256).stat().st_size
        except FileNotFoundError:
            return None

    def blob_writer(self) -> BlobWriter:
        return BlobWriter(self)

    def put_bytes(self, data: bytes) -> str:
        """Store ``data`` as a blob; returns its sha256."""
        with self.blob_writer() as writer:
            writer.write(data)
            return writer.commit()


class BlobWriter:
    """Writes one blob: into a temp file under the store's tmp, hashed as written, renamed into
    place by ``commit`` once the digest is checked. Use as a context manager: leaving without
    ``commit`` (an error, a client that went away) deletes the temp file."""

    def __init__(self, store: BlobStore):
        self._store = store
        fd, name = tempfile.mkstemp(dir=store.tmp, prefix="blob-")
        self._tmp = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._sha = hashlib.sha256()
        self.size = 0
        self._done = False

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._sha.update(data)
        self.size += len(data)

    def commit(self, expected_sha256: str | None = None, expected_size: int | None = None) -> str:
        """Check the digest (and size), move the blob into the store; returns its sha256."""
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            digest = self._sha.hexdigest()
            if expected_size is not None and self.size != expected_size:
                raise BadRequest(f"upload has {self.size} bytes, expected {expected_size}")
            if expected_sha256 is not None and digest != expected_sha256:
                raise BadRequest(f"upload has sha256 {digest}, expected {expected_sha256}")
            dest = self._store.blob_path(digest)
            if dest.exists():
                return digest  # same content already stored: keep one copy
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self._tmp, 0o444)
            os.replace(self._tmp, dest)
            fsync_dir(dest.parent)
            self._done = True
            return digest
        finally:
            self.abort()

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        if not self._done:
            self._tmp.unlink(missing_ok=True)
            self._done = True

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()
