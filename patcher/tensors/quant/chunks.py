"""Row-chunked processing of large weights, shared by the FP8 and NVFP4 kernels.

A kernel walks its weight in ranges of rows holding about ``CHUNK_ELEMENTS`` elements, so the
extra memory is the output tensor plus a few chunk-sized temporaries, never whole-tensor float32
copies.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

# Elements per row chunk. A chunk's float32 temporaries are 4 bytes per element each, so a
# few of them stay at tens of MiB whatever the size of the weight.
CHUNK_ELEMENTS = 1 << 20

# On a GPU, chunks this many times larger: each chunk costs a dozen kernel launches from Python,
# and a GPU has the memory for the temporaries.
GPU_CHUNK_FACTOR = 16


def row_chunks(rows: int, cols: int, align: int = 1,
               dev: torch.device | None = None) -> Iterator[tuple[int, int]]:
    """Yield ``(start, stop)`` row ranges covering ``rows`` rows of ``cols`` elements each.

    Each range holds about ``CHUNK_ELEMENTS`` elements (``GPU_CHUNK_FACTOR`` times more when
    ``dev`` is not the CPU); starts are multiples of ``align`` (so a block of ``align`` rows
    never straddles two chunks).
    """
    elements = CHUNK_ELEMENTS * (GPU_CHUNK_FACTOR if dev is not None and dev.type != "cpu" else 1)
    per_chunk = max(1, elements // max(1, cols))
    per_chunk = max(align, per_chunk // align * align)
    for start in range(0, rows, per_chunk):
        yield start, min(rows, start + per_chunk)


def abs_max(w: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """max |w| over the whole tensor, in float32, one row chunk at a time."""
    cols = w.shape[-1] if w.dim() else 1
    w2 = w.reshape(-1, cols)
    amax = torch.zeros((), dtype=torch.float32, device=dev)
    for r0, r1 in row_chunks(w2.shape[0], cols):
        if r1 > r0 and cols:
            amax = torch.maximum(amax, w2[r0:r1].to(dev).abs().amax().to(torch.float32))
    return amax
