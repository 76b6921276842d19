"""The virtual view of a model's tensors that tensor planning works on (no data is read): each
output tensor with its shard, dtype, shape and the job that makes its bytes; selecting tensors
by a recipe's ``select:``; and the view laid out in the base's shards (a shard none of whose
tensors change is linked, every other one rewritten or dropped, the index regenerated).
``resharding`` lays it out in new shards instead."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GuardRefused, PlanError
from ..model.model_dir import INDEX_NAME, ModelDir
from ..model.safetensors_io import OutputTensor, tensor_nbytes
from ..recipe.regex_bound import per_name
from ..tensors.tasks import ShardTask, TensorJob, TensorSource, index_document
from .changes import FileDropped
from .types import Action, FilePlan


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
    with per_name(f"the selection {_describe_select(op.select)}", op.loc,
                  len(view)) as clock:
        for n, t in view.items():
            clock.start(n)
            if op.select.matches(n, t.dtype):
                names.append(n)
    if not names and op.refuse_empty:
        raise GuardRefused(f"the recipe refuses this model: {op.loc}: {op.refuse_empty}")
    if not names and not op.allow_empty:
        raise PlanError(f"the selection {_describe_select(op.select)} matches no tensor",
                        where=op.loc, hint="fix the pattern, or set allow_empty: true")
    return sorted(names)


def refuse_unless_equal(view: dict[str, VirtualTensor], names: list[str], op) -> None:
    """The guard ``refuse_unless_equal: OTHER``: every selected tensor, as the model stores it,
    has OTHER's dtype, shape and bytes, else the recipe refuses the model (exit 1). The bytes
    are compared in chunks, straight from the shards."""
    other = view.get(op.refuse_unless_equal)
    for name in names:
        why = _difference(view[name], other, op.refuse_unless_equal)
        if why:
            raise GuardRefused(f"the recipe refuses this model: {op.loc}: {name} {why}")


def _difference(t: VirtualTensor, other: VirtualTensor | None, other_name: str) -> str | None:
    if other is None:
        return f"cannot be compared: the model has no tensor {other_name}"
    if t.changed or other.changed:
        return f"cannot be compared with {other_name}: an earlier operation changed one of them"
    if (t.dtype, t.shape) != (other.dtype, other.shape):
        return (f"({t.dtype} {list(t.shape)}) differs from {other_name} "
                f"({other.dtype} {list(other.shape)})")
    a, b = t.job.inputs[0], other.job.inputs[0]
    if a.path == b.path and a.offset == b.offset:
        return None
    chunk = 16 << 20
    with open(a.path, "rb") as fa, open(b.path, "rb") as fb:
        fa.seek(a.offset)
        fb.seek(b.offset)
        for start in range(0, a.nbytes, chunk):
            n = min(chunk, a.nbytes - start)
            if fa.read(n) != fb.read(n):
                return f"differs from {other_name} in value"
    return None


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


# --- shards ---------------------------------------------------------------------------------

def shard_plans(model: ModelDir, view: dict[str, VirtualTensor], changes: list,
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
            changes.append(FileDropped(shard, reason="no tensors left"))
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
