"""The computations behind ``TensorJob``s: cast, dequantize, quantize (torch, CPU or CUDA).

No computation damages values silently: a cast or a dequantization whose finite values
overflow the output dtype to inf, and a quantization of a weight holding inf or NaN, raise
``NumericError`` naming the tensor (the apply fails and writes nothing). A NaN or inf already in
the source of a cast or a dequantization is carried through: that damage is not ours.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import NumericError
from .quant import fp8, nvfp4
from .quant.mxfp4 import dequantize_mxfp4_gpt_oss
from .quant.chunks import CHUNK_ELEMENTS
from .quant.kernel_args import NonFiniteInput
from .tasks import TensorJob

_OUT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_WIDER = {"F16": "BF16 or F32", "BF16": "F32"}


def compute(job: TensorJob, read_inputs: Callable[[], list[torch.Tensor]], cache: dict,
            device: str) -> torch.Tensor:
    """The output tensor of ``job``. ``read_inputs`` reads its source tensors, in order.

    A quantization yields a weight and its scale from one computation: the weight job computes
    both and leaves the scale in ``cache`` for the scale job that follows it in the same shard.

    Raises:
        NumericError: the values would be damaged (see the module docstring).
    """
    try:
        if job.op == "cast":
            (source,) = read_inputs()
            out = source.to(device).to(_OUT[job.param("to")]).cpu()
            _check_overflow(job, out, [source])
            return out
        if job.op == "dequantize":
            inputs = read_inputs()
            out = _dequantize(job, inputs, device)
            _check_overflow(job, out, inputs)
            return out
        if job.op == "quantize":
            return _quantize(job, read_inputs, cache, device)
    except NonFiniteInput as exc:
        raise NumericError(str(exc), where=job.inputs[0].shard, tensor=job.inputs[0].name,
                           hint="fix or restore the source weight, or leave it out of the "
                                "selection") from None
    raise ValueError(f"unknown tensor job {job.op!r}")


def _check_overflow(job: TensorJob, out: torch.Tensor, inputs: list[torch.Tensor]) -> None:
    """Refuse an output holding inf where the source values were finite: one pass over the
    output, chunk by chunk; the rest only when an inf turns up."""
    if not out.is_floating_point():
        return
    flat = out.reshape(-1)
    chunks = range(0, flat.numel(), CHUNK_ELEMENTS)
    if not any(bool(torch.isinf(flat[i:i + CHUNK_ELEMENTS]).any()) for i in chunks):
        return
    if job.op == "dequantize":
        if any(not bool(torch.isfinite(t).all()) for t in inputs[1:] if t.is_floating_point()):
            return              # an inf scale: the source is damaged already
        count = sum(int(torch.isinf(flat[i:i + CHUNK_ELEMENTS]).sum()) for i in chunks)
        detail = ""
    else:
        src = inputs[0].reshape(-1)
        count, peak = 0, 0.0
        for i in chunks:
            part = src[i:i + CHUNK_ELEMENTS]
            bad = torch.isinf(flat[i:i + CHUNK_ELEMENTS]) & torch.isfinite(part)
            if bool(bad.any()):
                count += int(bad.sum())
                peak = max(peak, float(part[bad].abs().max()))
        if not count:
            return              # infs of the source, kept as they were
        detail = f" (max |x| = {peak:.6g})"
    target = job.param("to")
    raise NumericError(f"{job.op} to {target} would overflow: {count} finite value(s) become inf"
                       f"{detail}; {target} holds at most {torch.finfo(_OUT[target]).max:.6g}",
                       where=job.inputs[0].shard, tensor=job.inputs[0].name,
                       hint=f"{job.op} to {_WIDER[target]} instead" if target in _WIDER else None)


def _dequantize(job: TensorJob, inputs: list[torch.Tensor], device: str) -> torch.Tensor:
    scheme, out = job.param("scheme"), _OUT[job.param("to")]
    if scheme == "fp8-tensor":
        weight, scale = inputs
        return fp8.dequantize_fp8_per_tensor(weight, scale, out, device=device)
    if scheme == "fp8-block":
        weight, scale_inv = inputs
        return fp8.dequantize_fp8_block(weight, scale_inv, out,
                                        block=tuple(job.param("block") or (128, 128)),
                                        device=device)
    if scheme == "nvfp4-modelopt":
        return nvfp4.dequantize_nvfp4_modelopt(*inputs, out, device=device)
    if scheme == "nvfp4-compressed-tensors":
        return nvfp4.dequantize_nvfp4_compressed_tensors(*inputs, out, device=device)
    if scheme == "mxfp4-gpt-oss":
        return dequantize_mxfp4_gpt_oss(*inputs, out, device=device)
    raise ValueError(f"unknown scheme {scheme!r}")


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
