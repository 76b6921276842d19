"""Resharding a GGUF model (``--max-shard-size``): split files as gguf-py's GGUFWriter and
llama.cpp's ``gguf-split`` write them, or one merged file when the limit allows.

The conventions, from gguf-py (``GGUFWriter.add_shard_kv_data``, ``SHARD_NAME_FORMAT``):

- files ``STEM-00001-of-0000N.gguf`` (1-based in the name); a new file starts when the current
  one holds a tensor and the next tensor's bytes would take its tensor data past the limit
  (a tensor larger than the limit gets a file of its own);
- every file carries ``split.no`` (UINT16, 0-based), ``split.count`` (UINT16) and
  ``split.tensors.count`` (INT32, the whole set's); the first file also carries all the model's
  metadata, the others nothing else (so they use the default alignment, 32);
- one file: ``STEM.gguf`` without ``split.*`` keys (what gguf-py writes for one file).

Kept tensors' bytes are copied unchanged, in the model's order.
"""

from __future__ import annotations

from ..errors import PlanError
from ..gguf.files import SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS, GGUFModel
from ..gguf.format import KeyValue, encode_value
from .changes import GgufResharded
from .gguf import build_task
from .types import Action, FilePlan

SHARD_NAME = "{}-{:05d}-of-{:05d}.gguf"
DEFAULT_ALIGNMENT = 32            # GGUF_DEFAULT_ALIGNMENT
MAX_FILES = 99_999                # five digits in the name
_UINT16, _INT32 = 2, 5            # gguf.GGUFValueType


def reshard(model, gm: GGUFModel, first_kv: dict[str, KeyValue], kept: list[dict],
            renamed: dict[str, str], max_size: int, changes: list[dict],
            changed: tuple[str, ...], diff: str | None) -> dict[str, FilePlan] | None:
    """The file plans that lay ``gm`` out in files of at most ``max_size`` bytes of tensor
    data (``diff``: the metadata changes, shown on the first file); None when that layout is
    the one it has (names and tensors per file)."""
    entries = []
    for rel, header, tensors in zip(gm.files, gm.headers, kept):
        path = str(model.files[rel].path)
        entries += [(t, renamed.get(n, n), path, header.data_offset) for n, t in tensors.items()]
    groups = _group(entries, max_size)
    if len(groups) > MAX_FILES:
        raise PlanError(f"max_shard_size {max_size} bytes would make {len(groups)} GGUF files "
                        f"(at most {MAX_FILES})", hint="choose a larger size")
    stem = gm.name[:-len(".gguf")] if len(gm.files) == 1 else gm.name
    names = [f"{stem}.gguf"] if len(groups) == 1 else [
        SHARD_NAME.format(stem, i + 1, len(groups)) for i in range(len(groups))]
    if names == list(gm.files) and all(
            [e[1] for e in g] == [renamed.get(n, n) for n in k] for g, k in zip(groups, kept)):
        return None
    _refuse_collisions(model, gm, names)
    metadata = {k: v for k, v in first_kv.items() if not k.startswith("split.")}
    total = len(entries)
    plans: dict[str, FilePlan] = {}
    for i, (name, group) in enumerate(zip(names, groups)):
        kv = dict(metadata) if i == 0 else {}
        if len(groups) > 1:
            kv.update(_split_keys(i, len(groups), total))
        alignment = gm.first.alignment if i == 0 else DEFAULT_ALIGNMENT
        base = gm.headers[gm.files.index(name)] if name in gm.files else None
        task = build_task(name, kv, group, alignment, changed, base=base)
        plans[name] = FilePlan(name, Action.REWRITE_SHARD, source=name if base else None,
                               size_before=model.files[name].size if base else None,
                               size_after=task.file_size, shard_task=task,
                               diff=diff if i == 0 else None)
    for rel in gm.files:
        if rel not in plans:
            plans[rel] = FilePlan(rel, Action.DROP, source=rel, size_before=model.files[rel].size)
    changes.append(GgufResharded(max_size, list(gm.files), list(names)))
    return plans


def _group(entries: list, max_size: int) -> list[list]:
    """gguf-py's rule: a new file when the current one holds a tensor and would exceed
    ``max_size`` bytes of tensor data with the next."""
    groups: list[list] = [[]]
    size = 0
    for entry in entries:
        nbytes = entry[0].nbytes
        if groups[-1] and size + nbytes > max_size:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += nbytes
    return groups


def _split_keys(no: int, count: int, total: int) -> dict[str, KeyValue]:
    return {key: KeyValue(key, vtype, encode_value(vtype, value))
            for key, vtype, value in ((SPLIT_NO, _UINT16, no), (SPLIT_COUNT, _UINT16, count),
                                      (SPLIT_TENSORS, _INT32, total))}


def _refuse_collisions(model, gm: GGUFModel, names: list[str]) -> None:
    """A new file name must not be a base file other than one of this model's."""
    for name in names:
        if model.has(name) and name not in gm.files:
            raise PlanError(f"resharding would write {name}, which the directory has as a file "
                            "that is not part of this GGUF model", where=model.root / name,
                            hint="move that file first")
