"""NVFP4 dequantization, as ModelOpt and compressed-tensors each define it."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..chunks import row_chunks
from ..kernel_args import check_out_dtype, scalar_f32, torch_device
from .e2m1 import E2M1_VALUES, E2M1_VALUES_CT, packed_to_f32
from .shapes import NVFP4_GROUP_SIZE, check_nvfp4_shapes


class _Operands(NamedTuple):
    """The checked operands of an NVFP4 dequantization, as 2-D views: ``packed`` codes
    ``[rows, k/2]``, group ``scale`` ``[rows, k/16]``; ``full`` is the output shape."""

    full: tuple[int, ...]
    dev: torch.device
    k: int
    groups: int
    packed: torch.Tensor
    scale: torch.Tensor


def _operands(weight: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor,
              names: tuple[str, str, str], out_dtype: torch.dtype, device: str) -> _Operands:
    check_out_dtype(out_dtype)
    if weight.dtype != torch.uint8:
        raise ValueError(f"NVFP4 {names[0]} must be uint8 (two e2m1 codes per byte), "
                         f"got {weight.dtype}")
    if not scale.is_floating_point():
        raise ValueError(f"NVFP4 {names[1]} must be a float tensor (float8_e4m3fn), "
                         f"got {scale.dtype}")
    full = check_nvfp4_shapes(weight.shape, scale.shape, global_scale.shape, names=names)
    k = full[-1]
    groups = k // NVFP4_GROUP_SIZE
    return _Operands(full, torch_device(device), k, groups, weight.reshape(-1, k // 2),
                     scale.reshape(-1, groups))


def dequantize_nvfp4_modelopt(weight_u8: torch.Tensor, weight_scale_e4m3: torch.Tensor,
                              weight_scale_2: torch.Tensor,
                              out_dtype: torch.dtype = torch.bfloat16, *,
                              device: str = "cpu") -> torch.Tensor:
    """Dequantize a ModelOpt NVFP4 weight.

    ``W[r, c] = LUT[code[r, c]] * float(weight_scale[r, c // 16]) * weight_scale_2``, evaluated
    left to right in float32 and rounded once to ``out_dtype``. ``LUT * weight_scale`` is exact
    in float32, so the result is the correctly rounded product. (ModelOpt's own
    ``NVFP4QTensor.dequantize`` multiplies the two scales first, which rounds twice and can
    differ in the last float32 bit.)

    Args:
        weight_u8: ``weight``, uint8 ``[out, in/2]`` (leading batch dimensions allowed).
        weight_scale_e4m3: ``weight_scale``, float8_e4m3fn ``[out, in/16]``.
        weight_scale_2: ``weight_scale_2``, float32, one value.
        out_dtype: bfloat16, float16 or float32.
        device: where the arithmetic runs. The result is on the CPU.

    Returns:
        ``[out, in]`` tensor in ``out_dtype`` on the CPU.

    Raises:
        ValueError: wrong dtypes or shapes (the message gives expected and actual shapes).
    """
    full, dev, k, groups, packed, scale = _operands(
        weight_u8, weight_scale_e4m3, weight_scale_2,
        ("weight", "weight_scale", "weight_scale_2"), out_dtype, device)
    s2 = scalar_f32(weight_scale_2, "weight_scale_2", dev)
    lut = E2M1_VALUES.to(dev)
    out = torch.empty(full, dtype=out_dtype)
    out2 = out.view(-1, k)
    for r0, r1 in row_chunks(packed.shape[0], k):
        v = packed_to_f32(packed[r0:r1].to(dev), lut)
        s = scale[r0:r1].to(dev).to(torch.float32)
        v.view(r1 - r0, groups, NVFP4_GROUP_SIZE).mul_(s.unsqueeze(-1))
        v.mul_(s2)
        out2[r0:r1].copy_(v.to(out_dtype))
    return out


def dequantize_nvfp4_compressed_tensors(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                                        weight_global_scale: torch.Tensor,
                                        out_dtype: torch.dtype = torch.bfloat16, *,
                                        device: str = "cpu") -> torch.Tensor:
    """Dequantize a compressed-tensors NVFP4 weight, bit for bit as compressed-tensors does.

    This mirrors ``NVFP4PackedCompressor.decompress`` -> ``dequantize`` -> ``_process_group`` ->
    ``_dequantize`` with the unpacked dtype set to ``out_dtype``:

    1. ``x_q = (kE2M1[code & 7] * where(sign, -1, 1)).to(out_dtype)`` (float32 table, so code 8
       is -0.0);
    2. ``s = weight_scale.to(out_dtype)``;
    3. ``s = s / weight_global_scale``: the **scale** is divided first. With the usual ``[1]``
       float32 global scale, type promotion makes this a float32 division; with a 0-dim global
       scale it stays in ``out_dtype``. Both are reproduced, because the same ops run on the
       same dtypes and dimensions;
    4. ``x_q.to(s.dtype) * s``, then cast to ``out_dtype``.

    For bfloat16 this is exactly ``NVFP4PackedCompressor.decompress`` (which always unpacks to
    bfloat16). For float16/float32 it is compressed-tensors' ``dequantize`` fed an unpacked
    tensor of that dtype, which keeps the extra precision instead of rounding through bfloat16.

    Args:
        weight_packed: uint8 ``[out, in/2]`` (leading batch dimensions allowed).
        weight_scale: float8_e4m3fn ``[out, in/16]``.
        weight_global_scale: float32 ``[1]`` (the reciprocal of ModelOpt's weight_scale_2).
        out_dtype: bfloat16, float16 or float32.
        device: where the arithmetic runs. The result is on the CPU.

    Returns:
        ``[out, in]`` tensor in ``out_dtype`` on the CPU.

    Raises:
        ValueError: wrong dtypes or shapes (the message gives expected and actual shapes).
    """
    full, dev, k, groups, packed, scale = _operands(
        weight_packed, weight_scale, weight_global_scale,
        ("weight_packed", "weight_scale", "weight_global_scale"), out_dtype, device)
    gs = weight_global_scale.detach().to(dev)          # same dtype and dims as the caller's
    lut = E2M1_VALUES_CT.to(dev)
    out = torch.empty(full, dtype=out_dtype)
    out2 = out.view(-1, k)
    for r0, r1 in row_chunks(packed.shape[0], k):
        x_q = packed_to_f32(packed[r0:r1].to(dev), lut).to(out_dtype)
        s = scale[r0:r1].to(dev).to(out_dtype).unsqueeze(-1) / gs
        y = x_q.view(r1 - r0, groups, NVFP4_GROUP_SIZE).to(s.dtype) * s
        out2[r0:r1].copy_(y.view(r1 - r0, k).to(out_dtype))
    return out
