"""``round_via_f32`` on the CPU tests for rounding boundaries in numpy (fewer passes
than torch's integer ops) and writes straight into the caller's output. The numpy bit test must
agree with the torch one on every bit pattern that matters, and the output slice must hold the
single rounding of the exact values, nothing written outside it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from exact_reference import round_exact_product

from patcher.tensors.quant.rounding import _on_boundary, _on_boundary_np, round_via_f32

OUT = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _patterns() -> np.ndarray:
    """Every low half with a few high halves, the float16 subnormal range's edges, zeros,
    infinities, NaNs, and random patterns."""
    low = np.arange(1 << 16, dtype=np.uint32)
    highs = np.array([0x0000, 0x3F80, 0x3880, 0x387F, 0xBF80, 0x8000, 0x7F80, 0xFFFF],
                     dtype=np.uint32)
    grid = (highs[:, None] << 16 | low[None, :]).ravel()
    edges = np.array([0, 1, 0x387FFFFF, 0x38800000, 0x38800001, 0x80000000, 0x80000001, 0x8000,
                      0xB87FFFFF, 0xB8800000, 0x7F800000, 0x7FC00000, 0xFFFFFFFF, 0x18000,
                      0x80008000, 0x38808000],
                     dtype=np.uint32)
    rand = np.random.default_rng(20).integers(0, 1 << 32, 1 << 16, dtype=np.uint32)
    return np.concatenate([grid, edges, rand]).reshape(-1, 16)


@pytest.mark.parametrize("fmt", list(OUT))
def test_the_numpy_boundary_test_equals_the_torch_one(fmt):
    bits = _patterns()
    x = torch.from_numpy(bits.view(np.float32))
    ours = _on_boundary_np(bits, OUT[fmt])
    assert ours.dtype == np.bool_ and 0 < ours.sum() < ours.size
    assert np.array_equal(ours, _on_boundary(x, OUT[fmt]).numpy())


@pytest.mark.parametrize("fmt", list(OUT))
def test_round_via_f32_writes_the_single_rounding_into_the_given_slice(fmt):
    """Products of float8-like and float32 operands, exact in float64, many of them on a
    float32 tie of the target (and, for float16, in its subnormal range)."""
    rng = np.random.default_rng(7)
    p = {"bfloat16": 8, "float16": 11}[fmt]
    mids = np.ldexp((rng.integers(1 << (p - 1), 1 << p, 1024) * 2 + 1).astype(float),
                    rng.integers(-26 if fmt == "float16" else -12, 12, 1024) - p)
    x = rng.uniform(-3, 3, (64, 32))
    x[1::3] = np.concatenate([mids, -mids]).reshape(64, 32)[1::3]
    exact = torch.from_numpy(x)
    whole = torch.full((80, 32), 7.0, dtype=OUT[fmt])
    asked = []

    def exact_rows(rows):
        asked.append(rows.numel())
        return exact[rows]

    got = round_via_f32(exact.to(torch.float32), OUT[fmt], exact_rows, out=whole[8:72])
    assert got.data_ptr() == whole[8:72].data_ptr()
    assert np.array_equal(whole[8:72].double().numpy(), round_exact_product(x, fmt))
    assert (whole[:8] == 7).all() and (whole[72:] == 7).all()
    assert 0 < sum(asked) < 64
