"""Crash-safe small files of the hub store: atomic JSON replacement and directory fsync."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a rename or creation inside directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomically(path: Path, obj: Any, *, tmp_dir: Path) -> None:
    """Atomically replace ``path`` with ``obj`` as JSON (temp file in ``tmp_dir``, fsync, rename)."""
    fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="json-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(name, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    fsync_dir(path.parent)


def read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())
