"""The computations behind ``TensorJob``s: cast, dequantize, quantize (torch, CPU or CUDA).

No computation damages values silently: a cast or a dequantization whose finite values
overflow the output dtype to inf, and a quantization of a weight holding inf or NaN, raise
``NumericError`` naming the tensor (the apply fails and writes nothing). A NaN or inf already in
the source of a cast or a dequantization is carried through: that damage is not ours.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..errors import NumericError
from . import scale_math
from .quant.kernel_args import CHUNK_ELEMENTS, NonFiniteInput, abs_max, torch_device
from .schemes import SCHEMES, QuantScheme
from .tasks import TensorJob

_OUT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_WIDER = {"F16": "BF16 or F32", "BF16": "F32"}


def compute(job: TensorJob, read_inputs: Callable[[], list[torch.Tensor]], cache: dict,
            device: str, host_inputs: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The output tensor of ``job``. ``read_inputs`` reads its source tensors, in order. A cast
    or a dequantization leaves it on ``device`` (the caller copies it back as it sees fit); a
    quantization returns it on the CPU. ``host_inputs``: the same sources in host memory when
    ``read_inputs`` gives them on a GPU; the overflow bound reads its scales there, instead of
    waiting for the GPU once per tensor.

    A quantization yields a weight and its scales from one computation: the weight job computes
    them all and leaves the scales in ``cache`` for the scale jobs that follow it in the same
    shard.

    Raises:
        NumericError: the values would be damaged (see the module docstring).
    """
    try:
        if job.op == "cast":
            (source,) = read_inputs()
            out = source.to(device).to(_OUT[job.param("to")])
            _check_overflow(job, out, [source])
            return out
        if job.op == "dequantize":
            inputs = read_inputs()
            out = _dequantize(job, inputs, device)
            _check_overflow(job, out, inputs, host_inputs)
            return out
        if job.op == "quantize":
            return _quantize(job, read_inputs, cache, device)
        if job.op == "scale":
            return scale_math.compute_scale(job, read_inputs()[0])
    except NonFiniteInput as exc:
        raise NumericError(str(exc), where=job.inputs[0].shard, tensor=job.inputs[0].name,
                           hint="fix or restore the source weight, or leave it out of the "
                                "selection") from None
    raise ValueError(f"unknown tensor job {job.op!r}")


def _check_overflow(job: TensorJob, out: torch.Tensor, inputs: list[torch.Tensor],
                    host_inputs: list[torch.Tensor] | None = None) -> None:
    """Refuse an output holding inf where the source values were finite: one pass over the
    output, chunk by chunk; the rest only when an inf turns up. A dequantization's bound is
    taken from ``host_inputs`` when given (the same values, in host memory)."""
    if not out.is_floating_point():
        return
    if job.op == "dequantize" and _cannot_overflow(job, host_inputs or inputs, out.dtype):
        return
    flat = out.reshape(-1)
    chunks = range(0, flat.numel(), CHUNK_ELEMENTS)
    if not any(bool(torch.isinf(flat[i:i + CHUNK_ELEMENTS]).any()) for i in chunks):
        return
    if job.op == "dequantize":
        for ref, scale in zip(job.inputs[1:], inputs[1:]):
            if scale.is_floating_point() and scale.numel() and not math.isfinite(_abs_max(scale)):
                raise NumericError(f"cannot dequantize: its scale {ref.name!r} holds inf or NaN, "
                                   "so every value it scales would be inf or NaN",
                                   where=job.inputs[0].shard, tensor=job.inputs[0].name,
                                   hint="the checkpoint is damaged; restore the scale from the "
                                        "original export")
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


# Largest magnitude of a code of each quantized weight dtype (e4m3fn has no inf; NVFP4 codes are
# uint8 pairs of e2m1 values, at most 6).
_CODE_MAX = {torch.float8_e4m3fn: 448.0, torch.uint8: 6.0}


def _cannot_overflow(job: TensorJob, inputs: list[torch.Tensor], out: torch.dtype) -> bool:
    """True when no output value can be inf: the largest code times the largest scale (and the
    second-level scale, or divided by the global scale), in float64, is under half the range of
    the output and of every scale dtype the product may be computed in (half: room for the
    rounding of the steps). A bound from the small scale tensors, instead of a pass over the
    whole output."""
    code_max = _CODE_MAX.get(inputs[0].dtype)
    if code_max is None:
        return False
    limit, bound = torch.finfo(out).max, code_max
    for i, scale in enumerate(inputs[1:], start=1):
        if not scale.is_floating_point() or not scale.numel():
            return False
        if scale.element_size() >= 2:            # float8 scales are widened before any product
            limit = min(limit, torch.finfo(scale.dtype).max)
        if _scheme(job).global_divides and i == 2:
            low = float(scale.abs().min())
            bound = bound / low if low > 0 else float("inf")      # the global scale divides
        else:
            bound *= _abs_max(scale)
        if not bound < float("inf"):              # inf or NaN
            return False
    return bound <= limit / 2


def _abs_max(t: torch.Tensor) -> float:
    """max |t| as a float (inf or NaN if ``t`` holds one). float8 has no max kernel on the CPU,
    and its magnitudes order as their 7 low bits, NaN codes above infinities above finite."""
    if t.element_size() == 1:
        code = (t.reshape(-1).view(torch.uint8) & 0x7F).max().reshape(1).cpu()
        return float(code.view(t.dtype).to(torch.float32))
    return float(t.abs().max())


def _scheme(job: TensorJob) -> QuantScheme:
    scheme = SCHEMES.get(job.param("scheme"))
    if scheme is None:
        raise ValueError(f"unknown scheme {job.param('scheme')!r}")
    return scheme


def _dequantize(job: TensorJob, inputs: list[torch.Tensor], device: str) -> torch.Tensor:
    return _scheme(job).dequantize(inputs, _OUT[job.param("to")], device,
                                   block=job.param("block"))


def _quantize(job: TensorJob, read_inputs, cache: dict, device: str) -> torch.Tensor:
    """The weight job (role ``weight``) leaves the other outputs (its scales) in ``cache`` for
    the jobs that follow it in the same shard; a scale job that finds none (run alone, or on
    another worker) computes them again. The sources after the weight are the other members of
    its fused group (``plan.fused_groups``), read for their magnitude only."""
    key, role = job.inputs[0].name, job.param("role")
    kept = cache.get(key)
    if role != "weight" and kept is not None and role in kept:
        out = kept.pop(role)
        if not kept:
            del cache[key]
        return out.reshape(job.out.shape)
    weight, *peers = read_inputs()
    amax = None
    if peers:                       # a fused layer's members share the scale of the largest
        amax = torch.stack([abs_max(p, torch_device(device)) for p in peers]).max()
    outputs = _scheme(job).quantize(weight, device, block=job.param("block"), amax=amax)
    out = outputs.pop(role)
    if role == "weight":
        cache[key] = outputs
    return out.reshape(job.out.shape)
