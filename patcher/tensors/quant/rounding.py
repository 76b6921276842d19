"""One correctly rounded conversion to the dequantizers' output dtypes.

Every dequantizer returns the exact value of its formula rounded once, half to even. The exact
value is computed in float64 (``round_exact`` rounds it), or in float32 where that is provably
enough (``round_via_f32``, below). Exact in float64, because every stored operand is a short
binary number and float64 holds 53 bits:

* FP8 e4m3 (4 significant bits) or e5m2 (3) times a float32 scale (24 bits): at most 28 bits;
  times a bfloat16 or float16 scale: at most 15 bits;
* NVFP4 e2m1 (2 bits) times an e4m3 group scale (4) times a float32 global scale (24): at most
  30 bits;

and the exponents stay far inside float64's range (smallest product 2^-9 * 2^-9 * 2^-149).

compressed-tensors NVFP4 *divides* by its float32 global scale. That quotient is not exact in
float64, but rounding it to float64 first and then once to the target gives the correctly
rounded quotient: a quotient of a number of at most 8 significant bits by one of 24 bits that
is not itself a rounding boundary of the target (a number of at most 25 bits) lies at least
2^-50 (relative) away from every boundary, farther than float64's half ulp (2^-53), so the
float64 rounding never moves it onto or across one.

A plain ``.to(bfloat16)`` of a float64 tensor is NOT one rounding: torch rounds to float32 first
(round half to even), and a float32 result that lands exactly halfway between two bfloat16
values is then rounded to even again, one bfloat16 ulp away from the correct result. That is the
double rounding this module avoids. The float64 values are rounded to float32 with
*round-to-odd* (truncate, and set the last bit if anything was cut off), then once, half to even,
to bfloat16 or float16. Round-to-odd to p bits followed by round-half-even to q <= p - 2 bits
equals a single round-half-even to q bits, and float32 keeps at least 13 more bits than
bfloat16 (8) and float16 (11) at every magnitude either can represent, subnormals included.
Overflow follows round half to even too: a value at or above the largest finite value plus half
an ulp becomes inf (the caller refuses that); a float64 inf or NaN stays inf or NaN.

Speed: ``round_via_f32`` lets a kernel compute in float32 as before and pay for float64 only
on the rare rows that need it. A float32 value that is the correctly rounded float32 of the exact
value (one rounding) rounds correctly to bfloat16/float16 unless it lies exactly on a rounding
boundary of the target (halfway between two of its values): the float32 rounding cannot move a
value across a boundary, only onto it. Only rows holding such a value (for float16, also a value
in its subnormal range, whose boundaries sit elsewhere) are recomputed in float64 and rounded by
``round_exact``.

Memory: a few temporaries the size of the input (callers pass row chunks).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

#: Output dtypes ``round_exact`` produces.
ROUND_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def round_exact(values: torch.Tensor, dtype: torch.dtype,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Round float64 ``values`` once, half to even, to ``dtype``.

    Args:
        values: float64 tensor (on any device) holding the exact results, or float64-rounded
            quotients as described in the module docstring.
        dtype: bfloat16, float16 or float32.
        out: where to write the result (``values``' shape, of ``dtype``); a new tensor if None.

    Returns:
        A tensor of ``dtype`` on the device of ``values`` (``out`` when given): each element
        is the ``dtype`` value nearest to the input, ties to the even significand; inf beyond
        the largest finite value plus half an ulp. The sign of zero is kept.

    Raises:
        ValueError: ``values`` is not float64, or ``dtype`` is not one of ``ROUND_DTYPES``.
    """
    if values.dtype != torch.float64:
        raise ValueError(f"round_exact takes float64 values, got {values.dtype}")
    if dtype not in ROUND_DTYPES:
        raise ValueError(f"round_exact rounds to bfloat16, float16 or float32, got {dtype}")
    if out is None:
        out = torch.empty(values.shape, dtype=dtype, device=values.device)
    # float64 -> float32 is one rounding, half to even; float32 -> dtype after round-to-odd too
    return out.copy_(values if dtype == torch.float32 else round_to_odd_f32(values))


def round_to_odd_f32(values: torch.Tensor) -> torch.Tensor:
    """Round float64 ``values`` to float32 with round-to-odd: the float32 value nearest in the
    direction of zero, with its last significand bit set when the conversion was inexact.

    Computed from torch's round-half-even conversion ``near``: where that is inexact, the
    round-to-odd result is the truncation with its last bit set, and the truncation is ``near``
    itself, or one step of its bit pattern towards zero where ``near`` lies farther out than the
    input (float32 bit patterns are sign-magnitude, so subtracting one moves towards zero
    whatever the sign). A float64 value beyond float32's range (``near`` is inf) becomes the
    largest finite float32 (odd), not inf, so the following rounding decides overflow. A NaN
    stays a NaN (its last bit set).
    """
    near = values.to(torch.float32)
    back = near.to(torch.float64)
    inexact = back != values
    farther = back.abs_() > values.abs()
    bits = near.view(torch.int32)
    return bits.sub_(farther.to(torch.int32)).bitwise_or_(inexact).view(torch.float32)


def round_via_f32(nearest: torch.Tensor, dtype: torch.dtype,
                  exact_rows: Callable[[torch.Tensor], torch.Tensor],
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Round ``[rows, n]`` float32 values once to ``dtype``, as ``round_exact`` would round the
    exact values they approximate.

    Args:
        nearest: float32, each element the exact value rounded ONCE, half to even, to float32
            (a product or quotient of operands that are exact in float32, computed in one
            float32 operation).
        dtype: bfloat16, float16 or float32.
        exact_rows: given row indices (int64, on the device of ``nearest``), the float64 exact
            values of those rows, ``[len(rows), n]``; called only for rows holding a float32
            value on a rounding boundary of ``dtype`` (see the module docstring).
        out: where to write the result (``[rows, n]`` of ``dtype``; a new tensor if None): the
            conversion writes straight into it, with no temporary of its own.

    Returns:
        ``[rows, n]`` in ``dtype``, on the device of ``nearest`` (``out`` when given).
    """
    if out is None:
        out = torch.empty(nearest.shape, dtype=dtype, device=nearest.device)
    out.copy_(nearest)              # float32 -> dtype is one rounding, half to even
    if dtype == torch.float32:
        return out
    rows = _boundary_rows(nearest, dtype)
    if rows is not None:
        out[rows] = round_exact(exact_rows(rows), dtype)
    return out


def _boundary_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The indices (int64, on the device of ``x``) of the rows of ``[rows, n]`` float32 ``x``
    holding a value on a rounding boundary of ``dtype`` (``_on_boundary``), or None if none
    does: one reduction over the whole chunk first, the rows located only when needed.

    On the CPU the bit tests and that reduction run in numpy: torch's integer comparisons and
    boolean reductions there are 3-6x slower (one thread, 128k-1M elements: 156 against 26 us,
    1.4 against 0.44 ms for the comparison)."""
    if x.device.type == "cpu":
        boundary = _on_boundary_np(x.numpy().view(np.uint32), dtype)
        if not boundary.any():
            return None
        return torch.from_numpy(np.flatnonzero(boundary.any(axis=1)))
    boundary = _on_boundary(x, dtype)
    if not bool(boundary.any()):
        return None
    return boundary.any(dim=1).nonzero().flatten()


def _on_boundary(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where float32 ``x`` lies halfway between two ``dtype`` values (bfloat16 keeps the top 16
    bits of a float32; float16 normals keep 10 of its 23 significand bits), or, for float16,
    in its subnormal range (nonzero, below 2^-14), where the boundaries sit elsewhere."""
    bits = x.view(torch.int32)
    if dtype == torch.bfloat16:
        return (bits & 0xFFFF) == 0x8000
    magnitude = bits & 0x7FFFFFFF
    return ((bits & 0x1FFF) == 0x1000) | ((magnitude < 0x38800000) & (magnitude != 0))


def _on_boundary_np(bits: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """``_on_boundary`` of the float32 bit patterns ``bits`` (uint32), in numpy."""
    if dtype == torch.bfloat16:
        return (bits & 0xFFFF) == 0x8000
    # Nonzero magnitudes below 2^-14: magnitude - 1 < 0x387FFFFF, zero wrapping to the top.
    below = ((bits & 0x7FFFFFFF) - np.uint32(1)) < 0x387FFFFF
    return ((bits & 0x1FFF) == 0x1000) | below
