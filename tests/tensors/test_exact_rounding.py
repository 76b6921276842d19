"""Every dequantizer, into every output dtype, equals round-half-to-even of the exact value of
its format's formula, checked against ``tests/exact_reference.py``: float64
products (exact for these formats) or integer quotients, rounded with integer arithmetic.

Exhaustive where the space allows:

* NVFP4 (ModelOpt and compressed-tensors): all 16 e2m1 codes x all 254 finite e4m3 group-scale
  bytes x a sweep of per-tensor scales: ModelOpt's ``amax / (6 * 448)`` (the "amax/2688"
  family that exposed the double rounding) and compressed-tensors' ``6 * 448 / amax`` for amax
  over every bfloat16 significand in [1, 2), plus powers of two, subnormal and huge scales
  (overflow to inf);
* FP8 per tensor / per channel / per block: all 254 finite e4m3 bytes and all 248 finite e5m2
  bytes x float32 scales: ``amax / 448`` over every bfloat16 significand (a family that cannot
  hit a bfloat16 tie), 128 random ones and 128 built to hit a bfloat16 tie after a float32
  rounding; and bfloat16 and float16 scales (every significand, two exponents);

plus random tensors with several row chunks and partial edge blocks. Every test runs on the CPU
and, where there is one, on CUDA. A wider sweep (every bfloat16 amax significand at every
exponent from 2^-30 to 2^30: 190 M elements, about a minute) runs only on request:
``MODELPATCH_WIDE_SWEEP=1 pytest -q tests/tensors/test_exact_rounding.py -k wide -s``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from exact_reference import round_exact_product, round_exact_quotient
from tensor_helpers import pack_nibbles

import patcher.tensors.quant.kernel_args as chunks_mod
from patcher.tensors.quant import (
    dequantize_fp8_block,
    dequantize_fp8_per_tensor,
    dequantize_nvfp4_compressed_tensors,
    dequantize_nvfp4_modelopt,
)
from patcher.tensors.quant.rounding import round_exact, round_via_f32

OUT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])

# Every finite float8 byte: e4m3fn has NaN at 0x7F/0xFF; e5m2 has inf/NaN at exponent 31.
E4M3_BYTES = np.array([b for b in range(256) if b & 0x7F != 0x7F], dtype=np.uint8)
E5M2_BYTES = np.array([b for b in range(256) if (b >> 2) & 0x1F != 0x1F], dtype=np.uint8)


def _decode_e4m3(b: np.ndarray) -> np.ndarray:
    """OCP e4m3fn by its definition: bias 7, subnormals at exponent 0."""
    b = b.astype(np.int64)
    e, m = (b >> 3) & 0xF, b & 7
    mag = np.where(e == 0, np.ldexp(m / 8.0, -6), np.ldexp(1 + m / 8.0, e - 7))
    return np.where(b & 0x80, -mag, mag)


def _decode_e5m2(b: np.ndarray) -> np.ndarray:
    b = b.astype(np.int64)
    e, m = (b >> 2) & 0x1F, b & 3
    mag = np.where(e == 0, np.ldexp(m / 4.0, -14), np.ldexp(1 + m / 4.0, e - 15))
    return np.where(b & 0x80, -mag, mag)


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def bf16_amaxes(exponents) -> np.ndarray:
    """Every bfloat16 significand (1 + k/128) at each exponent: the amax of a bfloat16 weight."""
    return np.array([np.ldexp(1 + k / 128, e) for e in exponents for k in range(128)])


def modelopt_scale_2(amax: np.ndarray) -> np.ndarray:
    """ModelOpt: ``weight_scale_2 = amax / (6 * 448)`` in float32 (the amax/2688 family)."""
    return _f32(amax) / np.float32(6 * 448)


def ct_global_scale(amax: np.ndarray) -> np.ndarray:
    """compressed-tensors ``generate_gparam``: ``448 * 6 / amax`` in float32."""
    return np.float32(448 * 6) / _f32(amax)


def per_tensor_sweep(exponents=(0,)) -> dict[str, np.ndarray]:
    """Per-tensor scales for NVFP4 (float32), ModelOpt and compressed-tensors kinds."""
    extra = _f32([1.0, 2.0 ** -20, 2.0 ** 20, 1e-40, 3e-39, 1e30, 0.1, 1 / 3])
    amax = bf16_amaxes(exponents)
    return {"modelopt": np.concatenate([modelopt_scale_2(amax), extra]),
            "ct": np.concatenate([ct_global_scale(amax), extra])}


def assert_matches(ours: torch.Tensor, ref: np.ndarray, what: str) -> int:
    got = ours.cpu().to(torch.float64).numpy().reshape(ref.shape)
    bad = ~((got == ref) | (np.isnan(got) & np.isnan(ref)))
    if bad.any():
        i = np.flatnonzero(bad)[0]
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ; first "
                             f"{got.flat[i]!r} vs exact {ref.flat[i]!r}")
    return bad.size


# --- the reference itself --------------------------------------------------------------------

def test_reference_agrees_with_fractions():
    """The numpy reference against Python's exact rationals, ties and near-ties included."""
    from fractions import Fraction
    rng = np.random.default_rng(7)
    num = _f32(rng.integers(1, 1 << 20, 3000) * np.exp2(rng.integers(-40, 40, 3000)))
    den = _f32(rng.integers(1, 1 << 24, 3000) * np.exp2(rng.integers(-30, 30, 3000)))
    den[::3] = np.exp2(rng.integers(-60, 60, 1000))       # odd part 1: the widest quotients
    ties = np.ldexp(rng.integers(257, 512, 1000) | 1, rng.integers(-150, 120, 1000)).astype(float)
    for fmt, (p, emin, fmax) in {"bfloat16": (8, -126, 3.3895313892515355e38),
                                 "float16": (11, -14, 65504.0)}.items():
        quot = round_exact_quotient(num, den, fmt)
        prod = round_exact_product(ties, fmt)
        for x, r in [(Fraction(float(a)) / Fraction(float(b)), q) for a, b, q in
                     zip(num[:400], den[:400], quot[:400])] + \
                    [(Fraction(float(t)), q) for t, q in zip(ties[:400], prod[:400])]:
            assert _fraction_rne(x, p, emin, fmax) == r, (x, r, fmt)


def _fraction_rne(x, p, emin, fmax):
    from fractions import Fraction
    e = x.numerator.bit_length() - x.denominator.bit_length()
    e -= Fraction(2) ** e > x
    quantum = Fraction(2) ** max(e - p + 1, emin - p + 1)
    n, rest = divmod(x / quantum, 1)
    n += rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1)
    v = n * quantum
    return np.inf if v > fmax else float(v)


# --- round_exact -----------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(OUT))
def test_round_exact_on_ties_near_ties_subnormals_and_overflow(fmt, device):
    """Midpoints of the target (9, 12, 25 significant bits) at exponents from 2^-175 to 2^104,
    nudged by 2^-40 up and down; subnormals; values around the largest finite value."""
    rng = np.random.default_rng(3)
    p = {"bfloat16": 8, "float16": 11, "float32": 24}[fmt]
    mids = np.ldexp((rng.integers(1 << (p - 1), 1 << p, 4000) * 2 + 1).astype(float),
                    rng.integers(-175, 104, 4000) - p)
    fmax = float(torch.finfo(OUT[fmt]).max)
    edge = np.array([fmax, np.nextafter(fmax, 0), fmax * (1 + 2.0 ** -(p + 1)),
                     fmax * (1 + 2.0 ** -(p + 1)) * (1 - 2.0 ** -50), 1e300, 5e-324, 2.0 ** -150,
                     2.0 ** -134, 2.0 ** -133 * 1.5, 2.0 ** -25, 2.0 ** -24 * 1.5, 0.0])
    x = np.concatenate([mids, mids * (1 + 2.0 ** -40), mids * (1 - 2.0 ** -40), edge])
    x = np.concatenate([x, -x])
    ours = round_exact(torch.from_numpy(x).to(device), OUT[fmt])
    assert ours.dtype == OUT[fmt] and ours.device.type == device
    assert_matches(ours, round_exact_product(x, fmt), f"round_exact {fmt}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(OUT))
def test_round_via_f32_recomputes_exactly_the_rows_that_need_it(fmt, device):
    """Values near target midpoints, rounded once to float32 (many land exactly on a
    midpoint), in rows of 16: ``round_via_f32`` must give the single rounding of the exact
    values, asking for exact values only of rows holding a float32 value on a boundary."""
    rng = np.random.default_rng(4)
    p = {"bfloat16": 8, "float16": 11, "float32": 24}[fmt]
    mids = np.ldexp((rng.integers(1 << (p - 1), 1 << p, 2048) * 2 + 1).astype(float),
                    rng.integers(-12, 12, 2048) - p)
    near = mids * (1 + rng.choice([0.0, 2.0 ** -30, -(2.0 ** -30), 2.0 ** -20], 2048))
    x = rng.uniform(-3, 3, (128, 16))
    x[::4] = near.reshape(128, 16)[::4]          # every 4th row near midpoints
    exact = torch.from_numpy(x).to(device)
    asked = []

    def exact_rows(rows):
        asked.append(rows.numel())
        return exact[rows]

    ours = round_via_f32(exact.to(torch.float32), OUT[fmt], exact_rows)
    assert_matches(ours, round_exact_product(x, fmt), f"round_via_f32 {fmt}")
    assert (sum(asked) == 0) == (fmt == "float32") and sum(asked) < 64


def test_round_exact_keeps_nan_and_inf_and_refuses_other_input():
    x = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
    for dtype in OUT.values():
        out = round_exact(x, dtype).double()
        assert out[0].isnan() and out[1] == float("inf") and out[2] == -float("inf")
    with pytest.raises(ValueError, match="float64"):
        round_exact(torch.zeros(2), torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        round_exact(torch.zeros(2, dtype=torch.float64), torch.int8)


# --- NVFP4: every code x every e4m3 group scale x per-tensor scale sweeps --------------------

def _all_nvfp4_pairs():
    """One row per finite e4m3 scale byte, each row one group holding all 16 codes."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(len(E4M3_BYTES), 1)
    scale = torch.from_numpy(E4M3_BYTES).view(torch.float8_e4m3fn).reshape(-1, 1)
    exact_pair = E2M1[None, :] * _decode_e4m3(E4M3_BYTES)[:, None]    # [254, 16], exact
    return pack_nibbles(codes), scale, exact_pair


def _nvfp4_sweep(kind: str, fmt: str, device: str, per_tensor: np.ndarray) -> int:
    packed, scale, pair = _all_nvfp4_pairs()
    checked = 0
    for s in per_tensor:
        t = torch.tensor(s, dtype=torch.float32)
        if kind == "modelopt":
            ours = dequantize_nvfp4_modelopt(packed, scale, t, OUT[fmt], device=device)
            ref = round_exact_product(pair * np.float64(s), fmt)
        else:
            ours = dequantize_nvfp4_compressed_tensors(packed, scale, t.reshape(1), OUT[fmt],
                                                       device=device)
            ref = round_exact_quotient(pair, np.full(pair.shape, np.float64(s)), fmt)
        checked += assert_matches(ours, ref, f"NVFP4 {kind} {fmt} scale {s!r}")
    return checked


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(OUT))
@pytest.mark.parametrize("kind", ["modelopt", "ct"])
def test_nvfp4_exhaustive_codes_and_group_scales(kind, fmt, device):
    scales = per_tensor_sweep()[kind]
    checked = _nvfp4_sweep(kind, fmt, device, scales)
    assert checked == len(scales) * 16 * 254
    print(f"\nEXACT nvfp4-{kind} {fmt} {device}: {len(scales)} tensors, {checked} elements, 0 "
          f"mismatches")


def test_nvfp4_sweep_holds_the_double_rounding_traps():
    """The sweep is not vacuous: rounding the ModelOpt product to float32 first (the old
    kernel, and ModelOpt's own dequantize) then to bfloat16 misses in it."""
    _, _, pair = _all_nvfp4_pairs()
    s2 = modelopt_scale_2(bf16_amaxes([0]))
    exact = pair[None] * s2.astype(np.float64)[:, None, None]
    via_f32 = torch.from_numpy(exact.astype(np.float32)).to(torch.bfloat16).double().numpy()
    misses = via_f32 != round_exact_product(exact, "bfloat16")
    assert int(misses.any(axis=(1, 2)).sum()) > 0       # 6 of the 128 tensors here


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MODELPATCH_WIDE_SWEEP"),
                    reason="wide sweep on request: MODELPATCH_WIDE_SWEEP=1")
@pytest.mark.parametrize("fmt", list(OUT))
@pytest.mark.parametrize("kind", ["modelopt", "ct"])
def test_nvfp4_exhaustive_wide_amax_sweep(kind, fmt):
    scales = per_tensor_sweep(range(-30, 31))[kind]
    checked = _nvfp4_sweep(kind, fmt, "cpu", scales)
    print(f"\nEXACT slow nvfp4-{kind} {fmt}: {len(scales)} tensors, {checked} elements")


# --- FP8: every finite byte x scale sweeps, per tensor / channel / block ---------------------

def _fp8_scale_sweeps() -> dict[str, torch.Tensor]:
    amax = bf16_amaxes((-6, 0, 9))
    sig = np.array([1 + k / 128 for k in range(128)])
    rng = np.random.default_rng(5)
    random_f32 = _f32(rng.uniform(1, 2, 128) * 2.0 ** -8)
    # Traps: s = float32(mid / 1.5) for bfloat16 midpoints mid in [1, 1.5), so the float32
    # product 1.5 * s (e4m3 byte 0x3C) rounds exactly onto mid, the exact product does not.
    mid = (2 * rng.integers(128, 192, 128) + 1) / 256.0
    traps = _f32(mid / 1.5)
    return {
        "float32": torch.from_numpy(np.concatenate([_f32(amax) / np.float32(448), random_f32,
                                                    traps,
                                                    _f32([1e-40, 1e30, 1.0])])),
        "bfloat16": torch.from_numpy(np.concatenate([sig * 2.0 ** -9, sig * 2.0 ** 3]))
        .to(torch.bfloat16),
        "float16": torch.from_numpy(np.concatenate([sig * 2.0 ** -9, sig * 2.0 ** 3]))
        .to(torch.float16),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(OUT))
@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout", ["tensor", "channel", "block"])
def test_fp8_exhaustive_bytes_and_scales(layout, fp8, fmt, device):
    """Rows = scales, columns = every finite byte: per channel in one call, per block with
    one-row blocks, per tensor one call per scale (every 8th scale)."""
    raw, decode, dtype = {"e4m3": (E4M3_BYTES, _decode_e4m3, torch.float8_e4m3fn),
                          "e5m2": (E5M2_BYTES, _decode_e5m2, torch.float8_e5m2)}[fp8]
    checked = tensors = 0
    for sdtype, scales in _fp8_scale_sweeps().items():
        n = len(scales)
        weight = torch.from_numpy(np.tile(raw, (n, 1))).view(dtype)
        ref = round_exact_product(decode(raw)[None, :] * scales.double().numpy()[:, None], fmt)
        what = f"FP8 {layout} {fp8} x {sdtype} -> {fmt}"
        if layout == "channel":
            ours = dequantize_fp8_per_tensor(weight, scales.reshape(-1, 1), OUT[fmt],
                                             device=device)
        elif layout == "block":
            ours = dequantize_fp8_block(weight, scales.reshape(-1, 1), OUT[fmt],
                                        block=(1, len(raw)), device=device)
        else:       # the per-channel code with one scale: every 8th scale is enough
            weight, scales, ref = weight[::8], scales[::8], ref[::8]
            n = len(scales)
            ours = torch.stack([dequantize_fp8_per_tensor(weight[i], scales[i], OUT[fmt],
                                                          device=device) for i in range(n)])
        checked += assert_matches(ours, ref, what)
        tensors += n if layout == "tensor" else 1
    print(f"\nEXACT fp8-{layout} {fp8} {fmt} {device}: {tensors} tensors, {checked} elements, "
          f"0 mismatches")


# --- random tensors: several chunks, partial edge blocks, default block size -----------------

@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunks_mod, "CHUNK_ELEMENTS", 1000)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", list(OUT))
def test_random_tensors_all_formats(fmt, device, small_chunks):
    rng = np.random.default_rng(11)
    gen = torch.Generator().manual_seed(11)
    checked = 0
    for amax in rng.uniform(0.01, 40, 2):
        # NVFP4 [130, 256] with random codes and group scales
        packed = torch.randint(0, 256, (130, 128), dtype=torch.uint8, generator=gen)
        scale_b = rng.choice(E4M3_BYTES, (130, 16))
        scale = torch.from_numpy(scale_b).view(torch.float8_e4m3fn)
        codes = np.stack([packed.numpy() & 15, packed.numpy() >> 4], -1).reshape(130, 256)
        pair = E2M1[codes] * np.repeat(_decode_e4m3(scale_b), 16, axis=1)
        s2 = modelopt_scale_2(np.array([amax]))[0]
        gs = ct_global_scale(np.array([amax]))[0]
        checked += assert_matches(
            dequantize_nvfp4_modelopt(packed, scale, torch.tensor(s2), OUT[fmt], device=device),
            round_exact_product(pair * np.float64(s2), fmt), "NVFP4 ModelOpt random")
        checked += assert_matches(
            dequantize_nvfp4_compressed_tensors(packed, scale, torch.tensor([gs]), OUT[fmt],
                                                device=device),
            round_exact_quotient(pair, np.full(pair.shape, np.float64(gs)), fmt),
            "NVFP4 compressed-tensors random")
        # block FP8 [200, 150] with partial edge blocks and float32 block scales
        w_b = rng.choice(E4M3_BYTES, (200, 150))
        s_inv = _f32(rng.uniform(0.5, 2, (2, 2)) * amax / 448)
        full = np.repeat(np.repeat(s_inv.astype(np.float64), 128, 0), 128, 1)[:200, :150]
        checked += assert_matches(
            dequantize_fp8_block(torch.from_numpy(w_b).view(torch.float8_e4m3fn),
                                 torch.from_numpy(s_inv), OUT[fmt], device=device),
            round_exact_product(_decode_e4m3(w_b) * full, fmt), "FP8 block random")
    assert checked == 2 * (2 * 130 * 256 + 200 * 150)
