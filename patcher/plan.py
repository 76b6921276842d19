"""``plan(recipe, model)``: everything an apply will do, computed as pure data before any write.

A ``Plan`` lists every output file with its action (link, write-json, rewrite-shard, drop, add),
the JSON diffs, the tensor changes, and the bytes that will be linked, written and hashed. The
executor (``engine.py``) carries out exactly this, and ``modelpatch plan`` prints it.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from . import collector
from .changes import ChangeRecord, FileAdded, FileDropped, changes_json
from .config.jsonfile import dump_json_document, load_json_document, unified_diff
from .config.ops import apply_config_ops
from .errors import NothingToChange, PlanError
from .file_task import FileTask, TaskKind
from .model.model_dir import (
    INDEX_NAME,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    ModelDir,
    fingerprint,
    read_fingerprint,
)
from .plan_options import PlanOptions
from .recipe.load import Recipe
from .recipe.params.bind import bind_recipe
from .recipe.regex_bound import plan_wide


class LinkEstimate(Protocol):
    """How an out-of-place apply will carry the base's files (``execute.linking``)."""

    method: str
    carried_bytes: int

    def to_json(self) -> dict: ...


class Action(str, enum.Enum):
    LINK = "link"
    WRITE_JSON = "write-json"
    REWRITE_SHARD = "rewrite-shard"
    DROP = "drop"
    ADD = "add"


@dataclass(frozen=True)
class FilePlan:
    """What happens to one file. ``path`` is the output path (the base path for drops)."""

    path: str
    action: Action
    source: str | None = None          # base relpath the output comes from
    size_before: int | None = None
    size_after: int | None = None
    content: bytes | None = None       # WRITE_JSON and ADD
    diff: str | None = None
    shard_task: FileTask | None = None   # REWRITE_SHARD: what writes the file


@dataclass(frozen=True)
class Plan:
    """Pure data describing an apply. Nothing here has touched the disk."""

    recipe: Recipe
    base: Path
    files: tuple[FilePlan, ...]
    changes: tuple[ChangeRecord, ...]   # patcher.changes records and config.ops.Change
    warnings: tuple[str, ...] = ()
    options: PlanOptions = field(default_factory=PlanOptions)
    link: LinkEstimate | None = None
    """A ``linking.LinkPrediction`` for an out-of-place apply (``linking.predict_for_plan``)."""
    transfer: dict | None = None
    """For a model read from a hub (``hf://``): what reading it transferred."""
    fingerprint: dict | None = None
    """What the plan read of the base directory (``model_dir.fingerprint``): the executors
    refuse the plan if the directory has changed since (``check_unchanged``)."""
    base_subset: bool = False
    """The base is some files of its directory (a ``.gguf`` file as MODEL): only those count for
    ``check_unchanged``; others may come and go beside them (the variant's own output)."""

    def by_action(self, action: Action) -> list[FilePlan]:
        return [f for f in self.files if f.action is action]

    @property
    def bytes_unchanged(self) -> int:
        """Bytes of the base files the variant keeps unchanged (linked or copied)."""
        return sum(f.size_after or 0 for f in self.by_action(Action.LINK))

    @property
    def bytes_written(self) -> int:
        return sum(len(f.shard_task.header)
                   if f.shard_task is not None and f.shard_task.kind is TaskKind.GGUF_HEADER
                   else f.size_after or 0 for f in self.files
                   if f.action in (Action.WRITE_JSON, Action.ADD, Action.REWRITE_SHARD))

    @property
    def changed(self) -> bool:
        return any(f.action is not Action.LINK for f in self.files)

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe.identity(),
            "base": str(self.base),
            "files": [_file_json(f) for f in self.files],
            "changes": changes_json(self.changes),
            "warnings": list(self.warnings),
            "bytes": self._bytes_json(),
            **({"link": self.link.to_json()} if self.link is not None else {}),
        }

    def _bytes_json(self) -> dict:
        """``unchanged``: the base files kept as they are; of those and of the originals kept
        for revert, ``linked`` share storage with the base (reflink or hardlink) and ``copied``
        are copied, as predicted for the output (an in-place patch neither links nor copies)."""
        link = self.link
        carried = link.carried_bytes if link is not None else 0
        copied = carried if link is not None and link.method == "copy" else 0
        return {"unchanged": self.bytes_unchanged, "linked": carried - copied, "copied": copied,
                "written": self.bytes_written}


def _file_json(f: FilePlan) -> dict:
    out = {"path": f.path, "action": f.action.value, "source": f.source,
           "size_before": f.size_before, "size_after": f.size_after}
    if f.diff:
        out["diff"] = f.diff
    if f.shard_task is not None:
        out["tensors"] = f.shard_task.summary()
    return out


def plan(recipe: Recipe, model: ModelDir, *,
         options: PlanOptions | Mapping[str, Any] | None = None,
         endpoint: str | None = None) -> Plan:
    """Compute the plan for applying ``recipe`` to ``model``. ``from:`` sources on a hub are
    fetched from ``endpoint`` (default ``$HF_ENDPOINT``, then huggingface.co), once: the plan
    holds their bytes.

    Raises:
        GuardRefused: a ``requires`` guard does not hold (nothing is planned).
        PlanError: an operation cannot be applied to this model (naming the recipe line), or
            its patterns overrun the plan's regex budget (``recipe.regex_bound``).
    """
    with plan_wide():
        return _plan(recipe, model, PlanOptions.of(options), endpoint)


def _plan(recipe: Recipe, model: ModelDir, options: PlanOptions, endpoint: str | None) -> Plan:
    from .remote.sources import SourceFetcher, source_changes

    recipe = bind_recipe(recipe, model.json, dict(options.params) if options.params else None,
                         SourceFetcher(endpoint))
    changes: list = list(source_changes(recipe, endpoint))
    warnings: list[str] = list(model.warnings)
    replaced: dict[str, FilePlan] = {}
    for name, ops in recipe.config.items():
        replaced_file = _plan_json_file(model, name, ops, changes, warnings)
        if replaced_file is not None:
            replaced[name] = replaced_file
    replaced.update(_plan_file_ops(recipe, model, changes))
    max_shard_size = options.max_shard_size or recipe.max_shard_size
    if recipe.gguf is not None:
        from .gguf.plan import plan_gguf

        replaced.update(plan_gguf(recipe, model, changes, max_shard_size,
                                  in_place=options.in_place))
        if not model.shards:
            max_shard_size = None       # it resharded the GGUF; no safetensors to reshard
    if recipe.tensors or max_shard_size:
        from .tensors.planning import plan_tensor_ops

        # Several objects per tensor, all kept in the plan: collections would only rescan
        # them (4.3 of 22.6 s planning nvfp4-to-bf16 at 497k tensors).
        with collector.paused():
            tensors = plan_tensor_ops(recipe, model, changes, device=options.device or "cpu",
                                      max_shard_size=max_shard_size)
        replaced.update(tensors.files)
        warnings.extend(_quantization_warnings(model, replaced, tensors.dtypes, changes))
    files = [replaced.pop(rel, None) or _link(model, rel)
             for rel in sorted(model.files) if rel not in (MANIFEST_NAME, SIGNATURE_NAME)]
    files.extend(sorted(replaced.values(), key=lambda f: f.path))  # additions
    return Plan(recipe=recipe, base=model.root, files=tuple(files), changes=tuple(changes),
                warnings=tuple(warnings), options=options, fingerprint=fingerprint(model.files),
                base_subset=model.subset)


def check_unchanged(the_plan: Plan) -> None:
    """Refuse to carry out ``the_plan`` if its base directory changed since it was planned: a
    file added, removed, relinked, or of another device, inode, size or mtime (for a base that
    is some files of its directory, only those files).

    Raises:
        PlanError: naming the first changed file; nothing has been written.
    """
    if the_plan.fingerprint is None:
        return
    before, now = the_plan.fingerprint, read_fingerprint(the_plan.base)
    if the_plan.base_subset:
        now = {rel: stamp for rel, stamp in now.items() if rel in before}
    changed = sorted(rel for rel in before.keys() | now.keys() if before.get(rel) != now.get(rel))
    if changed:
        what = "appeared" if changed[0] not in before else \
            "is gone" if changed[0] not in now else "was modified"
        more = f" (and {len(changed) - 1} more file(s))" if len(changed) > 1 else ""
        raise PlanError(f"plan is stale: {changed[0]} {what} since the plan was made{more}; "
                        f"nothing was written", where=the_plan.base, hint="plan and apply again")


def require_change(the_plan: Plan, allow_noop: bool) -> None:
    """Refuse a plan that changes nothing (every file linked as it is), unless ``allow_noop``."""
    if allow_noop or the_plan.changed:
        return
    raise NothingToChange(f"recipe {the_plan.recipe.name!r} changes nothing in "
                          f"{the_plan.base}: the variant would equal the base",
                          hint="allow_noop=True accepts that")


def _link(model: ModelDir, rel: str) -> FilePlan:
    size = model.files[rel].size
    return FilePlan(rel, Action.LINK, source=rel, size_before=size, size_after=size)


def _plan_json_file(model: ModelDir, name: str, ops: list, changes: list,
                    warnings: list[str]) -> FilePlan | None:
    if not model.has(name):
        if all(getattr(op, "missing_ok", False) for op in ops):  # only tolerant drops
            return None
        raise PlanError(f"the recipe edits {name}, which {model.root} does not have",
                        where=ops[0].loc)
    before = model.read_bytes(name)
    document = load_json_document(before, str(model.root / name))
    new_value, file_changes = apply_config_ops(document.value, ops, file=name)
    if not file_changes:
        return None
    after = dump_json_document(new_value, document.style)
    if not document.exact:
        warnings.append(f"{name}: {document.note}; lines outside the patched keys may change")
    changes.extend(file_changes)
    if after == before:
        return None
    return FilePlan(name, Action.WRITE_JSON, source=name, size_before=len(before),
                    size_after=len(after), content=after, diff=unified_diff(before, after, name))


def _plan_file_ops(recipe: Recipe, model: ModelDir, changes: list) -> dict[str, FilePlan]:
    out: dict[str, FilePlan] = {}
    for op in recipe.files:
        name = op.path
        if op.kind == "drop":
            if not model.has(name):
                if op.missing_ok:
                    continue
                raise PlanError(f"the recipe drops {name}, which the model does not have",
                                where=op.loc)
            size = model.files[name].size
            out[name] = FilePlan(name, Action.DROP, source=name, size_before=size)
            changes.append(FileDropped(name, size=size))
            continue
        if model.has(name) and not op.overwrite:
            raise PlanError(f"the recipe adds {name}, which the model already has",
                            where=op.loc, hint="set overwrite: true to replace it")
        content = op.content.encode("utf-8")
        _check_add_target(model, name, op.loc)
        _check_added_file(name, content, op.loc)
        source = name if model.has(name) else None
        out[name] = FilePlan(name, Action.ADD, source=source,
                             size_before=model.files[name].size if source else None,
                             size_after=len(content), content=content,
                             diff=unified_diff(model.read_bytes(name) if source else None,
                                               content, name))
        changes.append(FileAdded(name, len(content), source is not None, dict(op.source or {})))
    return out


def _check_add_target(model: ModelDir, name: str, loc: str) -> None:
    """``files: add`` creates a regular file: not onto a directory, not under a file, and never
    through a symlinked directory (it could lead anywhere)."""
    parts = name.split("/")
    for depth in range(1, len(parts)):
        parent = "/".join(parts[:depth])
        path = model.root / parent
        if model.has(parent) or (os.path.lexists(path) and not path.is_dir()):
            raise PlanError(f"files: add {name}: {parent} is a file, not a directory", where=loc)
        if path.is_symlink():
            raise PlanError(f"files: add {name}: {parent} is a symlinked directory; recipes "
                            f"write only inside the model's own directories", where=loc)
    target = model.root / name
    if not model.has(name) and os.path.lexists(target):
        kind = "directory" if target.is_dir() else "not a regular file"
        raise PlanError(f"files: add {name}: the model has a {kind} there", where=loc)


def _check_added_file(name: str, content: bytes, loc: str) -> None:
    """``files: add`` writes text: never a shard or the shard index (the variant would not load),
    and for a ``.json`` file, valid strict JSON."""
    if name.endswith(".safetensors") or name == INDEX_NAME:
        raise PlanError(f"files: add cannot write {name}: shards and the shard index are made by "
                        f"the tensors: operations", where=loc)
    if name.endswith(".json"):
        from .config.jsonfile import parse_json
        from .errors import InputError

        try:
            parse_json(content, name, constants=False)
        except InputError as exc:
            raise PlanError(f"the content added as {name} is not valid JSON: {exc.message}",
                            where=loc) from None


def _quantization_warnings(model: ModelDir, replaced: dict[str, FilePlan],
                           dtypes: dict[str, str], changes: list) -> list[str]:
    from .tensors.quant_consistency import final_json, quantization_warnings

    def final(name: str):
        fp = replaced.get(name)
        return final_json(fp.content if fp else None, bool(fp and fp.action is Action.DROP),
                          model.json(name))

    return quantization_warnings(final("config.json"), final("hf_quant_config.json"), dtypes,
                                 changes)


__all__ = ["Action", "FilePlan", "Plan", "PlanOptions", "plan", "require_change", "INDEX_NAME"]
