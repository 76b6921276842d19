"""An independent exact reference for dequantization: integer round-half-to-even in numpy.

Nothing here uses patcher or torch's float casts. A value is given exactly as an integer
significand, a sticky flag and a power of two; the rounding to a target format (bfloat16,
float16, float32: precision, smallest normal exponent, largest finite value) is done on the
integers, with the IEEE 754 rule: nearest representable value, ties to the even significand,
+-inf at or beyond the largest finite value plus half an ulp.

Products of short binary numbers are exact in float64 and are split with ``np.frexp``;
quotients are reduced to integers and divided with ``np.divmod`` (remainder -> sticky bit).
"""

from __future__ import annotations

import numpy as np

#: (precision in bits including the implicit one, exponent of the smallest normal, largest
#: finite value), written out from IEEE 754 / the bfloat16 definition, not read from torch.
FORMATS = {
    "bfloat16": (8, -126, (2 - 2 ** -7) * 2.0 ** 127),
    "float16": (11, -14, 65504.0),
    "float32": (24, -126, (2 - 2 ** -23) * 2.0 ** 127),
}


def _bit_length(q: np.ndarray) -> np.ndarray:
    """Bit length of non-negative int64 values (0 for 0)."""
    e = np.frexp(q.astype(np.float64))[1].astype(np.int64)
    too_big = (e > 0) & (np.left_shift(np.int64(1), np.maximum(e - 1, 0)) > q)
    return e - too_big


def round_scaled(negative: np.ndarray, q: np.ndarray, sticky: np.ndarray, exp: np.ndarray,
                 fmt: str) -> np.ndarray:
    """Round the values ``+-(q + f) * 2**exp`` (``0 < f < 1`` where ``sticky``, else ``f = 0``)
    to ``fmt``, half to even; returns float64 (every target value is exact in float64)."""
    p, emin, fmax = FORMATS[fmt]
    q, exp = q.astype(np.int64), exp.astype(np.int64)
    top = _bit_length(q) + exp                      # value in [2**(top-1), 2**top)
    quantum = np.maximum(top - p, emin - p + 1)     # exponent of the target ulp there
    shift = quantum - exp
    assert bool(np.all((shift >= 1) | ((q == 0) & ~sticky))), "reference needs a wider q"
    shift = np.clip(shift, 1, 63)                   # q < 2**62: rounds to 0 from 63 on
    kept = np.right_shift(q, shift)
    rest = q - np.left_shift(kept, shift)
    half = np.left_shift(np.int64(1), shift - 1)
    up = (rest > half) | ((rest == half) & (sticky | ((kept & 1) == 1)))
    value = np.ldexp((kept + up).astype(np.float64), quantum)
    value = np.where(value > fmax, np.inf, value)
    return np.where(negative, -value, value)


def round_exact_product(values: np.ndarray, fmt: str) -> np.ndarray:
    """Round float64 values that are EXACT (products of short numbers) to ``fmt``."""
    mant, e = np.frexp(np.abs(values))
    q = np.ldexp(mant, 53).astype(np.int64)         # exact: 53-bit integer significand
    return round_scaled(np.signbit(values), q, np.zeros(q.shape, bool), e - 53, fmt)


def _odd_part(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact finite float64 ``x`` as ``(odd integer n >= 0, e)`` with ``|x| = n * 2**e``."""
    mant, e = np.frexp(np.abs(x))
    n = np.ldexp(mant, 53).astype(np.int64)
    e = e.astype(np.int64) - 53
    low = n & -n                                    # lowest set bit (0 for 0)
    tz = np.where(n == 0, 0, np.frexp(low.astype(np.float64))[1] - 1)
    return np.right_shift(n, tz), e + tz


def round_exact_quotient(num: np.ndarray, den: np.ndarray, fmt: str) -> np.ndarray:
    """Round the exact quotients ``num / den`` of float64 values to ``fmt``. ``num`` must have at
    most 30 significant bits and ``den`` at most 24 (true for every format tested here)."""
    a, ea = _odd_part(num)
    b, eb = _odd_part(den)
    assert bool(np.all(_bit_length(a) <= 30) and np.all(_bit_length(b) <= 24))
    s = 62 - _bit_length(a)                         # a << s: 62 bits, the quotient >= 38 bits
    q, r = np.divmod(np.left_shift(a, s), b)
    negative = np.signbit(num) != np.signbit(den)
    return round_scaled(negative, q, r != 0, ea - eb - s, fmt)
