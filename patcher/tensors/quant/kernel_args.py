"""Argument handling shared by the FP8 and NVFP4 kernels: output dtypes, devices, shapes and
one-value scales; and row-chunked processing of large weights.

A kernel walks its weight in ranges of rows holding about ``CHUNK_ELEMENTS`` elements, so the
extra memory is the output tensor plus a few chunk-sized temporaries, never whole-tensor float32
copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

#: Output dtypes the dequantizers produce.
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_out_dtype(out_dtype: torch.dtype) -> None:
    if out_dtype not in OUT_DTYPES:
        names = ", ".join(str(d) for d in OUT_DTYPES)
        raise ValueError(f"output dtype must be one of {names}, got {out_dtype}")


def torch_device(device: str | torch.device) -> torch.device:
    return torch.device(device)


def shape_tuple(t: torch.Tensor | Sequence[int]) -> tuple[int, ...]:
    """The shape of a tensor, or a shape given as a sequence (header metadata), as ints."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(int(d) for d in t)


# Scale dtypes whose products with FP8/e2m1 values are exact in float64 (at most 24 bits).
_EXACT_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                       torch.float8_e5m2)


def scale_f64(t: torch.Tensor, what: str, dev: torch.device) -> torch.Tensor:
    """``t`` as float64 on ``dev``, for exact products; ``what`` names it in errors.

    Raises:
        ValueError: ``t`` is wider than float32 (a float64 scale times an FP8 value can need
            more than float64's 53 bits, so no product would be exact).
    """
    if t.dtype not in _EXACT_SCALE_DTYPES:
        raise ValueError(f"{what} must be float32, bfloat16, float16 or float8, got {t.dtype}")
    return t.detach().to(device=dev, dtype=torch.float64)


def scalar_f64(t: torch.Tensor, what: str, dev: torch.device) -> torch.Tensor:
    """The one value of ``t`` as a 0-dim float64 tensor on ``dev`` (see ``scale_f64``)."""
    if t.numel() != 1:
        raise ValueError(f"{what} must hold exactly one value, got shape {list(t.shape)}")
    return scale_f64(t.reshape(()), what, dev)


class NonFiniteInput(ValueError):
    """A weight to quantize holds inf or NaN: no scale can represent it."""


def check_finite_amax(amax: torch.Tensor, w: torch.Tensor) -> None:
    """Raise ``NonFiniteInput`` if ``amax`` (max |x| over all or part of ``w``) is inf or NaN.

    ``amax`` propagates inf and NaN, so this costs nothing on finite weights; the count of bad
    values in the message is computed only when there are some."""
    if bool(torch.isfinite(amax).all()):
        return
    cols = w.shape[-1] if w.dim() else 1
    w2 = w.reshape(-1, cols)
    bad = sum(int((~torch.isfinite(w2[r0:r1])).sum()) for r0, r1 in row_chunks(w2.shape[0], cols))
    raise NonFiniteInput(f"cannot quantize a weight holding non-finite values: {bad} of "
                         f"{w.numel()} are inf or NaN")


# Elements per row chunk. A chunk's float32 temporaries are 4 bytes per element each, so a
# few of them stay at tens of MiB whatever the size of the weight.
CHUNK_ELEMENTS = 1 << 20


def row_chunks(rows: int, cols: int, align: int = 1) -> Iterator[tuple[int, int]]:
    """Yield ``(start, stop)`` row ranges covering ``rows`` rows of ``cols`` elements each.

    Each range holds about ``CHUNK_ELEMENTS`` elements; starts are multiples of ``align`` (so a
    block of ``align`` rows never straddles two chunks).
    """
    per_chunk = max(1, CHUNK_ELEMENTS // max(1, cols))
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
