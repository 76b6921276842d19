"""Advisory locks so two modelpatch processes never work on the same directory at once.

An existing directory is locked with ``flock`` on the directory itself (shared for readers such as
an out-of-place apply reading its base, exclusive for writers such as in-place apply and revert),
which needs no file inside it. An output that does not exist yet is locked through a lock file
beside it, ``.<name>.modelpatch.lock``, removed on release (a lock file left by a killed process
is simply taken over: the kernel released its lock).

Locks are never waited for: a second process fails at once with ``LockHeld``.

Only the process that took a lock holds it. A ``flock`` belongs to the open file, which a forked
child (a shard-writing pool worker) would share: were the main process killed, such a child could
outlive it and keep the directory locked. So forked children close their copies of the lock
descriptors at once (``os.register_at_fork``); the lock then ends with the process that took it,
however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import LockHeld, ModelDirError

_held: set[int] = set()       # lock descriptors this process holds


def _forget_inherited_locks() -> None:
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_forget_inherited_locks)


@contextlib.contextmanager
def lock_directory(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold a shared or exclusive lock on the existing directory ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        raise ModelDirError("no such directory" if not os.path.lexists(path)
                            else "not a directory", where=path) from None
    _held.add(fd)
    try:
        _flock(fd, exclusive, path)
        yield
    finally:
        _release(fd)


@contextlib.contextmanager
def lock_new_path(path: Path) -> Iterator[None]:
    """Exclusively lock ``path`` (which may not exist yet) through a lock file beside it."""
    lock_file = path.parent / f".{path.name}.modelpatch.lock"
    owner = os.getpid()
    while True:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        _held.add(fd)
        try:
            _flock(fd, True, path)
        except BaseException:
            _release(fd)
            raise
        # The previous holder may have unlinked the file between our open and flock: then we
        # hold a lock nobody else can see. Retry until the locked inode is the one on disk.
        try:
            same = os.stat(lock_file).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        _release(fd)
    try:
        yield
    finally:
        if os.getpid() == owner and fd in _held:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_file)
        _release(fd)


def _release(fd: int) -> None:
    """Close ``fd`` unless a fork already closed it in this (child) process."""
    if fd in _held:
        _held.discard(fd)
        os.close(fd)


def _flock(fd: int, exclusive: bool, path: Path) -> None:
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LockHeld("another modelpatch process is working on this directory", where=path,
                       hint="wait for it to finish, then retry") from None
