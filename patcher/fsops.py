"""Filesystem primitives with the durability and sharing rules modelpatch relies on.

- ``link_or_copy`` shares data with the base: reflink where the filesystem has it, else hardlink,
  else copy (``linking`` predicts which, and holds the ``--link`` modes). A linked file keeps its
  inode's mode: chmod on a hardlink would change the base too.
- Files modelpatch writes itself are created read-only (0o444) and fsynced before the commit.
- The one way to write a small file durably: ``write_file`` creates a new file, fsynced;
  ``replace_file`` replaces one atomically (temporary file, fsync, rename, directory fsync).
- ``fsync_dir`` makes renames and new entries durable.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

READ_ONLY = 0o444
FICLONE = 0x40049409  # ioctl number from linux/fs.h


def reflink(src: Path, dst: Path) -> bool:
    """Clone ``src`` to ``dst`` sharing extents (btrfs, XFS, bcachefs). False where unsupported."""
    try:
        with open(src, "rb") as fsrc:
            fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                fcntl.ioctl(fd, FICLONE, fsrc.fileno())
            except OSError:
                os.close(fd)
                os.unlink(dst)
                return False
            os.close(fd)
    except OSError:
        return False
    shutil.copystat(src, dst)
    return True


def link_or_copy(src: Path, dst: Path, *, mode: str = "auto",
                 copy: Callable[[Path, Path], None] | None = None) -> str:
    """Make ``dst`` hold ``src``'s bytes, sharing storage when ``mode`` allows.

    ``mode`` (``linking.MODES``): ``auto`` tries reflink, then hardlink, then copies;
    ``reflink`` and ``hardlink`` raise ``OSError`` rather than fall back; ``copy`` copies.
    ``src`` symlinks are resolved first, so a Hugging Face snapshot's blob is linked, never the
    symlink. ``copy(src, dst)``, if given, makes the copy (the engine's hashes what it copies);
    it must leave ``dst`` read-only. Returns the method used: ``"reflink"``, ``"hardlink"`` or
    ``"copy"``.
    """
    src = Path(os.path.realpath(src))
    if mode in ("auto", "reflink"):
        if reflink(src, dst):
            return "reflink"
        if mode == "reflink":
            raise OSError(errno.EOPNOTSUPP, "cannot reflink it (--link reflink)", str(dst))
    if mode in ("auto", "hardlink"):
        try:
            os.link(src, dst)
            return "hardlink"
        except OSError as exc:
            if mode == "hardlink" or exc.errno not in (
                    errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
    if copy is not None:
        copy(src, dst)
        return "copy"
    shutil.copyfile(src, dst)
    os.chmod(dst, READ_ONLY)
    return "copy"


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory so the entries created or renamed in it are durable."""
    fsync_path(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def make_parents(root: Path, rel: str) -> Path:
    """``root / rel``, its parent folders created."""
    target = root / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def write_file(path: Path, data: bytes, *, mode: int = READ_ONLY) -> None:
    """Create ``path`` (which must not exist) with ``data``, fsync it and set ``mode``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_all(fd, data)
        os.fsync(fd)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes, *, mode: int = 0o600, tmp_dir: Path | None = None,
                 prefix: str = ".tmp-") -> None:
    """Replace ``path`` with ``data`` atomically and durably: a temporary file (``prefix``...
    ``.tmp`` in ``tmp_dir``, default beside ``path``; same file system) with ``mode`` is written,
    fsynced and renamed over ``path``, then ``path``'s directory is fsynced. On an error the
    temporary file is gone and ``path`` is the old file or the new one, whole."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=tmp_dir or path.parent)
    try:
        try:
            os.fchmod(fd, mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def remove_tree(path: Path) -> None:
    """Remove ``path`` (a file, symlink or directory). Missing is fine.

    Read-only files go too: unlinking needs write permission on the directory, not the file.
    """
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


class NotRegularFile(OSError):
    """``read_capped``: the path is a FIFO, a device or a socket."""


class TooLarge(OSError):
    """``read_capped``: the file holds more than the limit (``size`` bytes, or more)."""

    def __init__(self, size: int):
        super().__init__(errno.EFBIG, f"{size} bytes")
        self.size = size


def read_capped(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refused before a byte is read if it is a
    directory (``IsADirectoryError``), a FIFO or device (``NotRegularFile``; ``O_NONBLOCK`` keeps
    the open itself from blocking) or larger than ``limit`` (``TooLarge``, also if it grows while
    read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        if st.st_size > limit:
            raise TooLarge(st.st_size)
        data = f.read(st.st_size + 1)   # (a read of the limit would allocate the limit)
    if len(data) > limit:
        raise TooLarge(len(data))
    return data
