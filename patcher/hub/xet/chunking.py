"""Content-defined chunking (hub-docs ``docs/xet/chunking.md``): a gear hash over the bytes, a cut
where its top 16 bits are zero once a chunk has 8 KiB, a forced cut at 128 KiB, a 64 KiB mean.

The gear hash after byte ``i`` depends only on the last 64 bytes (each step shifts one bit out),
and a cut is only tested once a chunk is 8 KiB long, so the hash at every tested position equals
the hash of its 64-byte window whatever came before. The windows' hashes are computed for a whole
block at once with numpy (six shift-and-add passes: windows of 1, 2, 4 ... 64 bytes), then the cuts
are chosen from the candidate positions; the result is the byte-by-byte algorithm's exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from patcher.hub.xet.gear_table import GEAR_TABLE

MIN_CHUNK_SIZE = 8 * 1024
TARGET_CHUNK_SIZE = 64 * 1024
MAX_CHUNK_SIZE = 128 * 1024
MASK = 0xFFFF000000000000
WINDOW = 64
READ_SIZE = 8 * 1024 * 1024

_TABLE = np.array(GEAR_TABLE, dtype=np.uint64)
_MASK = np.uint64(MASK)


def _candidates(block: bytes) -> np.ndarray:
    """Positions ``i`` in ``block`` where the gear hash of the window ending at ``i`` has its top
    16 bits clear (for ``i`` < 63 the window is what precedes it in ``block``)."""
    h = _TABLE[np.frombuffer(block, dtype=np.uint8)]
    span = 1
    while span < WINDOW:
        shifted = np.zeros_like(h)
        shifted[span:] = h[:-span] << np.uint64(span)
        h = h + shifted
        span *= 2
    return np.flatnonzero((h & _MASK) == 0)


def _cuts(block: bytes, final: bool) -> list[int]:
    """Chunk end offsets in ``block``, which starts at a chunk's start. Without ``final`` the tail
    after the last cut is left for the next block (it may still grow into a chunk)."""
    n = len(block)
    if n == 0:
        return []
    found = _candidates(block) + 1 if n >= MIN_CHUNK_SIZE else np.empty(0, dtype=np.int64)
    cuts, start = [], 0
    while True:
        i = int(np.searchsorted(found, start + MIN_CHUNK_SIZE))
        end = int(found[i]) if i < len(found) else n + 1
        end = min(end, start + MAX_CHUNK_SIZE)
        if end > n:
            break
        cuts.append(end)
        start = end
    if final and start < n:
        cuts.append(n)
    return cuts


def chunk_boundaries(data: bytes) -> list[int]:
    """The end offset of each chunk of ``data`` (the last is ``len(data)``; none for no data)."""
    return _cuts(data, final=True)


def chunk_bytes(data: bytes) -> list[bytes]:
    """``data`` cut into its chunks."""
    out, start = [], 0
    for end in chunk_boundaries(data):
        out.append(data[start:end])
        start = end
    return out


def iter_chunks(stream: BinaryIO, read_size: int = READ_SIZE) -> Iterator[bytes]:
    """The chunks of everything ``stream`` yields, read ``read_size`` bytes at a time; memory
    stays within one read plus one chunk."""
    pending = b""
    while True:
        more = stream.read(read_size)
        block = pending + more if more else pending
        start = 0
        for end in _cuts(block, final=not more):
            yield block[start:end]
            start = end
        pending = block[start:]
        if not more:
            return
