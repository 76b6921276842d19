"""FP8 dequantization: one scale per tensor or per output channel, or one per block.

Each product ``fp8 * scale`` is rounded once, half to even, to the output dtype, whatever the
scale's dtype (float32 from ModelOpt and DeepSeek, bfloat16/float16 from compressed-tensors):
computed in float32 (one rounding), and exactly in float64 for the rows where that float32 value
could round wrongly again (``patcher.tensors.quant.rounding.round_via_f32``). On a GPU every
product is computed exactly in float64 and rounded by ``round_exact``: the same values, half the
kernel launches, and no choice of rows that would make the host wait for the device.

Also the float8 e4m3 codec the FP8 and NVFP4 kernels share: decoding float8_e4m3fn to
float32/float64 and rounding float32 to it."""

from __future__ import annotations

import numpy as np
import torch

from ..kernel_args import check_out_dtype, row_chunks, scale_f64, torch_device
from ..rounding import round_exact, round_via_f32
from .shapes import (
    check_block,
    check_fp8_block_shapes,
    check_fp8_scale_shape,
    fp8_block_scale_shape,
)

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

#: Largest finite float8_e4m3fn value.
FP8_E4M3_MAX = 448.0

# Value of every float8_e4m3fn bit pattern in float32 and float64 (the NaN patterns decode to
# NaN, as in torch).
_E4M3_TABLES = {dtype: torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(dtype)
                for dtype in (torch.float32, torch.float64)}


def fp8_decode(x: torch.Tensor, dev: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dev).to(dtype)`` for float32 or float64, bit for bit (every float8 value is exact
    in both). torch converts float8 on the CPU with scalar code; a 256-entry table lookup in
    numpy is ~4x faster."""
    if dev.type == "cpu" and x.device.type == "cpu" and x.dtype == torch.float8_e4m3fn:
        codes = x.contiguous().view(torch.uint8).numpy()
        return torch.from_numpy(np.take(_E4M3_TABLES[dtype].numpy(), codes))
    return x.to(dev).to(dtype)


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturate ``x`` to +-448 (in place) and round it to float8_e4m3fn (nearest even)."""
    return x.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def _check_fp8_weight(weight: torch.Tensor) -> None:
    if weight.dtype not in _FP8_DTYPES:
        raise ValueError(f"FP8 weight must have dtype float8_e4m3fn, got {weight.dtype}")


def dequantize_fp8_per_tensor(weight_fp8: torch.Tensor, scale: torch.Tensor,
                              out_dtype: torch.dtype = torch.bfloat16, *,
                              device: str = "cpu", on_device: bool = False) -> torch.Tensor:
    """Dequantize an FP8 weight with one scale per tensor or per output channel.

    ``W = fp8 * scale`` (ModelOpt and compressed-tensors both multiply), the exact product
    rounded once, half to even, to ``out_dtype``.

    Args:
        weight_fp8: float8_e4m3fn weight, any shape (2-D for a per-channel scale).
        scale: ``weight_scale``: one value, or ``[out, 1]`` / ``[out]`` per channel.
        out_dtype: bfloat16, float16 or float32.
        device: where the arithmetic runs (``"cpu"``, ``"cuda"``...). The result is on the CPU.
        on_device: return the result on ``device`` instead (no copy back, no wait for it).

    Returns:
        The dequantized weight, shape of ``weight_fp8``, dtype ``out_dtype``, on the CPU.

    Raises:
        ValueError: wrong weight dtype, scale shape or output dtype.
    """
    check_out_dtype(out_dtype)
    _check_fp8_weight(weight_fp8)
    kind = check_fp8_scale_shape(weight_fp8.shape, scale.shape)
    dev = torch_device(device)

    shape = tuple(weight_fp8.shape)
    cols = shape[-1] if len(shape) else 1
    w2 = weight_fp8.reshape(-1, cols)
    out = torch.empty(shape, dtype=out_dtype, device=dev)
    out2 = out.view(-1, cols)
    s64 = scale_f64(scale.reshape(-1, 1), "FP8 scale", dev)
    s32 = s64.to(torch.float32) if dev.type == "cpu" else None   # exact: float32 or less
    for r0, r1 in row_chunks(w2.shape[0], cols, dev=dev):
        w = w2[r0:r1]
        s_exact = s64 if kind == "tensor" else s64[r0:r1]
        if dev.type != "cpu":
            round_exact(fp8_decode(w, dev, torch.float64).mul_(s_exact), out_dtype,
                        out=out2[r0:r1])
            continue

        def exact_rows(rows, w=w, s_exact=s_exact):
            return fp8_decode(w[rows.to(w.device)], dev, torch.float64).mul_(
                s_exact if kind == "tensor" else s_exact[rows])

        y = fp8_decode(w, dev, torch.float32).mul_(s32 if kind == "tensor" else s32[r0:r1])
        round_via_f32(y, out_dtype, exact_rows, out=out2[r0:r1])
    return out if on_device else out.cpu()


def dequantize_fp8_block(weight_fp8: torch.Tensor, scale_inv: torch.Tensor,
                         out_dtype: torch.dtype = torch.bfloat16,
                         block: tuple[int, int] = (128, 128), *,
                         device: str = "cpu", on_device: bool = False) -> torch.Tensor:
    """Dequantize a block-scaled FP8 weight (DeepSeek-V3 ``weight_scale_inv``).

    ``W[i, j] = fp8[i, j] * scale_inv[i // bm, j // bn]``, partial edge blocks included when
    M or N is not a multiple of the block; the exact product rounded once, half to even, to
    ``out_dtype``. (DeepSeek's ``weight_dequant`` kernel rounds the product to float32 first;
    compressed-tensors' ``FP8_BLOCK`` decompression multiplies in the scale's dtype. Both agree
    with this where their result is correctly rounded; see docs/numerics.md.)

    Args:
        weight_fp8: float8_e4m3fn weight ``[M, N]``.
        scale_inv: ``[ceil(M/bm), ceil(N/bn)]`` scales (float32 for DeepSeek-V3, the model
            dtype for compressed-tensors ``FP8_BLOCK``), or that grid with its size-1
            dimensions squeezed out, as transformers 5.x saves MoE expert scales.
        out_dtype: bfloat16, float16 or float32.
        block: ``(bm, bn)``, from ``quantization_config.weight_block_size``.
        device: where the arithmetic runs. The result is on the CPU.
        on_device: return the result on ``device`` instead (no copy back, no wait for it).

    Returns:
        The dequantized ``[M, N]`` weight in ``out_dtype``, on the CPU.

    Raises:
        ValueError: wrong weight dtype, a weight that is not 2-D, a scale that is not
            ``(ceil(M/bm), ceil(N/bn))`` or its squeezed form, or a bad output dtype.
    """
    check_out_dtype(out_dtype)
    _check_fp8_weight(weight_fp8)
    bm, bn = check_block(block)
    check_fp8_block_shapes(weight_fp8.shape, scale_inv.shape, (bm, bn))
    dev = torch_device(device)
    scale_inv = scale_inv.reshape(fp8_block_scale_shape(weight_fp8.shape, (bm, bn)))

    m, n = weight_fp8.shape
    out = torch.empty((m, n), dtype=out_dtype, device=dev)
    s64 = scale_f64(scale_inv, "block scale", dev)
    s32 = s64.to(torch.float32) if dev.type == "cpu" else None   # exact: float32 or less
    for r0, r1 in row_chunks(m, n, align=bm, dev=dev):
        w = weight_fp8[r0:r1]
        if dev.type != "cpu":
            y = fp8_decode(w, dev, torch.float64)
            _mul_by_block_scales_(y, s64[r0 // bm: (r1 + bm - 1) // bm], (bm, bn))
            round_exact(y, out_dtype, out=out[r0:r1])
            continue

        def exact_rows(rows, w=w, r0=r0):
            s_rows = s64[(rows + r0) // bm].repeat_interleave(bn, dim=1)[:, :n]
            return fp8_decode(w[rows.to(w.device)], dev, torch.float64).mul_(s_rows)

        y = fp8_decode(w, dev, torch.float32)
        _mul_by_block_scales_(y, s32[r0 // bm: (r1 + bm - 1) // bm], (bm, bn))
        round_via_f32(y, out_dtype, exact_rows, out=out[r0:r1])
    return out if on_device else out.cpu()


def _mul_by_block_scales_(y: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> None:
    """Multiply the rows ``y`` ``[rows, n]`` (a chunk whose first row starts a row block) in place
    by their block scales ``s`` ``[row blocks, col blocks]``.

    Works through views of whole blocks ``[row blocks, bm, col blocks, bn]`` times the broadcast
    scale: no ``[rows, n]`` scale tensor is built. Partial edge blocks (the last rows, the last
    columns) are views of their own.
    """
    bm, bn = block
    rows, n = y.shape
    full_cols = n // bn * bn                   # columns in full column blocks
    whole = rows // bm * bm
    for part, s_part in ((y[:whole], s[: rows // bm]), (y[whole:], s[rows // bm:])):
        if part.shape[0] == 0:
            continue
        nrb = s_part.shape[0]
        per = part.shape[0] // nrb
        if full_cols:
            part[:, :full_cols].view(nrb, per, full_cols // bn, bn).mul_(
                s_part[:, : full_cols // bn].reshape(nrb, 1, -1, 1))
        if full_cols < n:
            part[:, full_cols:].view(nrb, per, n - full_cols).mul_(
                s_part[:, full_cols // bn:].reshape(nrb, 1, 1))
