"""The computations behind ``TensorJob``s: cast, dequantize, quantize (torch, CPU or CUDA)."""

from __future__ import annotations

from typing import Callable

import torch

from .quant import fp8, nvfp4
from .tensor_tasks import TensorJob

_OUT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def compute(job: TensorJob, read_inputs: Callable[[], list[torch.Tensor]], cache: dict,
            device: str) -> torch.Tensor:
    """The output tensor of ``job``. ``read_inputs`` reads its source tensors, in order.

    A quantization yields a weight and its scale from one computation: the weight job computes
    both and leaves the scale in ``cache`` for the scale job that follows it in the same shard.
    """
    if job.op == "cast":
        (source,) = read_inputs()
        return source.to(device).to(_OUT[job.param("to")]).cpu()
    if job.op == "dequantize":
        return _dequantize(job, read_inputs(), device)
    if job.op == "quantize":
        return _quantize(job, read_inputs, cache, device)
    raise ValueError(f"unknown tensor job {job.op!r}")


def _dequantize(job: TensorJob, inputs: list[torch.Tensor], device: str) -> torch.Tensor:
    scheme, out = job.param("scheme"), _OUT[job.param("to")]
    if scheme == "fp8-tensor":
        weight, scale = inputs
        return fp8.dequantize_fp8_per_tensor(weight, scale, out,
                                             layout=_fp8_layout(scale, "modelopt"), device=device)
    if scheme == "fp8-block":
        weight, scale_inv = inputs
        return fp8.dequantize_fp8_block(weight, scale_inv, out,
                                        layout=_fp8_layout(scale_inv, "deepseek"), device=device)
    if scheme == "nvfp4-modelopt":
        return nvfp4.dequantize_nvfp4_modelopt(*inputs, out, device=device)
    if scheme == "nvfp4-compressed-tensors":
        return nvfp4.dequantize_nvfp4_compressed_tensors(*inputs, out, device=device)
    raise ValueError(f"unknown scheme {scheme!r}")


def _fp8_layout(scale: torch.Tensor, float32_layout: str) -> str:
    """FP8 scales in float32 (ModelOpt, DeepSeek): the product in float32, rounded once. Scales
    in bfloat16/float16 come from compressed-tensors, which multiplies in the scale's dtype:
    mirrored, so the result equals its decompression bit for bit."""
    return float32_layout if scale.dtype == torch.float32 else "compressed-tensors"


def _quantize(job: TensorJob, read_inputs, cache: dict, device: str) -> torch.Tensor:
    """The weight job leaves its scale in ``cache`` for the scale job that follows it in the same
    shard; a scale job that finds none (run alone, or on another worker) computes it again."""
    key = job.inputs[0].name
    if job.param("role") == "scale" and key in cache:
        return cache.pop(key).reshape(job.out.shape)
    (weight,) = read_inputs()
    if job.param("scheme") == "fp8-block":
        q, scale = fp8.quantize_fp8_block(weight, tuple(job.param("block") or (128, 128)),
                                          device=device)
    else:
        q, scale = fp8.quantize_fp8_per_tensor(weight, device=device)
    if job.param("role") == "scale":
        return scale.reshape(job.out.shape)
    cache[key] = scale
    return q
