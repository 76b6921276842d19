"""Planning of a recipe's ``tensors:`` section: which tensors change, in which shards.

The ops run in order over a virtual view of the model's tensors (no data is read). Each output
tensor is either a byte-exact copy of a source tensor or a computation (cast, dequantize,
quantize) over named source tensors, possibly from other shards. A shard none of whose tensors
change is linked; every other shard becomes a self-contained ``ShardTask``. The index is
regenerated when anything moved.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

from ..errors import CompanionError, GuardRefused, InputError, NotThisScheme, PlanError
from ..model.model_dir import ModelDir
from ..model.safetensors_io import OutputTensor
from ..recipe.regex_bound import per_name
from ..tensors.schemes import (
    Fp8Block,
    QuantScheme,
    config_weight_block,
    find_scheme,
    scheme_named,
)
from ..tensors.tasks import TensorJob, TensorSource
from ..units import human_bytes
from .changes import TensorAdded, TensorConverted, TensorDropped, TensorRenamed
from .changes import layout as change_layout
from .fused_groups import fused_peers
from .scales import plan_refuse, plan_scale, plan_split
from .tensor_view import VirtualTensor, initial_view, refuse_unless_equal, select, shard_plans
from .types import FilePlan

FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}


def check_device(device: str | None) -> str:
    """The device the kernels will run on, checked now: asking for one that this machine lacks
    fails here, at plan time, not in the middle of writing shards."""
    device = device or "cpu"
    if device == "cpu":
        return device
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise InputError(f"device={device!r} is not a device torch knows",
                         hint="use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return "cpu"            # cpu:0 is the same device; the shard writer tests for "cpu"
    if dev.type == "meta":
        raise InputError(f"--device {device}: a meta tensor holds no data, so nothing can be "
                         f"computed on it", hint="use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise InputError(f"device={device!r}: CUDA is not available ({why}; torch "
                             f"{torch.__version__})", hint="use device='cpu'")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise InputError(f"device={device!r}: there are only {count} CUDA device(s)",
                             hint=f"use cuda:0 to cuda:{count - 1}")
        return device
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError) as exc:
        raise InputError(f"device={device!r}: not usable here ({str(exc).splitlines()[0]})",
                         hint="use device='cpu'") from None
    return device


@dataclass(frozen=True)
class TensorPlan:
    files: dict[str, FilePlan]      # every shard that changes (rewrite or drop), and the index
    dtypes: dict[str, str]          # every output tensor's dtype


def plan_tensor_ops(recipe, model: ModelDir, changes: list, *, device: str = "cpu",
                    max_shard_size: int | None = None) -> TensorPlan:
    """Run the recipe's tensor ops over a virtual view of the model's tensors, then lay the
    result out in the base's shards, or in new ones of at most ``max_shard_size`` bytes."""
    device = check_device(device)
    view = initial_view(model)
    owner: dict[str, str] = {}      # tensor -> recipe line of the op that made it
    several = len({op.loc.rsplit(":", 2)[0] for op in recipe.tensors}) > 1
    copies = CopyBudget(view)
    for op in recipe.tensors:
        names = select(view, op)
        if op.refuse_unless_equal is not None:
            refuse_unless_equal(view, names, op)
        if several:
            _check_other_recipe(owner, names, op)
            before = dict(view)
        copies.charge(view, names, op)
        if op.kind == "dequantize":
            _dequantize(view, names, op, changes, _fp8_block(op, model))
        else:
            _HANDLERS[op.kind](view, names, op, changes)
        if several:
            owner.update((n, op.loc) for n, t in view.items() if before.get(n) is not t)
    if max_shard_size is None:
        files = shard_plans(model, view, changes, device)
    else:
        from .resharding import reshard_plans

        files = reshard_plans(model, view, changes, device, max_shard_size)
    return TensorPlan(files=files, dtypes={name: t.dtype for name, t in view.items()})


#: ``copy:`` and ``split:`` add byte-identical tensors: together, in one plan, they may add at
#: most this many times the base's tensor bytes (the output at most twice the base), and as
#: many tensors as the base has (at least ``MIN_COPY_COUNT``)
MAX_COPY_GROWTH = 1.0
MIN_COPY_COUNT = 64


class CopyBudget:
    """What ``copy:`` and ``split:`` have added to the plan, against the base's size."""

    KINDS = ("copy", "split")

    def __init__(self, view: dict[str, VirtualTensor]):
        self.base_bytes = sum(t.job.inputs[0].nbytes for t in view.values())
        self.base_count = len(view)
        self.bytes = self.count = 0

    def charge(self, view: dict[str, VirtualTensor], names: list[str], op) -> None:
        """Count what ``op`` will add, before it makes a tensor: a ``copy:`` one copy of each
        selected tensor, a ``split:`` one part less than it has names (its source's name is
        reused or removed); ``PlanError`` naming the op's line and the budget once the plan's
        copies pass it. Other ops add nothing here."""
        if op.kind not in self.KINDS:
            return
        parts = 1 if op.kind == "copy" else len(op.action.to) - 1
        self.count += parts * len(names)
        self.bytes += parts * sum(view[n].job.inputs[0].nbytes for n in names)
        max_bytes = MAX_COPY_GROWTH * self.base_bytes
        max_count = max(MAX_COPY_GROWTH * self.base_count, MIN_COPY_COUNT)
        if self.bytes > max_bytes or self.count > max_count:
            raise PlanError(
                f"copy: and split: would add {human_bytes(self.bytes)} in {self.count:,} tensors "
                f"to a base of {human_bytes(self.base_bytes)} in {self.base_count:,}; the copy "
                f"budget is {MAX_COPY_GROWTH:g}x the base's tensor bytes and count (the output "
                "at most twice the base)", where=op.loc)


def _check_other_recipe(owner: dict[str, str], names: list[str], op) -> None:
    """Refuse an op on a tensor another recipe (of several applied together) already changed;
    within one recipe, later ops may build on earlier ones."""
    source = op.loc.rsplit(":", 2)[0]
    for name in names:
        other = owner.get(name)
        if other is not None and other.rsplit(":", 2)[0] != source:
            raise PlanError(f"two recipes change the same tensor (the other operation is at "
                            f"{other})", where=op.loc, tensor=name,
                            hint="apply them one after the other")


def _fp8_block(op, model: ModelDir) -> Fp8Block:
    """The block size an fp8-block dequantization assumes: the recipe's ``block``, else the
    base config's ``weight_block_size``, else 128x128."""
    if op.action.block is not None:
        return Fp8Block(op.action.block, "from the recipe")
    try:
        declared = config_weight_block(model.json("config.json")
                                       if model.has("config.json") else None)
    except ValueError as exc:
        raise PlanError(str(exc), where=op.loc,
                        hint="set block: [BM, BN] in the dequantize action") from None
    return Fp8Block(*declared) if declared else Fp8Block()


# --- operations -----------------------------------------------------------------------------

def _layout(t) -> dict:
    return change_layout(t.dtype, t.shape)


def _dropped(t: VirtualTensor, loc: str, **extra) -> TensorDropped:
    return TensorDropped(t.name, t.shard, _layout(t), loc, dtype=t.dtype, shape=list(t.shape),
                         **extra)


def _drop(view, names, op, changes) -> None:
    for name in names:
        changes.append(_dropped(view.pop(name), op.loc))


def _rename(view, names, op, changes) -> None:
    pattern = re.compile(op.action.pattern)
    moves = {}
    with per_name(f"the rename pattern {op.action.pattern!r}", op.loc,
                  len(names)) as clock:
        for n in names:
            clock.start(n)
            moves[n] = pattern.sub(op.action.to, n)
    moves = {a: b for a, b in moves.items() if a != b}
    targets: dict[str, str] = {}
    for old, new in moves.items():
        if not new or new == "__metadata__":
            raise PlanError(f"rename would give the tensor the name {new!r}, which is empty or "
                            f"reserved", where=op.loc, tensor=old)
        if new in targets:
            raise PlanError(f"rename collision: {targets[new]!r} and {old!r} both become {new!r}",
                            where=op.loc, tensor=old)
        if new in view and new not in moves:
            raise PlanError(f"rename collision: becomes {new!r}, which already exists",
                            where=op.loc, tensor=old)
        targets[new] = old
    renamed = {old: view.pop(old) for old in moves}
    for old, t in renamed.items():
        new = moves[old]
        view[new] = replace(t, name=new, job=replace(t.job, out=replace(t.job.out, name=new)))
        changes.append(TensorRenamed(old, new, t.shard, _layout(t), _layout(t), op.loc))


def _cast(view, names, op, changes) -> None:
    target = op.action.to
    for name in names:
        t = view[name]
        if t.dtype.startswith("F8"):
            raise PlanError(f"cannot cast {t.dtype} to {op.action.to}: FP8 data needs its scale; "
                            f"use dequantize", where=op.loc, tensor=name)
        if t.dtype not in FLOAT_DTYPES:
            raise PlanError(f"cannot cast {t.dtype} to {op.action.to}: only floating-point "
                            f"tensors can be cast", where=op.loc, tensor=name)
        if t.dtype == target:
            continue
        job = TensorJob(out=OutputTensor(name, target, t.shape), op="cast",
                        inputs=(_primary(t, op.loc),), params=(("to", target),))
        view[name] = replace(t, dtype=target, job=job)
        changes.append(_converted(name, t, target, t.shape, "cast", op.loc))


def _dequantize(view, names, op, changes, fp8_block: Fp8Block) -> None:
    target = op.action.to
    consumed = _companions_of_selected(view, names, op, fp8_block)
    for name in names:
        if name in consumed or name not in view:
            continue        # a scale (or other companion) of a selected weight: used up with it
        t = view[name]
        try:
            scheme, parts = _scheme_parts(view, name, op, fp8_block)
        except CompanionError as exc:
            raise PlanError(str(exc), where=op.loc, tensor=name) from None
        out_name = parts.output_name
        if out_name != name and out_name in view:
            raise PlanError(f"its dequantized output {out_name!r} already exists",
                            where=op.loc, tensor=name)
        inputs = (_primary(t, op.loc),) + tuple(_primary(view[c], op.loc) for c in parts.inputs)
        params = (("scheme", scheme.name), ("to", target))
        if scheme.name == Fp8Block.name:
            params += (("block", fp8_block.block),)
        job = TensorJob(out=OutputTensor(out_name, target, parts.shape), op="dequantize",
                        inputs=inputs, params=params)
        how = f"dequantize:{scheme.name}"
        removed = list(parts.inputs + parts.dropped)
        view.pop(name)
        view[out_name] = replace(t, name=out_name, dtype=target, shape=parts.shape, job=job)
        changes.append(_converted(name, t, target, parts.shape, how, op.loc, removed=removed,
                                  **({"to": out_name} if out_name != name else {})))
        for gone in removed:
            changes.append(_dropped(view.pop(gone), op.loc, companion_of=name, reason=how))


def _scheme_parts(view, name: str, op, fp8_block: Fp8Block):
    scheme = (find_scheme(name, view, fp8_block) if op.action.scheme == "auto"
              else scheme_named(op.action.scheme, fp8_block))
    return scheme, scheme.companions(name, view)


def _companions_of_selected(view, names, op, fp8_block: Fp8Block) -> set[str]:
    """Tensors a selected weight's dequantization consumes (its scales, dropped companions): a
    selection such as ``mlp.down_proj.*`` holds them too, and they are not weights themselves."""
    consumed: set[str] = set()
    for name in names:
        try:
            _scheme, parts = _scheme_parts(view, name, op, fp8_block)
        except CompanionError:
            continue        # not a weight of the scheme; reported below unless consumed
        consumed.update(parts.inputs + parts.dropped)
    return consumed


def _quantize(view, names, op, changes) -> None:
    """Each selected weight becomes the tensors its scheme writes: the quantized weight (under
    the weight's name, or a new one such as NVFP4's ``weight_packed``) and its scales."""
    scheme: QuantScheme = scheme_named(op.action.scheme)
    layout, block = op.action.layout, op.action.block
    peers = fused_peers(names) if scheme.fused_scale else {}
    peer_sources = {n: _primary(view[n], op.loc) for group in peers.values() for n in group}
    for name in names:
        t = view[name]
        if t.dtype not in FLOAT_DTYPES or len(t.shape) != 2:
            raise PlanError(f"only 2-D BF16, F16, F32 or F64 weights can be quantized (this is "
                            f"{t.dtype} {list(t.shape)})", where=op.loc, tensor=name)
        try:
            outputs = scheme.quantized_outputs(name, t.shape, layout, block)
        except NotThisScheme as exc:        # its name: the selection's fault
            raise PlanError(f"cannot be quantized to {scheme.name}: {exc}", where=op.loc,
                            tensor=name) from None
        except CompanionError as exc:       # its shape: the model does not fit the scheme
            raise GuardRefused(f"the recipe refuses this model: it cannot be quantized to "
                               f"{scheme.name}: {exc}", where=op.loc, tensor=name) from None
        for out_name, *_ in outputs:
            if out_name in view and out_name != name:
                raise PlanError(f"quantizing would overwrite existing tensor {out_name!r}",
                                where=op.loc, tensor=name)
        sources = (_primary(t, op.loc),) + tuple(peer_sources[n] for n in peers.get(name, ()))
        view.pop(name)
        for i, (out_name, dtype, shape, role) in enumerate(outputs):
            params = (("scheme", scheme.name), ("layout", layout), ("block", block),
                      ("role", role))
            job = TensorJob(out=OutputTensor(out_name, dtype, shape), op="quantize",
                            inputs=sources, params=params)
            view[out_name] = replace(t, name=out_name, dtype=dtype, shape=shape, job=job,
                                     order=t.order + i * 1e-3)
        how = f"quantize:{scheme.name}"
        out_name, dtype, shape, _role = outputs[0]
        changes.append(_converted(name, t, dtype, shape, how, op.loc,
                                  added=[o[0] for o in outputs[1:]],
                                  **({"to": out_name} if out_name != name else {})))
        for out_name, dtype, shape, _role in outputs[1:]:
            changes.append(TensorAdded(out_name, t.shard, how, change_layout(dtype, shape), op.loc,
                                       companion_of=name))


def _primary(t: VirtualTensor, loc: str) -> TensorSource:
    """The bytes a computation reads: only byte-exact copies of source tensors are readable."""
    if t.job.op != "copy":
        raise PlanError("a tensor produced by an earlier operation cannot be transformed again "
                        "in the same recipe", where=loc, tensor=t.name)
    return t.job.inputs[0]


def _converted(name, t, dtype, shape, how, loc, **extra) -> TensorConverted:
    return TensorConverted(name, how, t.shard, _layout(t), change_layout(dtype, shape), loc,
                           **extra)


def _copy(view, names, op, changes) -> None:
    """Add a byte-identical copy of each selected tensor, next to it in its shard."""
    pattern = re.compile(op.action.pattern)
    with per_name(f"the copy pattern {op.action.pattern!r}", op.loc,
                  len(names)) as clock:
        copies = {}
        for n in names:
            clock.start(n)
            copies[n] = pattern.sub(op.action.to, n)
    made = Counter(copies.values())
    for old, new in copies.items():
        if new == old or not new or new == "__metadata__":
            raise PlanError(f"copy would give the tensor the name {new!r}, which is its own, "
                            f"empty or reserved", where=op.loc, tensor=old)
        if new in view or made[new] > 1:
            raise PlanError(f"copy collision: {new!r} already exists or is made twice",
                            where=op.loc, tensor=old)
        t = view[old]
        _primary(t, op.loc)
        view[new] = replace(t, name=new, job=replace(t.job, out=replace(t.job.out, name=new)),
                            order=t.order + 1e-3)
        changes.append(TensorAdded(new, t.shard, "copy", _layout(t), op.loc, copy_of=old))


_HANDLERS = {"drop": _drop, "rename": _rename, "copy": _copy, "cast": _cast,
             "quantize": _quantize, "split": plan_split, "scale": plan_scale,
             "refuse": plan_refuse}
