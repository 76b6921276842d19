"""NVFP4 dequantization, as ModelOpt and compressed-tensors each define it.

Both round the exact value once, half to even, to the output dtype: computed in float32 (the
code times the group scale is exact there, the global scale adds one rounding), and in float64
for the rows where that float32 value could round wrongly again
(``patcher.tensors.quant.rounding.round_via_f32``). ModelOpt's product is exact in float64;
compressed-tensors' quotient is rounded to float64 first, which provably changes nothing (see
that module). On a GPU every value is computed in float64 and rounded by ``round_exact``: the
same values, fewer kernel launches, and no choice of rows that would make the host wait."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..kernel_args import check_out_dtype, row_chunks, scalar_f64, scale_f64, torch_device
from ..rounding import round_exact, round_via_f32
from .e2m1 import E2M1_VALUES, E2M1_VALUES_CT, E2M1_VALUES_CT_F64, E2M1_VALUES_F64, decode_packed
from .shapes import NVFP4_GROUP_SIZE, check_nvfp4_shapes

_GROUP_SCALE_DTYPES = (torch.float8_e4m3fn, torch.bfloat16, torch.float16)


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
    if scale.dtype not in _GROUP_SCALE_DTYPES:   # times an e2m1 value: exact in float32
        raise ValueError(f"NVFP4 {names[1]} must be float8_e4m3fn (or bfloat16/float16), "
                         f"got {scale.dtype}")
    full = check_nvfp4_shapes(weight.shape, scale.shape, global_scale.shape, names=names)
    k = full[-1]
    groups = k // NVFP4_GROUP_SIZE
    return _Operands(full, torch_device(device), k, groups, weight.reshape(-1, k // 2),
                     scale.reshape(-1, groups))


def dequantize_nvfp4_modelopt(weight_u8: torch.Tensor, weight_scale_e4m3: torch.Tensor,
                              weight_scale_2: torch.Tensor,
                              out_dtype: torch.dtype = torch.bfloat16, *,
                              device: str = "cpu", on_device: bool = False) -> torch.Tensor:
    """Dequantize a ModelOpt NVFP4 weight.

    ``W[r, c] = LUT[code[r, c]] * float(weight_scale[r, c // 16]) * weight_scale_2``: the
    exact product, rounded once, half to even, to ``out_dtype``. (ModelOpt's own
    ``NVFP4QTensor.dequantize`` multiplies the two scales first, in float32, and rounds the
    product to float32 before any cast; see docs/numerics.md for where that differs.)

    Args:
        weight_u8: ``weight``, uint8 ``[out, in/2]`` (leading batch dimensions allowed).
        weight_scale_e4m3: ``weight_scale``, float8_e4m3fn ``[out, in/16]``.
        weight_scale_2: ``weight_scale_2``, float32, one value.
        out_dtype: bfloat16, float16 or float32.
        device: where the arithmetic runs. The result is on the CPU.
        on_device: return the result on ``device`` instead (no copy back, no wait for it).

    Returns:
        ``[out, in]`` tensor in ``out_dtype`` on the CPU.

    Raises:
        ValueError: wrong dtypes or shapes (the message gives expected and actual shapes).
    """
    full, dev, _, _, packed, scale = _operands(
        weight_u8, weight_scale_e4m3, weight_scale_2,
        ("weight", "weight_scale", "weight_scale_2"), out_dtype, device)
    s2 = scalar_f64(weight_scale_2, "weight_scale_2", dev)
    out = _dequantize(packed, scale, full, dev, out_dtype, (E2M1_VALUES, E2M1_VALUES_F64),
                      lambda v, s2=s2: v.mul_(s2.to(v.dtype)))
    return out if on_device else out.cpu()


def dequantize_nvfp4_compressed_tensors(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                                        weight_global_scale: torch.Tensor,
                                        out_dtype: torch.dtype = torch.bfloat16, *,
                                        device: str = "cpu",
                                        on_device: bool = False) -> torch.Tensor:
    """Dequantize a compressed-tensors NVFP4 weight.

    ``W[r, c] = LUT[code[r, c]] * weight_scale[r, c // 16] / weight_global_scale`` (compressed-
    tensors divides by its global scale, ``6 * 448 / amax``): the exact quotient, rounded once,
    half to even, to ``out_dtype``. compressed-tensors' own ``NVFP4PackedCompressor.decompress``
    divides the group scale by the global scale first and rounds through float32 and bfloat16;
    see docs/numerics.md for where that differs.

    Args:
        weight_packed: uint8 ``[out, in/2]`` (leading batch dimensions allowed).
        weight_scale: float8_e4m3fn ``[out, in/16]``.
        weight_global_scale: float32 ``[1]`` (the reciprocal of ModelOpt's weight_scale_2).
        out_dtype: bfloat16, float16 or float32.
        device: where the arithmetic runs. The result is on the CPU.
        on_device: return the result on ``device`` instead (no copy back, no wait for it).

    Returns:
        ``[out, in]`` tensor in ``out_dtype`` on the CPU.

    Raises:
        ValueError: wrong dtypes or shapes (the message gives expected and actual shapes).
    """
    full, dev, _, _, packed, scale = _operands(
        weight_packed, weight_scale, weight_global_scale,
        ("weight_packed", "weight_scale", "weight_global_scale"), out_dtype, device)
    gs = scalar_f64(weight_global_scale, "weight_global_scale", dev)
    out = _dequantize(packed, scale, full, dev, out_dtype,
                      (E2M1_VALUES_CT, E2M1_VALUES_CT_F64), lambda v, gs=gs: v.div_(gs.to(v.dtype)))
    return out if on_device else out.cpu()


def _dequantize(packed: torch.Tensor, scale: torch.Tensor, full: tuple[int, ...],
                dev: torch.device, out_dtype: torch.dtype,
                luts: tuple[torch.Tensor, torch.Tensor],
                apply_global: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``apply_global(LUT[code] * group scale)`` row chunk by row chunk: in float32 (the
    product with the group scale exact, ``apply_global`` one rounding), and in float64 for the
    rows ``round_via_f32`` asks for. ``luts``: the code table in float32 and float64."""
    k = full[-1]
    groups = k // NVFP4_GROUP_SIZE
    out = torch.empty(full, dtype=out_dtype, device=dev)
    out2 = out.view(-1, k)

    def values(p: torch.Tensor, s: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
        v = decode_packed(p.to(dev), lut.to(dev))
        v.view(p.shape[0], groups, NVFP4_GROUP_SIZE).mul_(
            scale_f64(s, "weight_scale", dev).to(lut.dtype).unsqueeze(-1))   # exact
        return apply_global(v)

    for r0, r1 in row_chunks(packed.shape[0], k, dev=dev):
        p, s = packed[r0:r1], scale[r0:r1]
        if dev.type != "cpu":
            round_exact(values(p, s, luts[1]), out_dtype, out=out2[r0:r1])
            continue

        def exact_rows(rows, p=p, s=s):
            rows = rows.to(p.device)
            return values(p[rows], s[rows], luts[1])

        round_via_f32(values(p, s, luts[0]), out_dtype, exact_rows, out=out2[r0:r1])
    return out
