"""Resharding: the output's tensors laid out again in shards of at most ``max_shard_size`` bytes.

The split is huggingface_hub's ``split_state_dict_into_shards_factory``, the one transformers'
``save_pretrained(max_shard_size=...)`` uses: tensors in model order (shard by shard, in file
order within a shard), a new shard started when the next tensor would overflow the current one,
a tensor larger than the limit alone in its own shard, and the file names transformers writes
(``model-00001-of-00004.safetensors``, or ``model.safetensors`` with no index for one shard).

Every output shard is a ``ShardTask`` whose jobs copy (or compute) tensors from any base shard;
a base shard whose name and content come out the same is linked as usual. Base shards that are
not part of the new layout are dropped (and kept as revert data like every replaced file).
"""

from __future__ import annotations

from ..errors import PlanError
from ..model.model_dir import INDEX_NAME, ModelDir
from ..model.safetensors_io import tensor_nbytes
from ..tensors.tasks import ShardTask, index_document
from ..units import parse_shard_size  # noqa: F401  (re-exported)
from .changes import Resharded
from .types import Action, FilePlan

FILENAME_PATTERN = "model{suffix}.safetensors"
MAX_SHARDS = 99999      # the width of transformers' shard numbering


def reshard_plans(model: ModelDir, view: dict, changes: list, device: str,
                  max_shard_size: int) -> dict[str, FilePlan]:
    """File plans that lay ``view`` (name -> ``VirtualTensor``) out in new shards."""
    from huggingface_hub import split_state_dict_into_shards_factory

    position = {shard: i for i, shard in enumerate(model.model_shards)}
    ordered = sorted(view.values(), key=lambda t: (position[t.shard], t.order, t.name))
    if not ordered:
        raise PlanError("nothing to reshard: the output has no tensors")
    split = split_state_dict_into_shards_factory(
        {t.name: t for t in ordered}, get_storage_size=lambda t: t.job.out.nbytes,
        filename_pattern=FILENAME_PATTERN, max_shard_size=max_shard_size)
    layout = {name: [view[n] for n in names] for name, names in split.filename_to_tensors.items()}
    if len(layout) > MAX_SHARDS:
        raise PlanError(f"max_shard_size {max_shard_size} bytes would make {len(layout)} shards "
                        f"(at most {MAX_SHARDS})", hint="choose a larger size")
    _refuse_collisions(model, layout)
    metadata = _common_metadata(model)
    plans: dict[str, FilePlan] = {}
    for name, tensors in layout.items():
        if _unchanged(model, name, tensors):
            continue
        task = ShardTask(output=name, metadata=metadata, jobs=tuple(t.job for t in tensors),
                         device=device)
        source = name if name in model.shards else None
        plans[name] = FilePlan(name, Action.REWRITE_SHARD, source=source,
                               size_before=model.files[name].size if source else None,
                               size_after=task.file_size, shard_task=task)
    for shard in model.model_shards:
        if shard not in layout:
            plans[shard] = FilePlan(shard, Action.DROP, source=shard,
                                    size_before=model.files[shard].size)
    if plans:
        plans.update(_index_plans(model, view, split.tensor_to_filename, len(layout)))
        changes.append(Resharded(max_shard_size, len(model.model_shards), len(layout)))
    return plans


def _refuse_collisions(model: ModelDir, layout: dict[str, list]) -> None:
    """A new shard name must not be a base file other than a shard of the model."""
    for name in layout:
        if model.has(name) and name not in model.model_shards:
            raise PlanError(f"resharding would write {name}, which the model has as a file that "
                            f"is not one of its shards", where=model.root / name,
                            hint="move or drop that file first")


def _unchanged(model: ModelDir, name: str, tensors: list) -> bool:
    """The base has this very shard: same name, tensors, order and bytes."""
    if name not in model.model_shards or any(t.changed for t in tensors):
        return False
    header = model.shards[name]
    original = [(i.name, i.dtype, i.shape)
                for i in sorted(header.tensors.values(), key=lambda i: (i.start, i.name))]
    return [(t.name, t.dtype, t.shape) for t in tensors] == original and all(
        t.shard == name for t in tensors)


def _common_metadata(model: ModelDir) -> dict:
    """The ``__metadata__`` entries every base shard agrees on (``format: pt`` at least)."""
    shared: dict | None = None
    for shard in model.model_shards:
        meta = dict(model.shards[shard].metadata or {})
        shared = meta if shared is None else {k: v for k, v in shared.items()
                                              if meta.get(k) == v}
    shared = dict(shared or {})
    shared.setdefault("format", "pt")
    return shared


def _index_plans(model: ModelDir, view: dict, weight_map: dict[str, str],
                 shards: int) -> dict[str, FilePlan]:
    """The index for more than one shard (regenerated, or new); none, and no file, for one."""
    has_index = model.has(INDEX_NAME)
    if shards == 1:
        if not has_index:
            return {}
        return {INDEX_NAME: FilePlan(INDEX_NAME, Action.DROP, source=INDEX_NAME,
                                     size_before=model.files[INDEX_NAME].size)}
    total = sum(tensor_nbytes(t.dtype, t.shape) for t in view.values())
    before = model.read_bytes(INDEX_NAME) if has_index else b'{"metadata": {}}\n'
    after = index_document(before, str(model.root / INDEX_NAME), weight_map, total)
    source = INDEX_NAME if has_index else None
    diff = (f"--- a/{INDEX_NAME}\n+++ b/{INDEX_NAME}\n@@ weight_map: {len(weight_map)} tensors "
            f"in {shards} shards; total_size {total} @@\n")
    return {INDEX_NAME: FilePlan(INDEX_NAME, Action.WRITE_JSON if has_index else Action.ADD,
                                 source=source, size_before=len(before) if has_index else None,
                                 size_after=len(after), content=after, diff=diff)}


__all__ = ["parse_shard_size", "reshard_plans"]
