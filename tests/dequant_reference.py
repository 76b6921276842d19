"""An independent dequantization reference for the to-bf16 tests: the exact product in float64
(every product of these formats is exact there), then one round-half-to-even to the target
format done on integers (tests/exact_reference.py), not with torch's dtype conversions.

Written from the formats' definitions (the producers' code cited in recipes/to-bf16.yaml), not
from modelpatch's kernels.
"""

from __future__ import annotations

import numpy as np
import torch
from exact_reference import round_exact_product, round_exact_quotient

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FORMAT = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def rounded(values: np.ndarray, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Exact float64 ``values`` rounded once, half to even, to ``dtype`` (integer rounding of
    tests/exact_reference.py)."""
    return _as(round_exact_product(np.asarray(values, dtype=np.float64), _FORMAT[dtype]), dtype)


def _as(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    out = torch.from_numpy(np.ascontiguousarray(values)).to(dtype)   # representable: exact
    assert torch.equal(out.double().nan_to_num(), torch.from_numpy(values).nan_to_num())
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


def nvfp4_compressed_tensors(packed, scale, global_scale,
                             dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """W = e2m1 * weight_scale / weight_global_scale, the exact quotient rounded once."""
    num = e2m1_values(packed, negative_zero=True) * np.repeat(scale.double().numpy(), 16, -1)
    den = np.full(num.shape, float(global_scale.double()))
    return _as(round_exact_quotient(num, den, _FORMAT[dtype]), dtype)


def mxfp4_gpt_oss(blocks, scales) -> np.ndarray:
    """gpt-oss: [E, R, G, 16] bytes and [E, R, G] E8M0 exponents -> [E, G * 32, R]."""
    v = e2m1_values(blocks, negative_zero=True)           # [E, R, G, 32]
    s = np.ldexp(1.0, scales.numpy().astype(np.int64) - 127)[..., None]
    w = (v * s).reshape(v.shape[0], v.shape[1], -1)       # [E, R, G * 32]
    return np.ascontiguousarray(w.transpose(0, 2, 1))
