"""The arithmetic of the ``scale`` tensor action: reciprocal, cast, reshape, each exact or
refused (``NumericError`` naming the tensor: the apply fails and writes nothing).

The steps run in this order, each on the result of the one before.

- ``reciprocal``: ``y`` is ``1/x`` rounded to nearest-even in x's dtype. It is computed in
  float64 (correctly rounded for F64) and rounded once more; for F32, F16 and BF16 inputs the
  second rounding never changes the result (a quotient of p-bit numbers rounded first to
  53 >= 2p+2 bits is rounded correctly by the second rounding), so ``y`` equals torch's
  ``1 / x`` in float32, the value compressed-tensors' ModelOpt converter and vLLM compute.
  Refused always: an input that is zero, inf or NaN, and an output that overflows to inf or
  falls to zero or a subnormal.
  ``exact`` also refuses a value that ``y`` does not give back: ``1/y`` rounded to the input
  dtype must equal ``x`` bit for bit, so the reverse conversion restores the original bytes.
  ``nearest`` accepts it (the scale then moves by at most half a unit in the last place).
- ``cast``: every value must come back bit for bit when cast back (NaN stays NaN); otherwise
  refused.
- ``reshape``: the same elements in the same order (the element count is checked at plan time).
"""

from __future__ import annotations

import torch

from ..errors import NumericError
from .tasks import TensorJob

_TORCH = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16}
_NAMES = {dtype: name for name, dtype in _TORCH.items()}


def compute_scale(job: TensorJob, x: torch.Tensor) -> torch.Tensor:
    """The output of a ``scale`` job from its source tensor ``x`` (on the CPU)."""
    x = x.cpu()
    mode = job.param("reciprocal")
    y = x if mode is None else _reciprocal(job, x, mode)
    target = _TORCH[job.param("to")]
    if target != y.dtype:
        y = _cast(job, y, target)
    return y.reshape(job.out.shape).contiguous()


def _refuse(job: TensorJob, message: str, hint: str | None = None) -> NumericError:
    src = job.inputs[0]
    return NumericError(message, where=src.shard, tensor=src.name, hint=hint)


def _example(x: torch.Tensor, bad: torch.Tensor, y: torch.Tensor | None = None) -> str:
    i = int(bad.reshape(-1).nonzero()[0])
    first = f"{float(x.reshape(-1)[i])!r}"
    return first if y is None else f"{first} -> {float(y.reshape(-1)[i])!r}"


def _cast(job: TensorJob, x: torch.Tensor, target: torch.dtype) -> torch.Tensor:
    y = x.to(target)
    back = y.to(x.dtype)
    bad = (back != x) & ~(torch.isnan(x) & torch.isnan(back))
    if bool(bad.any()):
        raise _refuse(job, f"cast to {job.param('to')} is not exact: {int(bad.sum())} of "
                      f"{x.numel()} value(s) change (e.g. {_example(x, bad, y)})",
                      hint="keep the dtype, or cast to a wider one")
    return y


def _reciprocal(job: TensorJob, x: torch.Tensor, mode: str) -> torch.Tensor:
    """1/x in x's dtype (see the module docstring)."""
    target = x.dtype
    wide = x.to(torch.float64)
    bad = ~torch.isfinite(wide) | (wide == 0)
    if bool(bad.any()):
        raise _refuse(job, f"reciprocal of {int(bad.sum())} zero, inf or NaN value(s) (e.g. "
                      f"{_example(x, bad)})", hint="a scale must be finite and non-zero")
    y = (1.0 / wide).to(target)
    tiny = torch.finfo(target).tiny
    bad = ~torch.isfinite(y) | (y.abs() < tiny)
    if bool(bad.any()):
        raise _refuse(job, f"reciprocal leaves the {_NAMES[target]} range: {int(bad.sum())} "
                      f"value(s) overflow or underflow (e.g. {_example(x, bad, y)})")
    if mode == "exact":
        back = (1.0 / y.to(torch.float64)).to(x.dtype)
        bad = back != x
        if bool(bad.any()):
            raise _refuse(job, f"reciprocal is not exact: {int(bad.sum())} of {x.numel()} "
                          f"value(s) do not come back from 1/(1/x) (e.g. "
                          f"{_example(x, bad, y)})",
                          hint="reciprocal: nearest accepts the nearest value (the reverse "
                               "conversion then restores it to within one unit in the last "
                               "place)")
    return y
