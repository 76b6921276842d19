"""An independent dequantization reference for the to-bf16 tests: the exact product in float64
(every product of these formats is exact there), then one round-half-to-even to the target
format done with integers and powers of two, not with torch's dtype conversions.

Written from the formats' definitions (the producers' code cited in recipes/to-bf16.yaml), not
from modelpatch's kernels.
"""

from __future__ import annotations

import math

import numpy as np
import torch

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# (significant bits, smallest exponent of the quantum, largest finite value)
_FORMATS = {torch.bfloat16: (8, -133, (2 - 2 ** -7) * 2.0 ** 127),
            torch.float16: (11, -24, 65504.0),
            torch.float32: (24, -149, (2 - 2 ** -23) * 2.0 ** 127)}


def round_half_even(x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``x`` rounded once, half to even, to ``dtype`` (inf past the largest finite value
    plus half an ulp; NaN stays NaN)."""
    bits, min_exp, largest = _FORMATS[dtype]
    x = np.asarray(x, dtype=np.float64)
    _, e = np.frexp(x)                                   # x = m * 2**e, 0.5 <= |m| < 1
    quantum = np.ldexp(1.0, np.maximum(e - bits, min_exp))
    y = np.rint(x / quantum) * quantum                   # x / quantum is exact; rint: half even
    ulp_top = 2.0 ** (math.frexp(largest)[1] - bits)
    y = np.where(np.abs(x) >= largest + ulp_top / 2, np.copysign(np.inf, x), y)
    y = np.where(np.isnan(x), np.nan, y)
    y = np.where(x == 0, x, y)                            # keeps the sign of zero
    out = torch.from_numpy(y).to(dtype)                   # exactly representable: no rounding
    assert torch.equal(out.double().isnan(), torch.from_numpy(np.isnan(y)))
    return out


def e2m1_values(packed: torch.Tensor, negative_zero: bool) -> np.ndarray:
    """float64 values of packed e2m1 codes, the even element from the low nibble."""
    table = np.array(E2M1 + tuple(-v for v in E2M1), dtype=np.float64)
    if not negative_zero:
        table[8] = 0.0
    p = packed.numpy().astype(np.int64)
    codes = np.stack((p & 0x0F, p >> 4), axis=-1).reshape(*p.shape[:-1], -1)
    return table[codes]


def fp8(weight: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """W = fp8 * weight_scale (one value, or one per output row)."""
    s = scale.double().numpy()
    s = s.reshape(()) if s.size == 1 else s.reshape(-1, 1)
    return weight.double().numpy() * s


def fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block=(128, 128)) -> np.ndarray:
    rows, cols = weight.shape
    s = np.repeat(np.repeat(scale_inv.double().numpy(), block[0], 0), block[1], 1)
    return weight.double().numpy() * s[:rows, :cols]


def nvfp4_modelopt(packed, scale, scale_2) -> np.ndarray:
    """W = e2m1 * weight_scale[r, c // 16] * weight_scale_2 (exact in float64)."""
    v = e2m1_values(packed, negative_zero=False)
    return v * np.repeat(scale.double().numpy(), 16, axis=-1) * float(scale_2.double())


def nvfp4_compressed_tensors(packed, scale, global_scale) -> np.ndarray:
    """W = e2m1 * weight_scale / weight_global_scale: the float64 quotient (see
    patcher/quant/rounding.py for why rounding it once more is still correct)."""
    v = e2m1_values(packed, negative_zero=True)
    return v * np.repeat(scale.double().numpy(), 16, axis=-1) / float(global_scale.double())


def mxfp4_gpt_oss(blocks, scales) -> np.ndarray:
    """gpt-oss: [E, R, G, 16] bytes and [E, R, G] E8M0 exponents -> [E, G * 32, R]."""
    v = e2m1_values(blocks, negative_zero=True)           # [E, R, G, 32]
    s = np.ldexp(1.0, scales.numpy().astype(np.int64) - 127)[..., None]
    w = (v * s).reshape(v.shape[0], v.shape[1], -1)       # [E, R, G * 32]
    return np.ascontiguousarray(w.transpose(0, 2, 1))
