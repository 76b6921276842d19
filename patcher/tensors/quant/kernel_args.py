"""Argument handling shared by the FP8 and NVFP4 kernels: output dtypes, devices, shapes and
one-value scales."""

from __future__ import annotations

from collections.abc import Sequence

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
    from .chunks import row_chunks

    cols = w.shape[-1] if w.dim() else 1
    w2 = w.reshape(-1, cols)
    bad = sum(int((~torch.isfinite(w2[r0:r1])).sum()) for r0, r1 in row_chunks(w2.shape[0], cols))
    raise NonFiniteInput(f"cannot quantize a weight holding non-finite values: {bad} of "
                         f"{w.numel()} are inf or NaN")
