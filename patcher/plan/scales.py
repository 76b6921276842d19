"""Planning of the ``split`` and ``scale`` tensor actions over the virtual view of
``patcher.plan.tensors`` (no data read; the values are checked when they are computed, in
``patcher.tensors.scale_math``)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

from ..errors import GuardRefused, PlanError
from ..model.safetensors_io import OutputTensor
from ..recipe.regex_bound import per_name
from ..recipe.tensor_ops.split_scale import SCALE_DTYPES
from ..tensors.tasks import TensorJob, TensorSource
from .changes import TensorAdded, TensorConverted, TensorDropped, layout


def plan_split(view: dict, names: list[str], op, changes: list) -> None:
    """Each selected tensor becomes byte-identical copies under the ``to`` names, beside it in
    its shard; the source name is removed unless one of the names is its own."""
    pattern = re.compile(op.action.pattern)
    targets: dict[str, tuple[str, ...]] = {}
    with per_name(f"the split pattern {op.action.pattern!r}", op.loc,
                  len(names)) as clock:
        for n in names:
            clock.start(n)
            targets[n] = tuple(pattern.sub(to, n) for to in op.action.to)
    made: dict[str, str] = {}
    for old, news in targets.items():
        if len(set(news)) != len(news):
            raise PlanError(f"split gives two of its parts the same name ({list(news)})",
                            where=op.loc, tensor=old)
        for new in news:
            if not new or new == "__metadata__":
                raise PlanError(f"split would name a part {new!r}, which is empty or reserved",
                                where=op.loc, tensor=old)
            if new in made or (new in view and new != old and new not in targets):
                raise PlanError(f"split collision: {new!r} already exists or is made twice",
                                where=op.loc, tensor=old)
            made[new] = old
    for old, news in targets.items():
        t = view.pop(old)
        _source(t, op.loc)
        for i, new in enumerate(news):
            view[new] = replace(t, name=new, job=replace(t.job, out=replace(t.job.out, name=new)),
                                order=t.order + i * 1e-3)
            changes.append(TensorAdded(new, t.shard, "split", _layout(t), op.loc,
                                       split_from=old))
        if old not in news:
            changes.append(TensorDropped(old, t.shard, _layout(t), op.loc, dtype=t.dtype,
                                         shape=list(t.shape), reason="split"))


def plan_refuse(view: dict, names: list[str], op, changes: list) -> None:
    """A tensor guard: refuse the model when the selection matched a tensor."""
    if names:
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        raise GuardRefused(f"the recipe refuses this model: {op.loc}: {op.action.message} "
                           f"({names[0]}{more})")


def plan_scale(view: dict, names: list[str], op, changes: list) -> None:
    """Elementwise scale math: a computed job per tensor (reshape alone too: one code path that
    checks the bytes it writes)."""
    action = op.action
    for name in names:
        t = view[name]
        if t.dtype not in SCALE_DTYPES:
            raise PlanError(f"scale math applies to {', '.join(SCALE_DTYPES)} tensors; this is "
                            f"{t.dtype}", where=op.loc, tensor=name)
        shape = t.shape if action.reshape is None else action.reshape
        if math.prod(shape) != math.prod(t.shape):
            raise PlanError(f"cannot reshape {list(t.shape)} to {list(shape)}: "
                            f"{math.prod(t.shape)} elements, not {math.prod(shape)}",
                            where=op.loc, tensor=name)
        dtype = action.cast or t.dtype
        if action.reciprocal is None and dtype == t.dtype and tuple(shape) == tuple(t.shape):
            continue
        params = (("reciprocal", action.reciprocal), ("to", dtype))
        job = TensorJob(out=OutputTensor(name, dtype, tuple(shape)), op="scale",
                        inputs=(_source(t, op.loc),), params=params)
        view[name] = replace(t, dtype=dtype, shape=tuple(shape), job=job)
        steps = [s for s in (action.reciprocal and f"reciprocal:{action.reciprocal}",
                             action.cast and f"cast:{dtype}",
                             action.reshape is not None and f"reshape:{list(shape)}") if s]
        changes.append(TensorConverted(name, "scale " + ",".join(steps), t.shard, _layout(t),
                                       layout(dtype, shape), op.loc))


def _layout(t) -> dict:
    return layout(t.dtype, t.shape)


def _source(t, loc: str) -> TensorSource:
    """The source bytes of ``t``: only a tensor that is still a byte copy can be transformed."""
    if t.job.op != "copy":
        raise PlanError("a tensor produced by an earlier operation cannot be transformed again "
                        "in the same recipe", where=loc, tensor=t.name)
    return t.job.inputs[0]
