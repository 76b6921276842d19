"""One correctly rounded conversion from float64 to the dequantizers' output dtypes.

Every dequantizer computes its values exactly in float64 and rounds them once, here. Exact,
because every stored operand is a short binary number and float64 holds 53 bits:

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

Memory: a few temporaries the size of the input (callers pass row chunks).
"""

from __future__ import annotations

import torch

#: Output dtypes ``round_exact`` produces.
ROUND_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def round_exact(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 ``values`` once, half to even, to ``dtype``.

    Args:
        values: float64 tensor (on any device) holding the exact results, or float64-rounded
            quotients as described in the module docstring.
        dtype: bfloat16, float16 or float32.

    Returns:
        A tensor of ``dtype`` on the device of ``values``: each element is the ``dtype`` value
        nearest to the input, ties to the even significand; inf beyond the largest finite value
        plus half an ulp. The sign of zero is kept.

    Raises:
        ValueError: ``values`` is not float64, or ``dtype`` is not one of ``ROUND_DTYPES``.
    """
    if values.dtype != torch.float64:
        raise ValueError(f"round_exact takes float64 values, got {values.dtype}")
    if dtype not in ROUND_DTYPES:
        raise ValueError(f"round_exact rounds to bfloat16, float16 or float32, got {dtype}")
    if dtype == torch.float32:
        return values.to(torch.float32)       # float64 -> float32 is one rounding, half to even
    return round_to_odd_f32(values).to(dtype)


def round_to_odd_f32(values: torch.Tensor) -> torch.Tensor:
    """Round float64 ``values`` to float32 with round-to-odd: the float32 value nearest in the
    direction of zero, with its last significand bit set when the conversion was inexact.

    Computed from torch's round-half-even conversion: where that is inexact and its result has
    an even last bit, the result moves one ulp (one step of its bit pattern) towards the input,
    onto the neighbour with an odd last bit. A float64 value beyond float32's range becomes the
    largest finite float32 (odd), not inf, so the following rounding decides overflow.
    """
    near = values.to(torch.float32)
    back = near.to(torch.float64)
    bits = near.view(torch.int32)
    # Inexact with an even last bit. A NaN compares unequal and may move by one step: it stays
    # a NaN (torch's conversions give quiet NaNs, whose significand is not 0 or 1).
    fix = (back != values).logical_and_((bits & 1) == 0)
    # One step away from zero where the input lies farther out than ``near``, else towards it
    # (sign-magnitude bits: the step direction flips with the sign bit).
    away = (values > back).logical_xor_(bits < 0)
    step = away.to(torch.int32).mul_(2).sub_(1).mul_(fix)
    return bits.add_(step).view(torch.float32)
