"""Bytes a download has written so far, for modelpatch's own meter: huggingface_hub's bars are
off during our calls (``connection.hub_output``), and its downloads land in a directory we
know (pull's staging directory, the cache folder of an ``hf://`` model), so a thread sums the
sizes of the files there a few times a second and reports how much they grew.

Files being moved from huggingface_hub's ``.incomplete`` names to their own may be missed or
seen twice by one pass; only growth beyond what was already reported is passed on, and the
last pass, after the download, is exact.
"""

from __future__ import annotations

import os
import stat
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

POLL_SECONDS = 0.2


def tree_bytes(root: Path) -> int:
    """The bytes of the files downloaded under ``root`` so far: those in place and those still
    being written (``*.incomplete``); huggingface_hub's bookkeeping (its ``.cache/`` folder in a
    local directory, a cache's ``refs/``, metadata and locks) and symlinks left out; 0 if
    ``root`` is absent."""
    total = 0
    for dirpath, dirs, files in os.walk(root):
        bookkeeping = os.path.relpath(dirpath, root).split(os.sep)[0] in (".cache", "refs")
        for name in files:
            if bookkeeping and not name.endswith(".incomplete"):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:                     # moved or removed meanwhile
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


@contextmanager
def reported_growth(root: Path, on_progress: Callable[[int], None] | None) -> Iterator[None]:
    """Call ``on_progress(n)`` with the bytes the files under ``root`` grow by while the block
    runs (nothing without ``on_progress``)."""
    if on_progress is None:
        yield
        return
    baseline, reported, stop = tree_bytes(root), [0], threading.Event()

    def report() -> None:
        grown = tree_bytes(root) - baseline
        if grown > reported[0]:
            on_progress(grown - reported[0])
            reported[0] = grown

    def poll() -> None:
        while not stop.wait(POLL_SECONDS):
            report()

    thread = threading.Thread(target=poll, name="modelpatch-download-meter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    report()
