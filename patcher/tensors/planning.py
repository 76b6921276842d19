"""Planning of a recipe's ``tensors:`` section: which tensors change, in which shards.

The ops run in order over a virtual view of the model's tensors (no data is read). Each output
tensor is either a byte-exact copy of a source tensor or a computation (cast, dequantize,
quantize) over named source tensors, possibly from other shards. A shard none of whose tensors
change is linked; every other shard becomes a self-contained ``ShardTask``. The index is
regenerated when anything moved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import CompanionError, InputError, PlanError
from ..model.model_dir import INDEX_NAME, ModelDir
from ..plan import Action, FilePlan
from ..recipe.regex_bound import per_name
from ..model.safetensors_io import OutputTensor, tensor_nbytes
from .schemes import (
    Fp8Block,
    QuantScheme,
    config_weight_block,
    find_scheme,
    scheme_named,
)
from .scale_planning import plan_refuse, plan_scale, plan_split
from .tasks import ShardTask, TensorJob, TensorSource, index_document

FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}


@dataclass(frozen=True)
class VirtualTensor:
    """A tensor of the planned output: its name, where it lives and how its bytes are made."""

    name: str
    shard: str
    dtype: str
    shape: tuple[int, ...]
    job: TensorJob
    order: float          # position in the shard (source position; new tensors sort after theirs)

    @property
    def changed(self) -> bool:
        return self.job.op != "copy" or self.job.inputs[0].name != self.name


def _source(model: ModelDir, name: str) -> TensorSource:
    shard = model.tensor_shards[name]
    header = model.shards[shard]
    info = header.tensors[name]
    return TensorSource(path=str(header.path), shard=shard, name=name, dtype=info.dtype,
                        shape=info.shape, offset=header.data_offset + info.start,
                        nbytes=info.nbytes)


def initial_view(model: ModelDir) -> dict[str, VirtualTensor]:
    view = {}
    for shard, info in model.tensors():
        src = _source(model, info.name)
        job = TensorJob(out=OutputTensor(info.name, info.dtype, info.shape), op="copy",
                        inputs=(src,))
        view[info.name] = VirtualTensor(info.name, shard, info.dtype, info.shape, job, info.start)
    return view


def select(view: dict[str, VirtualTensor], op) -> list[str]:
    names = []
    with per_name(f"the selection {_describe_select(op.select)}", op.loc) as clock:
        for n, t in view.items():
            clock.start(n)
            if op.select.matches(n, t.dtype):
                names.append(n)
    if not names and not op.allow_empty:
        raise PlanError(f"the selection {_describe_select(op.select)} matches no tensor",
                        where=op.loc, hint="fix the pattern, or set allow_empty: true")
    return sorted(names)


def _describe_select(sel) -> str:
    kind, patterns = ("glob", sel.globs) if sel.globs else ("regex", sel.regexes)
    text = patterns[0] if len(patterns) == 1 else list(patterns)
    dtypes = f", dtype: {list(sel.dtypes)}" if sel.dtypes else ""
    layers = f"layers: '{sel.layers[0]} {sel.layers[1]}'" if sel.layers else ""
    if sel.groups:
        layers = ", ".join(x for x in (layers, f"group: {list(sel.groups)}") if x)
    if not patterns:
        return f"{{{layers}{dtypes}}}"
    return f"{{{kind}: {text!r}{dtypes}{', ' + layers if layers else ''}}}"


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
        return device
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


def plan_tensor_ops(recipe, model: ModelDir, changes: list[dict], *, device: str = "cpu",
                    max_shard_size: int | None = None) -> TensorPlan:
    """Run the recipe's tensor ops over a virtual view of the model's tensors, then lay the
    result out in the base's shards, or in new ones of at most ``max_shard_size`` bytes."""
    device = check_device(device)
    view = initial_view(model)
    owner: dict[str, str] = {}      # tensor -> recipe line of the op that made it
    several = len({op.loc.rsplit(":", 2)[0] for op in recipe.tensors}) > 1
    for op in recipe.tensors:
        names = select(view, op)
        if several:
            _check_other_recipe(owner, names, op)
            before = dict(view)
        if op.kind == "dequantize":
            _dequantize(view, names, op, changes, _fp8_block(op, model))
        else:
            _HANDLERS[op.kind](view, names, op, changes)
        if several:
            owner.update((n, op.loc) for n, t in view.items() if before.get(n) is not t)
    if max_shard_size is None:
        files = _shard_plans(model, view, changes, device)
    else:
        from .resharding import reshard_plans

        files = reshard_plans(model, view, changes, device, max_shard_size)
    return TensorPlan(files=files, dtypes={name: t.dtype for name, t in view.items()})


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
    return {"dtype": t.dtype, "shape": list(t.shape)}


def _dropped(t: VirtualTensor, loc: str, **extra) -> dict:
    entry = {"kind": "tensor_dropped", "tensor": t.name, "dtype": t.dtype, "shape": list(t.shape),
             "shard": t.shard, "before": _layout(t), "after": None, "recipe_line": loc}
    entry.update(extra)
    return entry


def _drop(view, names, op, changes) -> None:
    for name in names:
        changes.append(_dropped(view.pop(name), op.loc))


def _rename(view, names, op, changes) -> None:
    pattern = re.compile(op.action.pattern)
    moves = {}
    with per_name(f"the rename pattern {op.action.pattern!r}", op.loc) as clock:
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
        changes.append({"kind": "tensor_renamed", "tensor": old, "to": new, "shard": t.shard,
                        "before": _layout(t), "after": _layout(t), "recipe_line": op.loc})


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
    scheme: QuantScheme = scheme_named(op.action.scheme)
    layout, block = op.action.layout, op.action.block
    for name in names:
        t = view[name]
        if t.dtype not in FLOAT_DTYPES or len(t.shape) != 2:
            raise PlanError(f"only 2-D floating-point tensors can be quantized (this is {t.dtype} "
                            f"{list(t.shape)})", where=op.loc, tensor=name)
        outputs = scheme.quantized_outputs(name, t.shape, layout, block)
        for i, (out_name, dtype, shape, role) in enumerate(outputs):
            if out_name in view and out_name != name:
                raise PlanError(f"quantizing would overwrite existing tensor {out_name!r}",
                                where=op.loc, tensor=name)
            params = (("scheme", scheme.name), ("layout", layout), ("block", block),
                      ("role", role))
            job = TensorJob(out=OutputTensor(out_name, dtype, shape), op="quantize",
                            inputs=(_primary(t, op.loc),), params=params)
            view[out_name] = replace(t, name=out_name, dtype=dtype, shape=shape, job=job,
                                     order=t.order + i * 1e-3)
        how = f"quantize:{scheme.name}"
        changes.append(_converted(name, t, outputs[0][1], t.shape, how, op.loc,
                                  added=[o[0] for o in outputs[1:]]))
        for out_name, dtype, shape, _role in outputs[1:]:
            changes.append({"kind": "tensor_added", "tensor": out_name, "companion_of": name,
                            "shard": t.shard, "reason": how, "before": None,
                            "after": {"dtype": dtype, "shape": list(shape)},
                            "recipe_line": op.loc})


def _primary(t: VirtualTensor, loc: str) -> TensorSource:
    """The bytes a computation reads: only byte-exact copies of source tensors are readable."""
    if t.job.op != "copy":
        raise PlanError("a tensor produced by an earlier operation cannot be transformed again "
                        "in the same recipe", where=loc, tensor=t.name)
    return t.job.inputs[0]


def _converted(name, t, dtype, shape, how, loc, **extra) -> dict:
    entry = {"kind": "tensor_converted", "tensor": name, "how": how, "shard": t.shard,
             "before": {"dtype": t.dtype, "shape": list(t.shape)},
             "after": {"dtype": dtype, "shape": list(shape)}, "recipe_line": loc}
    entry.update(extra)
    return entry


def _copy(view, names, op, changes) -> None:
    """Add a byte-identical copy of each selected tensor, next to it in its shard."""
    pattern = re.compile(op.action.pattern)
    with per_name(f"the copy pattern {op.action.pattern!r}", op.loc) as clock:
        copies = {}
        for n in names:
            clock.start(n)
            copies[n] = pattern.sub(op.action.to, n)
    for old, new in copies.items():
        if new == old or not new or new == "__metadata__":
            raise PlanError(f"copy would give the tensor the name {new!r}, which is its own, "
                            f"empty or reserved", where=op.loc, tensor=old)
        if new in view or list(copies.values()).count(new) > 1:
            raise PlanError(f"copy collision: {new!r} already exists or is made twice",
                            where=op.loc, tensor=old)
        t = view[old]
        _primary(t, op.loc)
        view[new] = replace(t, name=new, job=replace(t.job, out=replace(t.job.out, name=new)),
                            order=t.order + 1e-3)
        changes.append({"kind": "tensor_added", "tensor": new, "copy_of": old, "shard": t.shard,
                        "reason": "copy", "before": None, "after": _layout(t),
                        "recipe_line": op.loc})


_HANDLERS = {"drop": _drop, "rename": _rename, "copy": _copy, "cast": _cast,
             "quantize": _quantize, "split": plan_split, "scale": plan_scale,
             "refuse": plan_refuse}


# --- shards ---------------------------------------------------------------------------------

def _shard_plans(model: ModelDir, view: dict[str, VirtualTensor], changes: list[dict],
                 device: str) -> dict[str, FilePlan]:
    by_shard: dict[str, list[VirtualTensor]] = {s: [] for s in model.model_shards}
    for t in view.values():
        by_shard[t.shard].append(t)
    plans: dict[str, FilePlan] = {}
    for shard, tensors in by_shard.items():
        tensors.sort(key=lambda t: (t.order, t.name))
        header = model.shards[shard]
        original = [(i.name, i.dtype, i.shape)
                    for i in sorted(header.tensors.values(), key=lambda i: (i.start, i.name))]
        unchanged = ([(t.name, t.dtype, t.shape) for t in tensors] == original
                     and not any(t.changed for t in tensors))
        if unchanged:
            continue
        size = model.files[shard].size
        if not tensors:
            plans[shard] = FilePlan(shard, Action.DROP, source=shard, size_before=size)
            changes.append({"kind": "file_dropped", "file": shard, "reason": "no tensors left"})
            continue
        metadata = dict(header.metadata or {})
        metadata.setdefault("format", "pt")
        task = ShardTask(output=shard, metadata=metadata, jobs=tuple(t.job for t in tensors),
                         device=device)
        plans[shard] = FilePlan(shard, Action.REWRITE_SHARD, source=shard, size_before=size,
                                size_after=task.file_size, shard_task=task)
    if plans and model.index is not None:
        plans[INDEX_NAME] = _index_plan(model, view)
    return plans


def _index_plan(model: ModelDir, view: dict[str, VirtualTensor]) -> FilePlan:
    before = model.read_bytes(INDEX_NAME)
    weight_map = {t.name: t.shard for t in view.values()}
    total = sum(tensor_nbytes(t.dtype, t.shape) for t in view.values())
    after = index_document(before, str(model.root / INDEX_NAME), weight_map, total)
    return FilePlan(INDEX_NAME, Action.WRITE_JSON, source=INDEX_NAME, size_before=len(before),
                    size_after=len(after), content=after,
                    diff=_index_diff_summary(model, weight_map, total))


def _index_diff_summary(model: ModelDir, weight_map: dict[str, str], total: int) -> str:
    old = model.index.weight_map
    removed = len(set(old) - set(weight_map))
    added = len(set(weight_map) - set(old))
    moved = sum(1 for k in set(old) & set(weight_map) if old[k] != weight_map[k])
    return (f"--- a/{INDEX_NAME}\n+++ b/{INDEX_NAME}\n"
            f"@@ weight_map: {removed} removed, {added} added, {moved} moved; "
            f"total_size {model.index.total_size} -> {total} @@\n")
