"""``plan(recipe, model)``: everything an apply will do, computed as pure data before any write.

A ``Plan`` lists every output file with its action (link, write-json, rewrite-shard, drop, add),
the JSON diffs, the tensor changes, and the bytes that will be linked, written and hashed. The
executor (``engine.py``) carries out exactly this, and ``modelpatch plan`` prints it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Protocol

from .. import collector
from ..config.jsonfile import dump_json_document, load_json_document, unified_diff
from ..errors import InputError, NothingToChange, PlanError
from ..model.model_dir import (
    INDEX_NAME,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    ModelDir,
    fingerprint,
    read_fingerprint,
)
from ..recipe.config_ops import apply_config_ops
from ..recipe.load import Recipe
from ..recipe.params.bind import bind_recipe
from ..recipe.regex_bound import plan_wide
from ..recipe.sources import HF_PREFIX
from .changes import ABSENT, ConfigEdit, ContentSource, FileAdded, FileDropped
from .types import Action, FilePlan, Plan, PlanOptions


class Sources(Protocol):
    """Where a recipe's ``from:`` contents are read (``patcher.remote.sources.SourceFetcher``,
    which the API and the remote apply, ``remote.apply``, hand to ``plan``): each source
    fetched once, ``endpoint`` the hub of its ``hf://`` sources (None: ``$HF_ENDPOINT``, then
    huggingface.co)."""

    endpoint: str | None

    def fetch(self, source: Any) -> Any: ...


class NoSources:
    """The ``Sources`` of a plan given none: a recipe that reads a ``from:`` is refused."""

    endpoint = None

    def fetch(self, source: Any) -> Any:
        raise InputError(f"from: {source.text!r}: this plan was given no source fetcher "
                         f"(patcher.remote.sources.SourceFetcher)")


def plan(recipe: Recipe, model: ModelDir, *,
         options: PlanOptions | Mapping[str, Any] | None = None,
         sources: Sources | None = None) -> Plan:
    """Compute the plan for applying ``recipe`` to ``model``. ``from:`` contents are read
    through ``sources``, once: the plan holds their bytes.

    Raises:
        GuardRefused: a ``requires`` guard does not hold (nothing is planned).
        PlanError: an operation cannot be applied to this model (naming the recipe line), or
            its patterns overrun the plan's regex budget (``recipe.regex_bound``).
    """
    with plan_wide():
        return _plan(recipe, model, PlanOptions.of(options), sources or NoSources())


def _plan(recipe: Recipe, model: ModelDir, options: PlanOptions, sources: Sources) -> Plan:
    recipe = bind_recipe(recipe, model.json, dict(options.params) if options.params else None,
                         sources)
    changes: list = list(source_changes(recipe, sources.endpoint))
    warnings: list[str] = list(model.warnings)
    replaced: dict[str, FilePlan] = {}
    for name, ops in recipe.config.items():
        replaced_file = _plan_json_file(model, name, ops, changes, warnings)
        if replaced_file is not None:
            replaced[name] = replaced_file
    replaced.update(_plan_file_ops(recipe, model, changes))
    max_shard_size = options.max_shard_size or recipe.max_shard_size
    if recipe.gguf is not None:
        from .gguf import plan_gguf

        replaced.update(plan_gguf(recipe, model, changes, max_shard_size,
                                  in_place=options.in_place))
        if not model.shards:
            max_shard_size = None       # it resharded the GGUF; no safetensors to reshard
    if recipe.tensors or max_shard_size:
        from .tensors import plan_tensor_ops

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


def shown_endpoint(endpoint: str | None) -> str | None:
    """The endpoint as the manifest may record it: credentials in the URL removed."""
    return None if endpoint is None else re.sub(r"//[^/?#]*@", "//", endpoint)


def source_changes(recipe: Recipe, endpoint: str | None) -> list[ContentSource]:
    """One ``content_source`` change-log record per op of the bound ``recipe`` whose content
    came from elsewhere: what it fills, where it came from (resolved) and its sha256. The
    manifest keeps them, so the variant says which bytes it was made from."""
    targets = [(op.path, op, op.source) for op in recipe.files if getattr(op, "source", None)]
    targets += [(f"{file} {op.path}", op, op.source) for file, ops in recipe.config.items()
                for op in ops if getattr(op, "source", None)]
    targets += [(f"GGUF {op.key}", op, op.content_source)
                for op in (recipe.gguf.metadata if recipe.gguf is not None else ())
                if op.content_source]
    shown = shown_endpoint(endpoint or os.environ.get("HF_ENDPOINT") or None)
    return [ContentSource(target, dict(source), op.loc,
                          endpoint=shown if shown and str(source.get("resolved", ""))
                          .startswith(HF_PREFIX) else ABSENT)
            for target, op, source in targets]


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
    new_value, edits = apply_config_ops(document.value, ops, file=name)
    file_changes = [ConfigEdit.of(e) for e in edits]
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
        from ..config.jsonfile import parse_json

        try:
            parse_json(content, name, constants=False)
        except InputError as exc:
            raise PlanError(f"the content added as {name} is not valid JSON: {exc.message}",
                            where=loc) from None


def _quantization_warnings(model: ModelDir, replaced: dict[str, FilePlan],
                           dtypes: dict[str, str], changes: list) -> list[str]:
    from .quant_consistency import final_json, quantization_warnings

    def final(name: str):
        fp = replaced.get(name)
        return final_json(fp.content if fp else None, bool(fp and fp.action is Action.DROP),
                          model.json(name))

    return quantization_warnings(final("config.json"), final("hf_quant_config.json"), dtypes,
                                 changes)


__all__ = ["NoSources", "Sources", "check_unchanged", "plan", "require_change"]
