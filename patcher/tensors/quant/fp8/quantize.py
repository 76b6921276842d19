"""FP8 quantization: one float32 scale per tensor (ModelOpt) or per block (DeepSeek-V3)."""

from __future__ import annotations

import math

import torch

from ..kernel_args import abs_max, check_finite_amax, row_chunks, torch_device
from .dequantize import FP8_E4M3_MAX, to_e4m3
from .shapes import check_block, fp8_block_scale_shape


def quantize_fp8_per_tensor(w: torch.Tensor, *, device: str = "cpu",
                            amax: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a weight to FP8 e4m3 with one float32 scale, as ModelOpt exports it.

    ``scale = amax(|w|) / 448`` and ``fp8 = clamp(w / scale, -448, 448)`` cast to
    float8_e4m3fn (round to nearest even), computed in float32. An all-zero weight gets
    ``scale = 1.0`` (ModelOpt would write 0 and refuse to export; a zero scale helps no one).

    Args:
        w: the weight, any float dtype and shape.
        device: where the arithmetic runs. The results are on the CPU.
        amax: the magnitude the scale is computed from instead of ``max |w|``: the largest of a
            fused group's weights (``plan.fused_groups``), at least ``max |w|``.

    Returns:
        ``(fp8, scale)``: float8_e4m3fn tensor shaped like ``w`` and a 0-dim float32 scale
        (ModelOpt writes ``weight_scale`` as a scalar).
    """
    dev = torch_device(device)
    # A 0-dim tensor divisor: PyTorch's CUDA kernel turns a Python-scalar divisor into a multiply
    # by its reciprocal, which can differ from the CPU's division in the last bit.
    own = abs_max(w, dev)
    check_finite_amax(own, w)
    amax = own if amax is None else torch.maximum(own, amax.to(dev, torch.float32))
    scale = amax / torch.tensor(FP8_E4M3_MAX, device=dev)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    shape = tuple(w.shape)
    cols = shape[-1] if shape else 1
    w2 = w.reshape(-1, cols)
    out = torch.empty(shape, dtype=torch.float8_e4m3fn)
    out2 = out.view(-1, cols)
    for r0, r1 in row_chunks(w2.shape[0], cols):
        out2[r0:r1].copy_(to_e4m3(w2[r0:r1].to(dev).to(torch.float32) / scale).cpu())
    return out, scale.cpu()


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = (128, 128), *,
                       device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D weight to block FP8 as DeepSeek-V3's ``weight_quant`` kernel does.

    Per block: ``s = amax(|block|) / 448`` and ``fp8 = clamp(w / s, -448, 448)`` cast to
    float8_e4m3fn, in float32. Edge blocks are partial. An all-zero block gets ``s = 1.0``
    (DeepSeek's kernel would divide 0 by 0 and store NaN). A weight holding inf or NaN is refused
    (``NonFiniteInput``).

    Args:
        w: ``[M, N]`` weight, any float dtype.
        block: ``(bm, bn)`` block size.
        device: where the arithmetic runs. The results are on the CPU.

    Returns:
        ``(fp8, scale_inv)``: float8_e4m3fn ``[M, N]`` and float32
        ``[ceil(M/bm), ceil(N/bn)]`` (DeepSeek's ``weight_scale_inv``; dequantize multiplies).

    Raises:
        ValueError: ``w`` is not 2-D or the block is invalid.
        NonFiniteInput: ``w`` holds inf or NaN.
    """
    bm, bn = check_block(block)
    if w.dim() != 2:
        raise ValueError(f"block-FP8 quantization needs a 2-D weight, got shape {list(w.shape)}")
    dev = torch_device(device)
    m, n = w.shape
    mb, nb = fp8_block_scale_shape((m, n), (bm, bn))
    out = torch.empty((m, n), dtype=torch.float8_e4m3fn)
    scales = torch.empty((mb, nb), dtype=torch.float32)
    col_block = torch.arange(n, device=dev) // bn
    for r0, r1 in row_chunks(m, n, align=bm):
        rows = r1 - r0
        x = w[r0:r1].to(dev).to(torch.float32)
        rb = math.ceil(rows / bm)
        padded = torch.nn.functional.pad(x.abs(), (0, nb * bn - n, 0, rb * bm - rows))
        amax = padded.reshape(rb, bm, nb, bn).amax(dim=(1, 3))
        del padded
        check_finite_amax(amax, w)
        s = amax / torch.tensor(FP8_E4M3_MAX, device=dev)
        s = torch.where(s > 0, s, torch.ones_like(s))
        scales[r0 // bm: r0 // bm + rb].copy_(s)
        s_full = s.repeat_interleave(bm, dim=0)[:rows].index_select(1, col_block)
        out[r0:r1].copy_(to_e4m3(x / s_full).cpu())
    return out, scales
