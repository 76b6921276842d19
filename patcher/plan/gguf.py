"""Planning a recipe's ``gguf:`` section: metadata edits and tensor drops/renames per file.

Metadata ops apply to the file that holds the model's metadata (the single file, or the first
file of a split set); tensor ops to every file. A file is rewritten only if something in it
changes; kept tensor data is copied byte for byte (no requantization).
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections import Counter
from dataclasses import replace

from ..errors import GuardRefused, PlanError
from ..gguf.files import SPLIT_TENSORS, GGUFModel, gguf_models
from ..gguf.format import ARRAY, STRING, KeyValue, TensorInfo, encode_header, encode_value, layout
from ..gguf.header_inplace import refusal
from ..gguf.readback import check_header
from ..gguf.task import GGUFTask
from ..recipe.gguf_section import GGUFSection, TensorOp
from ..recipe.regex_bound import per_name
from .changes import GgufMetadata, TensorDropped, TensorRenamed
from .changes import layout as change_layout
from .gguf_metadata import apply_meta_op, arch_key, check_rope_known, describe
from .types import Action, FilePlan

_BLOCK = re.compile(r"blk\.(\d+)\.")


def plan_gguf(recipe, model, changes: list, max_shard_size: int | None = None,
              in_place: bool = False) -> dict[str, FilePlan]:
    section: GGUFSection = recipe.gguf
    # A multimodal projector (mmproj) or a LoRA adapter beside the model is not the model:
    # general.type says which is which (gguf-py's GGUFType), and recipes leave those alone.
    models = [gm for gm in gguf_models(model) if gm.first.get("general.type") in (None, "model")]
    if not models:
        raise GuardRefused(f"recipe {recipe.name!r} refuses this model: {model.root}: the "
                           "recipe has a gguf: section but the model has no .gguf model file "
                           "(mmproj and adapter files are left alone)")
    if model.shards:
        max_shard_size = None       # safetensors beside: --max-shard-size reshards those
    out: dict[str, FilePlan] = {}
    for gm in models:
        out.update(_plan_model(recipe, section, model, gm, changes, max_shard_size, in_place))
    return out


def _plan_model(recipe, section: GGUFSection, model, gm: GGUFModel, changes,
                max_shard_size: int | None, in_place: bool = False) -> dict:
    arch = gm.architecture
    if arch is None:
        raise PlanError("general.architecture is missing or not a string",
                        where=model.root / gm.files[0])
    for op in section.metadata:
        if ".rope.scaling." in op.key:
            check_rope_known(gm.first.kv, arch, op.loc)
    _check_guards(recipe, section, gm, arch)
    first_kv = dict(gm.first.kv)
    meta_lines: list[str] = []
    for op in section.metadata:
        apply_meta_op(op, first_kv, arch, recipe, model, meta_lines, changes, gm.files[0])
    kept = [dict(h.tensors) for h in gm.headers]
    renamed: dict[str, str] = {}
    if section.strip_nextn:
        _strip_nextn(recipe, gm, arch, first_kv, kept, changes, meta_lines, section.loc)
    block_count = first_kv.get(f"{arch}.block_count")
    for op in section.tensors:
        _tensor_op(op, gm, kept, renamed, block_count.value if block_count else None, changes)
    if max_shard_size:
        from .gguf_reshard import reshard

        plans = reshard(model, gm, first_kv, kept, renamed, max_shard_size, changes,
                        tuple(f"rename {old} -> {new}" for old, new in renamed.items()),
                        "".join(meta_lines) or None)
        if plans is not None:
            return plans
    kvs = [first_kv] + [dict(h.kv) for h in gm.headers[1:]]
    if len(gm.headers) > 1:
        _count_split_tensors(kvs, sum(len(k) for k in kept), changes, section.loc)
    plans = {}
    for i, (rel, header) in enumerate(zip(gm.files, gm.headers)):
        if kvs[i] == header.kv and list(kept[i]) == list(header.tensors) and not any(
                n in renamed for n in kept[i]):
            continue
        task = _task(model, rel, header, kvs[i], kept[i], renamed)
        if in_place:
            task = _in_place_header(task, model.files[rel], header)
        lines = (meta_lines if i == 0 else []) + [
            f"# {rel}: {note}\n" for note in task.changed if note.startswith("header ")]
        plans[rel] = FilePlan(rel, Action.REWRITE_SHARD, source=rel,
                              size_before=header.file_size, size_after=task.file_size,
                              diff="".join(lines) or None, shard_task=task)
    return plans


def _in_place_header(task: GGUFTask, model_file, header) -> GGUFTask:
    """With --in-place: the task writing only the header region, when it may
    (``patcher.gguf.header_inplace``); else the same task, its note saying why not."""
    if not any(note.startswith("header fits") for note in task.changed):
        return task
    why = refusal(model_file, task, header.data_offset, header.file_size)
    if why is None:
        check_header(task.header, header, model_file.path)
        note = f"header rewritten in place ({len(task.header)} bytes)"
        return replace(task, changed=task.changed + (note,), header_in_place=True)
    note = f"header not rewritten in place: {why}; the whole file is rewritten"
    return replace(task, changed=task.changed + (note,))


def _count_split_tensors(kvs: list[dict[str, KeyValue]], total: int, changes: list,
                         loc: str) -> None:
    """Every file of a split set says how many tensors the set holds."""
    before = kvs[0][SPLIT_TENSORS]
    if before.value == total:
        return
    for kv in kvs:
        kv[SPLIT_TENSORS] = KeyValue(SPLIT_TENSORS, before.vtype,
                                     encode_value(before.vtype, total))
    changes.append(GgufMetadata("set", SPLIT_TENSORS, loc, before=before.value, after=total))


def _task(model, rel: str, header, kv: dict[str, KeyValue], kept: dict[str, TensorInfo],
          renamed: dict[str, str]) -> GGUFTask:
    path = str(model.files[rel].path)
    entries = [(t, renamed.get(n, n), path, header.data_offset) for n, t in kept.items()]
    changed = tuple(f"rename {old} -> {new}" for old, new in renamed.items() if old in kept)
    return build_task(rel, kv, entries, header.alignment, changed, base=header)


def build_task(rel: str, kv: dict[str, KeyValue], entries: list, alignment: int,
               changed: tuple[str, ...] = (), base=None) -> GGUFTask:
    """The task writing ``rel``: ``kv``, then each entry's tensor (``(TensorInfo in its
    source, name in the output, source path, source's data offset)``) back to back, aligned.
    When it replaces ``base`` (a header) and only the metadata changes, a header that ends, once
    aligned, where the base's did leaves every tensor where it was. A header is never padded past
    its alignment: readers find the data right after it, rounded up to the alignment."""
    placed = layout([TensorInfo(name, t.shape, t.ggml_type, t.offset, t.nbytes)
                     for t, name, _, _ in entries], alignment)
    head = encode_header(list(kv.items()), placed, alignment)
    notes = ()
    if base is not None and len(head) == base.data_offset and \
            [(t.name, t.offset) for t in placed] == [(t.name, t.offset)
                                                     for t in base.tensors.values()]:
        notes = (f"header fits the base's header region ({len(head)} bytes): the tensor data "
                 "keeps its offsets",)
    copies = []
    for i, ((src, _, path, data_offset), dst) in enumerate(zip(entries, placed)):
        end = dst.offset + dst.nbytes
        nxt = placed[i + 1].offset if i + 1 < len(placed) else -(-end // alignment) * alignment
        copies.append((dst.name, path, data_offset + src.offset, src.nbytes, nxt - end))
    return GGUFTask(rel, head, tuple(copies), changed + notes)


def _check_guards(recipe, section: GGUFSection, gm: GGUFModel, arch: str) -> None:
    for guard in section.requires:
        key = arch_key(guard.key, arch)
        kv = gm.first.kv.get(key)
        problem = None
        if kv is None:
            if guard.exists is True or not (guard.missing_ok or guard.exists is False):
                problem = f"{key} is missing"
        elif guard.exists is False:
            problem = f"{key} is present"
        elif guard.one_of is not None and kv.value not in guard.one_of:
            problem = f"{key} is {kv.value!r}, not one of {json.dumps(list(guard.one_of))}"
        elif guard.equals is not None and kv.value != guard.equals:
            problem = f"{key} is {kv.value!r}, not {guard.equals!r}"
        if problem:
            raise GuardRefused(f"recipe {recipe.name!r} refuses this model: {guard.loc}: "
                               f"{guard.message or problem}")


def _selected(op: TensorOp, name: str, block_count: int | None) -> bool:
    sel = op.select
    if sel.glob is not None and not fnmatch.fnmatchcase(name, sel.glob):
        return False
    if sel.regex is not None and not sel.regex.search(name):
        return False
    if sel.layers is not None:
        m = _BLOCK.match(name)
        if not m:
            return False
        block = int(m[1])
        first, last, last_n = sel.layers
        if last_n is not None:
            if block_count is None:
                raise PlanError("layers: last:N needs {arch}.block_count in the metadata",
                                where=op.loc)
            return block >= block_count - last_n
        return block >= first and (last is None or block <= last)
    return True


def _tensor_op(op: TensorOp, gm, kept, renamed, block_count, changes) -> None:
    hits = 0
    with per_name("gguf tensor select", op.loc, sum(map(len, kept))) as clock:
        for i, tensors in enumerate(kept):
            for name in list(tensors):
                current = renamed.get(name, name)
                clock.start(current)
                if not _selected(op, current, block_count):
                    continue
                hits += 1
                t = tensors[name]
                if op.drop:
                    del tensors[name]
                    changes.append(_dropped(t, current, gm.files[i], op.loc))
                    continue
                new = op.rename[0].sub(op.rename[1], current)
                if new != current:
                    renamed[name] = new
                    changes.append(TensorRenamed(current, new, gm.files[i], _layout(t),
                                                 _layout(t), op.loc))
    if hits == 0:
        raise PlanError("selects no tensor", where=op.loc)
    counts = Counter(renamed.get(n, n) for k in kept for n in k)
    dup = sorted(n for n, c in counts.items() if c > 1)
    if dup:
        raise PlanError(f"the renames give two tensors the name {dup[0]!r}", where=op.loc)


def _strip_nextn(recipe, gm, arch, kv, kept, changes, meta_lines, loc) -> None:
    """Drop the MTP/nextn blocks (the last ``{arch}.nextn_predict_layers`` blocks, as
    llama.cpp's convert_hf_to_gguf.py appends them) and lower ``{arch}.block_count`` to match;
    per-layer arrays are cut to the new count and the nextn key set to 0."""
    n_key, b_key = f"{arch}.nextn_predict_layers", f"{arch}.block_count"
    where = gm.files[0]
    n = _count(kv, n_key, where) if n_key in kv else 0
    if not n:
        raise GuardRefused(f"recipe {recipe.name!r} refuses this model: {loc}: this GGUF has "
                           f"no MTP/nextn layers to drop ({n_key} is missing or 0)")
    if b_key not in kv:
        raise PlanError(f"{where}: {b_key} is missing: the MTP/nextn blocks are the last "
                        f"{n_key} of them", where=loc)
    blocks = _count(kv, b_key, where)
    if n >= blocks:
        raise PlanError(f"{where}: {n_key} is {n} but {b_key} is {blocks}: no main block "
                        "would be left", where=loc)
    first_nextn = blocks - n
    for i, tensors in enumerate(kept):
        for name in list(tensors):
            m = _BLOCK.match(name)
            if m and int(m[1]) >= first_nextn:
                changes.append(_dropped(tensors.pop(name), name, gm.files[i], loc))
    for key, new in ((b_key, first_nextn), (n_key, 0)):
        old = kv[key]
        kv[key] = KeyValue(key, old.vtype, encode_value(old.vtype, new))
        meta_lines.append(describe(key, old, kv[key]))
        changes.append(GgufMetadata("set", key, loc, before=old.value, after=new))
    for key, old in list(kv.items()):
        if key.startswith(f"{arch}.") and old.vtype == ARRAY and old.count == blocks:
            kv[key] = KeyValue(key, ARRAY, encode_value(ARRAY, old.value[:first_nextn],
                                                        old.item_type), old.item_type, first_nextn)
            meta_lines.append(describe(key, old, kv[key]))
            changes.append(GgufMetadata("set", key, loc, before=f"array of {blocks}",
                                        after=f"array of {first_nextn}"))
    _size_label(gm, kv, kept, changes, meta_lines, loc)


_INTEGER_TYPES = (0, 2, 4, 10, 1, 3, 5, 11)       # uint8..uint64, int8..int64


def _count(kv: dict[str, KeyValue], key: str, where: str) -> int:
    """A block count from the metadata: a non-negative integer, or a one-line PlanError."""
    entry = kv[key]
    if entry.vtype not in _INTEGER_TYPES or entry.value < 0:
        raise PlanError(f"{key} must be a non-negative integer; got {entry.type_name()} "
                        f"{entry.value!r}", where=where)
    return entry.value


def _size_label(gm, kv, kept, changes, meta_lines, loc) -> None:
    """``general.size_label`` counted again without the dropped blocks, the way gguf-py's
    writer counts it (``GGUFWriter.get_total_parameter_count``, ``gguf.utility.size_label``);
    a label that was not counted so from the base (set by hand, or by another tool) is
    dropped: it described the model with its MTP blocks."""
    key = "general.size_label"
    old = kv.get(key)
    if old is None or old.vtype != STRING:
        return
    from ..gguf_py import require_gguf

    label = require_gguf().utility.size_label
    before = label(*_parameter_counts(t for h in gm.headers for t in h.tensors.values()))
    if old.value == before:
        after = label(*_parameter_counts(t for tensors in kept for t in tensors.values()))
        if after == before:
            return
        kv[key] = KeyValue(key, STRING, encode_value(STRING, after))
        meta_lines.append(describe(key, old, kv[key]))
        changes.append(GgufMetadata("set", key, loc, before=old.value, after=after))
        return
    del kv[key]
    meta_lines.append(describe(key, old, None))
    changes.append(GgufMetadata("drop", key, loc, before=old.value))


def _parameter_counts(tensors) -> tuple[int, int, int, int]:
    """(total, shared, expert, expert count) as gguf-py's GGUFWriter counts them; shapes here
    are in GGUF order (ne[0] first), gguf-py's in numpy order."""
    total = shared = expert = expert_sum = n_expert = 0
    for t in tensors:
        size = math.prod(t.shape)
        total += size
        if "_exps." in t.name and len(t.shape) >= 3:
            count = t.shape[1 if ".bias" in t.name else 2]
            expert += size // count
            expert_sum += count
            n_expert += 1
        else:
            shared += size
    return total, shared, expert, expert_sum // n_expert if n_expert else 0


def _layout(t: TensorInfo) -> dict:
    return change_layout(t.type_name, reversed(t.shape))


def _dropped(t: TensorInfo, name: str, shard: str, loc: str) -> TensorDropped:
    return TensorDropped(name, shard, _layout(t), loc)
