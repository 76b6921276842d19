"""FP8 (e4m3) weight kernels: dequantize and quantize, per tensor, per channel and per block.

Formats (confirmed against the producers' code; see DESIGN.md section 1):

* ModelOpt FP8 (``quant_algo: FP8``): ``weight`` float8_e4m3fn and ``weight_scale`` float32
  (a scalar; ``FP8_PC_PT`` writes one scale per output row). ModelOpt exports
  ``weight_scale = amax / 448`` and ``weight = (w / weight_scale).to(float8_e4m3fn)``, so
  dequantization is a **multiply**: ``W = fp8 * weight_scale``.
* compressed-tensors ``float-quantized`` (schemes ``FP8``, ``FP8_DYNAMIC``, ``FP8_BLOCK``):
  ``weight`` float8_e4m3fn and ``weight_scale`` in the model dtype (usually bfloat16), shaped
  ``[1]`` (tensor), ``[out, 1]`` (channel) or ``[ceil(M/bm), ceil(N/bn)]`` (block). Also a
  multiply, but computed **in the scale's dtype**: ``_dequantize`` does
  ``x_q.to(scale.dtype) * scale``.
* DeepSeek-V3 block FP8: ``weight`` float8_e4m3fn and ``weight_scale_inv`` float32
  ``[ceil(M/128), ceil(N/128)]``; ``W[i, j] = fp8[i, j] * weight_scale_inv[i // 128, j // 128]``
  (a multiply despite the name), computed in float32 and stored in bfloat16.

Every function computes in float32 and rounds once to the output dtype, except
``layout="compressed-tensors"``, which mirrors compressed-tensors' own order of operations and
intermediate dtype so the result is bit-identical to its decompression.

Large weights are processed in row chunks, so the extra memory is the output tensor plus a few
chunk-sized temporaries, never whole-tensor float32 copies. The chunk size is an internal detail
(``_CHUNK_ELEMENTS``).

The small helpers at the top (``_check_out_dtype``, ``_row_chunks``...) are shared with
``patcher.quant.nvfp4``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

__all__ = [
    "FP8_E4M3_MAX",
    "OUT_DTYPES",
    "fp8_block_scale_shape",
    "check_fp8_block_shapes",
    "check_fp8_scale_shape",
    "dequantize_fp8_per_tensor",
    "dequantize_fp8_block",
    "quantize_fp8_per_tensor",
    "quantize_fp8_block",
]

#: Largest finite float8_e4m3fn value.
FP8_E4M3_MAX = 448.0

#: Output dtypes the dequantizers produce.
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

# Elements per row chunk. A chunk's float32 temporaries are 4 bytes per element each, so a
# few of them stay at tens of MiB whatever the size of the weight.
_CHUNK_ELEMENTS = 1 << 20


# --------------------------------------------------------------------------------------------
# Shared helpers (also used by nvfp4.py)
# --------------------------------------------------------------------------------------------

def _check_out_dtype(out_dtype: torch.dtype) -> None:
    if out_dtype not in OUT_DTYPES:
        names = ", ".join(str(d) for d in OUT_DTYPES)
        raise ValueError(f"output dtype must be one of {names}, got {out_dtype}")


def _device(device: str | torch.device) -> torch.device:
    return torch.device(device)


def _shape(t: torch.Tensor | Sequence[int]) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(int(d) for d in t)


def _row_chunks(rows: int, cols: int, align: int = 1) -> Iterator[tuple[int, int]]:
    """Yield ``(start, stop)`` row ranges covering ``rows`` rows of ``cols`` elements each.

    Each range holds about ``_CHUNK_ELEMENTS`` elements; starts are multiples of ``align`` (so a
    block of ``align`` rows never straddles two chunks).
    """
    per_chunk = max(1, _CHUNK_ELEMENTS // max(1, cols))
    per_chunk = max(align, per_chunk // align * align)
    for start in range(0, rows, per_chunk):
        yield start, min(rows, start + per_chunk)


# float32 value of every float8_e4m3fn bit pattern (the NaN patterns decode to NaN, as in torch).
_E4M3_TO_F32 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def _fp8_to_f32(x: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``x.to(dev).to(float32)``, bit for bit. torch converts float8 to float32 on the CPU with
    scalar code (~0.2 G elements/s a thread); a 256-entry table lookup in numpy is ~4x faster."""
    if dev.type == "cpu" and x.device.type == "cpu" and x.dtype == torch.float8_e4m3fn:
        codes = x.contiguous().view(torch.uint8).numpy()
        return torch.from_numpy(np.take(_E4M3_TO_F32.numpy(), codes))
    return x.to(dev).to(torch.float32)


def _scalar_f32(t: torch.Tensor, what: str, dev: torch.device) -> torch.Tensor:
    if t.numel() != 1:
        raise ValueError(f"{what} must hold exactly one value, got shape {list(t.shape)}")
    return t.detach().reshape(()).to(device=dev, dtype=torch.float32)


# --------------------------------------------------------------------------------------------
# Shape checks (usable on header metadata alone, before any tensor data is read)
# --------------------------------------------------------------------------------------------

def fp8_block_scale_shape(weight_shape: Sequence[int],
                          block: tuple[int, int] = (128, 128)) -> tuple[int, int]:
    """Expected block-scale shape for a 2-D block-quantized weight.

    Args:
        weight_shape: ``(M, N)`` of the FP8 weight.
        block: ``(bm, bn)`` block size (DeepSeek-V3: ``weight_block_size`` = ``[128, 128]``).

    Returns:
        ``(ceil(M / bm), ceil(N / bn))``.
    """
    bm, bn = _check_block(block)
    m, n = _shape(weight_shape)
    return (math.ceil(m / bm), math.ceil(n / bn))


def check_fp8_block_shapes(weight_shape: Sequence[int], scale_shape: Sequence[int],
                           block: tuple[int, int] = (128, 128)) -> None:
    """Validate a block-FP8 weight/scale pair by shape.

    Args:
        weight_shape: shape of the FP8 weight; must be 2-D.
        scale_shape: shape of its ``weight_scale_inv`` (or compressed-tensors block
            ``weight_scale``).
        block: ``(bm, bn)`` block size.

    Raises:
        ValueError: the weight is not 2-D, or the scale is not ``(ceil(M/bm), ceil(N/bn))``.
    """
    ws, ss = _shape(weight_shape), _shape(scale_shape)
    if len(ws) != 2:
        raise ValueError(f"block-FP8 weight must be 2-D, got shape {list(ws)}")
    expected = fp8_block_scale_shape(ws, block)
    if ss != expected:
        raise ValueError(
            f"block scale has shape {list(ss)}, expected {list(expected)} "
            f"(ceil of weight shape {list(ws)} / block {list(block)})")


def check_fp8_scale_shape(weight_shape: Sequence[int], scale_shape: Sequence[int]) -> str:
    """Validate a per-tensor or per-channel FP8 scale by shape.

    Accepted: one value (``[]``, ``[1]``, ``[1, 1]``) for per-tensor; ``[out, 1]``
    (compressed-tensors channel) or ``[out]`` (ModelOpt ``FP8_PC_PT``) for a 2-D weight.

    Args:
        weight_shape: shape of the FP8 weight.
        scale_shape: shape of its ``weight_scale``.

    Returns:
        ``"tensor"`` or ``"channel"``.

    Raises:
        ValueError: any other scale shape.
    """
    ws, ss = _shape(weight_shape), _shape(scale_shape)
    if math.prod(ss) == 1 and len(ss) <= 2:
        return "tensor"
    if len(ws) == 2 and ss in ((ws[0], 1), (ws[0],)):
        return "channel"
    expected = "[] or [1] (per tensor)"
    if len(ws) == 2:
        expected += f", [{ws[0]}, 1] or [{ws[0]}] (per channel)"
    raise ValueError(f"FP8 scale has shape {list(ss)}, expected {expected} "
                     f"for weight shape {list(ws)}")


def _check_block(block: tuple[int, int]) -> tuple[int, int]:
    if len(block) != 2 or any(int(b) != b or b <= 0 for b in block):
        raise ValueError(f"block must be two positive integers, got {block!r}")
    return int(block[0]), int(block[1])


def _check_fp8_weight(weight: torch.Tensor) -> None:
    if weight.dtype not in _FP8_DTYPES:
        raise ValueError(f"FP8 weight must have dtype float8_e4m3fn, got {weight.dtype}")


def _check_layout(layout: str, allowed: tuple[str, ...]) -> None:
    if layout not in allowed:
        raise ValueError(f"layout must be one of {', '.join(allowed)}, got {layout!r}")


# --------------------------------------------------------------------------------------------
# Dequantization
# --------------------------------------------------------------------------------------------

def dequantize_fp8_per_tensor(weight_fp8: torch.Tensor, scale: torch.Tensor,
                              out_dtype: torch.dtype = torch.bfloat16, *,
                              layout: str = "modelopt",
                              device: str = "cpu") -> torch.Tensor:
    """Dequantize an FP8 weight with one scale per tensor or per output channel.

    ``W = fp8 * scale`` (ModelOpt and compressed-tensors both multiply).

    Args:
        weight_fp8: float8_e4m3fn weight, any shape (2-D for a per-channel scale).
        scale: ``weight_scale``: one value, or ``[out, 1]`` / ``[out]`` per channel.
        out_dtype: bfloat16, float16 or float32.
        layout: ``"modelopt"``: the product in float32, rounded once to ``out_dtype``.
            ``"compressed-tensors"``: mirrors compressed-tensors' ``_dequantize``, which
            multiplies in ``scale.dtype`` (``fp8.to(scale.dtype) * scale``); the result is then
            cast to ``out_dtype``. Identical to ``"modelopt"`` when the scale is float32, or when
            it is bfloat16/float16 and ``out_dtype`` equals it.
        device: where the arithmetic runs (``"cpu"``, ``"cuda"``...). The result is on the CPU.

    Returns:
        The dequantized weight, shape of ``weight_fp8``, dtype ``out_dtype``, on the CPU.

    Raises:
        ValueError: wrong weight dtype, scale shape, output dtype or layout.
    """
    _check_out_dtype(out_dtype)
    _check_layout(layout, ("modelopt", "compressed-tensors"))
    _check_fp8_weight(weight_fp8)
    kind = check_fp8_scale_shape(weight_fp8.shape, scale.shape)
    dev = _device(device)
    compute = torch.float32 if layout == "modelopt" else scale.dtype

    shape = tuple(weight_fp8.shape)
    cols = shape[-1] if len(shape) else 1
    w2 = weight_fp8.reshape(-1, cols)
    out = torch.empty(shape, dtype=out_dtype)
    out2 = out.view(-1, cols)
    if kind == "tensor":
        s_all = scale.detach().reshape(1, 1).to(device=dev, dtype=compute)
    else:
        s_all = scale.detach().reshape(-1, 1).to(device=dev, dtype=compute)
    for r0, r1 in _row_chunks(w2.shape[0], cols):
        s = s_all if kind == "tensor" else s_all[r0:r1]
        y = _fp8_to_f32(w2[r0:r1], dev).to(compute)
        y.mul_(s)
        out2[r0:r1].copy_(y.to(out_dtype))
    return out


def dequantize_fp8_block(weight_fp8: torch.Tensor, scale_inv: torch.Tensor,
                         out_dtype: torch.dtype = torch.bfloat16,
                         block: tuple[int, int] = (128, 128), *,
                         layout: str = "deepseek",
                         device: str = "cpu") -> torch.Tensor:
    """Dequantize a block-scaled FP8 weight (DeepSeek-V3 ``weight_scale_inv``).

    ``W[i, j] = fp8[i, j] * scale_inv[i // bm, j // bn]``, partial edge blocks included when
    M or N is not a multiple of the block.

    Args:
        weight_fp8: float8_e4m3fn weight ``[M, N]``.
        scale_inv: ``[ceil(M/bm), ceil(N/bn)]`` scales (float32 for DeepSeek-V3).
        out_dtype: bfloat16, float16 or float32.
        block: ``(bm, bn)``, from ``quantization_config.weight_block_size``.
        layout: ``"deepseek"``: product in float32, rounded once (DeepSeek's
            ``weight_dequant`` kernel and compressed-tensors' ``FP8BlockDequantizer`` both do
            this). ``"compressed-tensors"``: mirrors the ``FP8_BLOCK`` scheme's decompression,
            which multiplies in ``scale.dtype``, then casts to ``out_dtype``.
        device: where the arithmetic runs. The result is on the CPU.

    Returns:
        The dequantized ``[M, N]`` weight in ``out_dtype``, on the CPU.

    Raises:
        ValueError: wrong weight dtype, a weight that is not 2-D, a scale that is not
            ``(ceil(M/bm), ceil(N/bn))``, or a bad output dtype or layout.
    """
    _check_out_dtype(out_dtype)
    _check_layout(layout, ("deepseek", "compressed-tensors"))
    _check_fp8_weight(weight_fp8)
    bm, bn = _check_block(block)
    check_fp8_block_shapes(weight_fp8.shape, scale_inv.shape, (bm, bn))
    dev = _device(device)
    compute = torch.float32 if layout == "deepseek" else scale_inv.dtype

    m, n = weight_fp8.shape
    out = torch.empty((m, n), dtype=out_dtype)
    scale = scale_inv.detach().to(device=dev, dtype=compute)
    full_cols = n // bn * bn                   # columns in full column blocks
    for r0, r1 in _row_chunks(m, n, align=bm):
        # Multiply in place through views of whole blocks [row blocks, bm, col blocks, bn] by
        # the broadcast scale: no [rows, n] scale tensor is built. Partial edge blocks (the last
        # rows, the last columns) are views of their own.
        y = _fp8_to_f32(weight_fp8[r0:r1], dev).to(compute)
        s = scale[r0 // bm: (r1 + bm - 1) // bm]               # [row blocks, col blocks]
        rows = r1 - r0
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
        out[r0:r1].copy_(y.to(out_dtype))
    return out


# --------------------------------------------------------------------------------------------
# Quantization
# --------------------------------------------------------------------------------------------

def _abs_max(w: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """max |w| over the whole tensor, in float32, one row chunk at a time."""
    cols = w.shape[-1] if w.dim() else 1
    w2 = w.reshape(-1, cols)
    amax = torch.zeros((), dtype=torch.float32, device=dev)
    for r0, r1 in _row_chunks(w2.shape[0], cols):
        if r1 > r0 and cols:
            amax = torch.maximum(amax, w2[r0:r1].to(dev).abs().amax().to(torch.float32))
    return amax


def _to_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_fp8_per_tensor(w: torch.Tensor, *,
                            device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a weight to FP8 e4m3 with one float32 scale, as ModelOpt exports it.

    ``scale = amax(|w|) / 448`` and ``fp8 = clamp(w / scale, -448, 448)`` cast to
    float8_e4m3fn (round to nearest even), computed in float32. An all-zero weight gets
    ``scale = 1.0`` (ModelOpt would write 0 and refuse to export; a zero scale helps no one).

    Args:
        w: the weight, any float dtype and shape.
        device: where the arithmetic runs. The results are on the CPU.

    Returns:
        ``(fp8, scale)``: float8_e4m3fn tensor shaped like ``w`` and a 0-dim float32 scale
        (ModelOpt writes ``weight_scale`` as a scalar).
    """
    dev = _device(device)
    # A 0-dim tensor divisor: PyTorch's CUDA kernel turns a Python-scalar divisor into a multiply
    # by its reciprocal, which can differ from the CPU's division in the last bit.
    scale = _abs_max(w, dev) / torch.tensor(FP8_E4M3_MAX, device=dev)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    shape = tuple(w.shape)
    cols = shape[-1] if shape else 1
    w2 = w.reshape(-1, cols)
    out = torch.empty(shape, dtype=torch.float8_e4m3fn)
    out2 = out.view(-1, cols)
    for r0, r1 in _row_chunks(w2.shape[0], cols):
        out2[r0:r1].copy_(_to_e4m3(w2[r0:r1].to(dev).to(torch.float32) / scale).cpu())
    return out, scale.cpu()


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = (128, 128), *,
                       device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D weight to block FP8 as DeepSeek-V3's ``weight_quant`` kernel does.

    Per block: ``s = amax(|block|) / 448`` and ``fp8 = clamp(w / s, -448, 448)`` cast to
    float8_e4m3fn, in float32. Edge blocks are partial. An all-zero block gets ``s = 1.0``
    (DeepSeek's kernel would divide 0 by 0 and store NaN).

    Args:
        w: ``[M, N]`` weight, any float dtype.
        block: ``(bm, bn)`` block size.
        device: where the arithmetic runs. The results are on the CPU.

    Returns:
        ``(fp8, scale_inv)``: float8_e4m3fn ``[M, N]`` and float32
        ``[ceil(M/bm), ceil(N/bn)]`` (DeepSeek's ``weight_scale_inv``; dequantize multiplies).

    Raises:
        ValueError: ``w`` is not 2-D or the block is invalid.
    """
    bm, bn = _check_block(block)
    if w.dim() != 2:
        raise ValueError(f"block-FP8 quantization needs a 2-D weight, got shape {list(w.shape)}")
    dev = _device(device)
    m, n = w.shape
    mb, nb = fp8_block_scale_shape((m, n), (bm, bn))
    out = torch.empty((m, n), dtype=torch.float8_e4m3fn)
    scales = torch.empty((mb, nb), dtype=torch.float32)
    col_block = torch.arange(n, device=dev) // bn
    for r0, r1 in _row_chunks(m, n, align=bm):
        rows = r1 - r0
        x = w[r0:r1].to(dev).to(torch.float32)
        rb = math.ceil(rows / bm)
        padded = torch.nn.functional.pad(x.abs(), (0, nb * bn - n, 0, rb * bm - rows))
        amax = padded.reshape(rb, bm, nb, bn).amax(dim=(1, 3))
        del padded
        s = amax / torch.tensor(FP8_E4M3_MAX, device=dev)
        s = torch.where(s > 0, s, torch.ones_like(s))
        scales[r0 // bm: r0 // bm + rb].copy_(s)
        s_full = s.repeat_interleave(bm, dim=0)[:rows].index_select(1, col_block)
        out[r0:r1].copy_(_to_e4m3(x / s_full).cpu())
    return out, scales
