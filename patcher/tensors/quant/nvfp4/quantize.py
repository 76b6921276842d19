"""NVFP4 quantization, computed and named the way ModelOpt or compressed-tensors does it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..fp8.dequantize import FP8_E4M3_MAX
from ..kernel_args import abs_max, check_finite_amax, row_chunks, torch_device
from .e2m1 import E2M1_MAX, round_to_e2m1_codes
from .shapes import NVFP4_GROUP_SIZE

_LAYOUTS = ("modelopt", "compressed-tensors")

#: ``(x, group_amax, global scale) -> (fp8 group scales, x / scale, sign)`` of one layout.
_GroupQuantizer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                          tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def quantize_nvfp4(w: torch.Tensor, layout: str = "modelopt", *, device: str = "cpu",
                   amax: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Quantize a weight to NVFP4 the way the named producer computes and names it.

    ``layout="modelopt"`` (``NVFP4QTensor``): ``weight_scale_2 = amax / (6 * 448)``;
    per group ``weight_scale = fp8(clamp(group_amax / (6 * weight_scale_2), min=2**-9))`` with a
    zero group scale set to 1.0; ``code = e2m1(w / (float(weight_scale) * weight_scale_2))``.

    ``layout="compressed-tensors"`` (``generate_gparam``, ``calculate_qparams``, ``_quantize``):
    ``weight_global_scale = 6 * 448 / amax``; per group
    ``weight_scale = fp8(weight_global_scale * group_amax / 6)`` with a zero scale replaced by
    fp8's eps (0.125); ``code = e2m1(clamp(w / (float(weight_scale) / weight_global_scale),
    -6, 6))``.

    Both round to the nearest e2m1 value with ties to even. An all-zero weight gets a global
    scale of 1.0 (compressed-tensors' fallback; ModelOpt would produce NaN). All arithmetic is
    float32.

    Args:
        w: ``[out, in]`` weight (leading batch dimensions allowed), ``in`` a multiple of 16.
        layout: ``"modelopt"`` or ``"compressed-tensors"``.
        device: where the arithmetic runs. The results are on the CPU.
        amax: the magnitude the global scale is computed from instead of ``max |w|``: the
            largest of a fused group's weights (``plan.fused_groups``), at least ``max |w|``.

    Returns:
        ``{"weight": uint8, "weight_scale": float8_e4m3fn, "weight_scale_2": float32 0-dim}``
        for ModelOpt, or ``{"weight_packed": uint8, "weight_scale": float8_e4m3fn,
        "weight_global_scale": float32 [1]}`` for compressed-tensors. Keys are the suffixes
        after the module name.

    Raises:
        ValueError: unknown layout, fewer than 2 dimensions, or ``in`` not a multiple of 16.
        NonFiniteInput: ``w`` holds inf or NaN.
    """
    _check_quantize_args(w, layout)
    dev = torch_device(device)
    k = w.shape[-1]
    lead = tuple(w.shape[:-1])
    own = abs_max(w, dev)
    check_finite_amax(own, w)
    amax = own if amax is None else torch.maximum(own, amax.to(dev, torch.float32))
    modelopt = layout == "modelopt"
    if modelopt:
        global_value = _modelopt_weight_scale_2(amax, dev)
        quantize_groups = _quantize_groups_modelopt
    else:
        global_value = _compressed_tensors_global_scale(amax)
        quantize_groups = _quantize_groups_compressed_tensors

    packed, scales = _quantize_rows(w.reshape(-1, k), global_value, quantize_groups, dev)
    packed = packed.view(*lead, k // 2)
    scales = scales.view(*lead, k // NVFP4_GROUP_SIZE)
    if modelopt:
        return {"weight": packed, "weight_scale": scales,
                "weight_scale_2": global_value.reshape(()).cpu()}
    return {"weight_packed": packed, "weight_scale": scales,
            "weight_global_scale": global_value.reshape(1).cpu()}


def _quantize_rows(w2: torch.Tensor, global_value: torch.Tensor, quantize_groups: _GroupQuantizer,
                   dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The e2m1 codes (packed two per byte) and float8_e4m3fn group scales of the rows of ``w2``
    ``[rows, k]``, on the CPU, computed on ``dev`` one row chunk at a time."""
    k = w2.shape[-1]
    groups = k // NVFP4_GROUP_SIZE
    packed = torch.empty((w2.shape[0], k // 2), dtype=torch.uint8)
    scales = torch.empty((w2.shape[0], groups), dtype=torch.float8_e4m3fn)
    for r0, r1 in row_chunks(w2.shape[0], k):
        rows = r1 - r0
        x = w2[r0:r1].to(dev).to(torch.float32).view(rows, groups, NVFP4_GROUP_SIZE)
        group_amax = x.abs().amax(dim=-1)
        s_fp8, scaled, sign = quantize_groups(x, group_amax, global_value)
        codes = round_to_e2m1_codes(scaled, sign).view(rows, k)
        packed[r0:r1].copy_((codes[:, 0::2] | (codes[:, 1::2] << 4)).cpu())
        scales[r0:r1].copy_(s_fp8.cpu())
    return packed, scales


def _check_quantize_args(w: torch.Tensor, layout: str) -> None:
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'modelopt' or 'compressed-tensors', got {layout!r}")
    if w.dim() < 2:
        raise ValueError(f"NVFP4 quantization needs a weight of at least 2 dimensions "
                         f"[out, in], got shape {list(w.shape)}")
    if w.shape[-1] % NVFP4_GROUP_SIZE:
        raise ValueError(f"NVFP4 input dimension must be a multiple of {NVFP4_GROUP_SIZE}, "
                         f"got weight shape {list(w.shape)}")


# -- ModelOpt ----------------------------------------------------------------------------------

def _modelopt_weight_scale_2(amax: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``weight_scale_2 = amax / (6 * 448)``, 1.0 for an all-zero weight."""
    s2 = amax / torch.tensor(E2M1_MAX * FP8_E4M3_MAX, device=dev)
    return torch.where(s2 > 0, s2, torch.ones_like(s2))


def _quantize_groups_modelopt(x: torch.Tensor, group_amax: torch.Tensor, s2: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For float32 groups ``x`` ``[rows, groups, 16]``: their float8_e4m3fn scales, ``x`` divided
    by its scale, and the sign of each value (``< 0``, as ModelOpt tests it)."""
    s = group_amax / (E2M1_MAX * s2)
    s = torch.where(s == 0, torch.ones_like(s), s)
    s_fp8 = s.clamp_(min=2.0 ** -9).to(torch.float8_e4m3fn)
    scaled = x / (s_fp8.to(torch.float32) * s2).unsqueeze(-1)
    sign = scaled < 0
    return s_fp8, scaled, sign


# -- compressed-tensors ------------------------------------------------------------------------

def _compressed_tensors_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """``weight_global_scale = 6 * 448 / amax``, 1.0 for an all-zero weight."""
    tiny = torch.finfo(torch.float32).tiny
    gs = (FP8_E4M3_MAX * E2M1_MAX) / amax.clamp(min=tiny)
    return torch.nan_to_num(gs, nan=1.0, posinf=1.0, neginf=1.0)


def _quantize_groups_compressed_tensors(x: torch.Tensor, group_amax: torch.Tensor,
                                        gs: torch.Tensor
                                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For float32 groups ``x`` ``[rows, groups, 16]``: their float8_e4m3fn scales, ``x`` divided
    by its scale and clamped to +-6, and the sign bit of each value (so -0.0 is negative)."""
    # A 0-dim tensor divisor on the device, as compressed-tensors' ``bit_range / 2`` is: PyTorch's
    # CUDA kernel turns a Python-scalar divisor into a multiply by its float32 reciprocal, which
    # moved about 0.1% of the fp8 group scales of random weights (emulated on the CPU).
    s = gs * (group_amax / group_amax.new_tensor(E2M1_MAX))
    s = s.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    s = torch.where(s == 0, torch.full_like(s, torch.finfo(torch.float8_e4m3fn).eps), s)
    s_fp8 = s.to(torch.float8_e4m3fn)
    scaled = (x / (s / gs).unsqueeze(-1)).clamp_(-E2M1_MAX, E2M1_MAX)
    sign = torch.signbit(scaled)
    return s_fp8, scaled, sign
