"""The plan's types: what each file gets (``Action``, ``FilePlan``), the whole ``Plan``, its
options (``PlanOptions``, built and checked in one place, ``PlanOptions.of``) and the contract of
a ``rewrite-shard`` file's task (``FileTask``, whose ``kind`` is a ``TaskKind``), so that
planning, the executors and saved plans ask a task its ``kind``, never its type. The tasks
themselves are ``patcher.tensors.tasks.ShardTask`` and ``patcher.gguf.task.GGUFTask``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

from ..errors import InputError
from ..tensors.tasks import TaskKind
from .changes import Change, changes_json


class FileTask(Protocol):
    """The contract of a ``FilePlan.shard_task``: one output file made from base files."""

    output: str
    device: str

    @property
    def kind(self) -> TaskKind: ...

    @property
    def header(self) -> bytes: ...

    @property
    def file_size(self) -> int: ...

    def summary(self) -> dict: ...

    def source_paths(self) -> set[str]:
        """The absolute paths of the base files it reads."""
        ...


class PlannedRecipe(Protocol):
    """What a plan, its executors and the manifest read of a recipe: a bound
    ``patcher.recipe.load.Recipe``, or the ``RecordedRecipe`` of a saved plan."""

    name: str
    sha256: str

    def identity(self) -> dict: ...

    def manifest_record(self) -> dict: ...


LINK_MODES = ("auto", "reflink", "hardlink", "copy")
EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class PlanOptions:
    """What shapes a plan and its execution besides the recipe and the model. Built in one place,
    ``PlanOptions.of``, by every caller (the CLI, ``api.plan``, ``api.apply``,
    ``api.apply_in_place``, the remote apply); the plan carries it, the executors read
    their settings from it and nothing else, and the manifest records ``to_json()``."""

    in_place: bool = False
    link: str | None = None
    """Out of place: how the base's unchanged files are carried (``auto``, ``reflink``,
    ``hardlink``, ``copy``); None in place."""
    jobs: int | None = None
    """Worker processes for shard rewrites; None: as many as the thread budget allows."""
    device: str | None = "cpu"
    """Where tensor kernels run; None: nothing is computed here (a config-only apply on the
    hub), and the manifest records neither ``jobs`` nor ``device``."""
    max_shard_size: int | None = None
    """Reshard the output into shards of at most this many bytes (overrides the recipe's)."""
    params: Mapping[str, Any] | None = None
    """Values of the recipe's ``params:`` (typed, or strings as ``--set`` gives them)."""
    executor: str = "local"
    """Where shard tasks and file hashes run: ``local`` (this process's pools) or ``ray``."""
    ray_address: str | None = None
    """The Ray cluster of ``executor="ray"`` (None: ray's own default)."""

    @classmethod
    def of(cls, value: PlanOptions | Mapping[str, Any] | None = None, /,
           **given: Any) -> PlanOptions:
        """The options: ``value`` (a ``PlanOptions``, or a mapping of its field names, as the
        library's ``api.plan(options={...})`` takes) with the fields ``given`` that are not None
        replacing its own; ``force_copy=True`` is ``link="copy"``. Checked and normalized here,
        once: an unknown name, link mode or executor is an InputError; in place there is no
        link; no params is None.

        Example:
            >>> PlanOptions.of({"jobs": 2}, in_place=True, link="auto").link is None
            True
        """
        names = {f.name for f in fields(cls)}
        base = _asdict(value) if isinstance(value, PlanOptions) else dict(value or {})
        force_copy = given.pop("force_copy", False)
        merged = {**base, **{k: v for k, v in given.items() if v is not None}}
        unknown = sorted(set(merged) - names)
        if unknown:
            raise InputError(f"unknown plan option {unknown[0]!r} (options: "
                             f"{', '.join(sorted(names))})")
        if force_copy:
            if merged.get("link") not in (None, "auto", "copy"):
                raise InputError(f"force_copy is link='copy'; it excludes link="
                                 f"{merged['link']!r}")
            merged["link"] = "copy"
        options = cls(**merged)
        if options.link is not None and options.link not in LINK_MODES:
            raise InputError(f"link mode {options.link!r} is not one of {', '.join(LINK_MODES)}")
        if options.executor not in EXECUTORS:
            raise InputError(f"unknown executor {options.executor!r}: local or ray")
        if options.ray_address is not None and options.executor != "ray":
            raise InputError("--ray-address needs --executor ray")
        return replace(options, link=None if options.in_place else options.link,
                       params=dict(options.params) if options.params else None)

    def out_of_place(self) -> PlanOptions:
        """These options for a new variant: the base's files carried in ``auto`` mode unless
        a link mode was given."""
        return self if self.link is not None else replace(self, link="auto")

    def to_json(self) -> dict[str, Any]:
        """The options as the provenance manifest records them."""
        out: dict[str, Any] = {} if self.link is None else {"link": self.link}
        if self.device is not None:
            out.update(jobs=self.jobs, device=self.device)
        out.update(in_place=self.in_place, max_shard_size=self.max_shard_size)
        if self.params:
            out["params"] = dict(self.params)
        if self.executor != "local":
            out["executor"] = self.executor
        return out


def _asdict(options: PlanOptions) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in fields(options)}


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

    recipe: PlannedRecipe
    base: Path
    files: tuple[FilePlan, ...]
    changes: tuple[Change, ...]
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


__all__ = ["Action", "FilePlan", "FileTask", "Plan", "PlanOptions", "PlannedRecipe", "TaskKind"]
