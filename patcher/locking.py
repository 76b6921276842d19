"""Advisory locks so two modelpatch processes never work on the same directory at once.

An existing directory is locked with ``flock`` on the directory itself (shared for readers such as
an out-of-place apply reading its base, exclusive for writers such as in-place apply and revert),
which needs no file inside it. An output that does not exist yet is locked through a lock file
beside it, ``.<name>.modelpatch.lock``, removed on release.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from .errors import LockHeld


@contextlib.contextmanager
def lock_directory(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold a shared or exclusive lock on the existing directory ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _flock(fd, exclusive, path)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def lock_new_path(path: Path) -> Iterator[None]:
    """Exclusively lock ``path`` (which may not exist yet) through a lock file beside it."""
    lock_file = path.parent / f".{path.name}.modelpatch.lock"
    while True:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _flock(fd, True, path)
        except BaseException:
            os.close(fd)
            raise
        # The previous holder may have unlinked the file between our open and flock: then we
        # hold a lock nobody else can see. Retry until the locked inode is the one on disk.
        try:
            same = os.stat(lock_file).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_file)
        os.close(fd)


def _flock(fd: int, exclusive: bool, path: Path) -> None:
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LockHeld("another modelpatch process is working on this directory", where=path,
                       hint="wait for it to finish, then retry") from None
