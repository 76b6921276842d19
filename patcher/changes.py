"""The change log of a plan: one typed record per kind of change.

``Plan.changes`` holds these records (and the JSON edits of ``patcher.config.ops.Change``); the
plan's ``--json``, the text plan and the provenance manifest read ``to_json()``, whose keys and
their order are the change log's format (docs/architecture.md §3): the manifest's bytes come from
it. A field left at ``ABSENT`` is not written; ``None`` is written as ``null``.

The standard library only: every package may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Union


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
"""A field that the record does not have (not written), as opposed to a ``null`` value."""


def _present(**items: Any) -> dict[str, Any]:
    return {k: v for k, v in items.items() if v is not ABSENT}


def layout(dtype: str, shape) -> dict[str, Any]:
    """A tensor's ``{"dtype", "shape"}`` as change records show it."""
    return {"dtype": dtype, "shape": list(shape)}


@dataclass(frozen=True)
class FileDropped:
    """A file of the base left out of the output: by ``files: drop`` (``size``), or a shard with
    no tensors left (``reason``)."""

    file: str
    size: int | None = ABSENT
    reason: str = ABSENT
    kind = "file_dropped"

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, file=self.file, size=self.size, reason=self.reason)


@dataclass(frozen=True)
class FileAdded:
    """A file written by ``files: add`` (``replaced``: a base file of that name was replaced;
    ``source``: where ``from:`` read it, as its keys)."""

    file: str
    size: int
    replaced: bool
    source: dict[str, Any] = field(default_factory=dict)
    kind = "file_added"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "file": self.file, "size": self.size,
                "replaced": self.replaced, **self.source}


@dataclass(frozen=True)
class TensorDropped:
    """A tensor left out of the output (``companion_of``/``reason``: dropped with the tensor a
    dequantization consumed it for). ``dtype``/``shape`` repeat ``before`` for safetensors."""

    tensor: str
    shard: str
    before: dict[str, Any]
    recipe_line: str
    dtype: str = ABSENT
    shape: list = ABSENT
    companion_of: str = ABSENT
    reason: str = ABSENT
    kind = "tensor_dropped"

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, tensor=self.tensor, dtype=self.dtype, shape=self.shape,
                        shard=self.shard, before=self.before, after=None,
                        recipe_line=self.recipe_line, companion_of=self.companion_of,
                        reason=self.reason)


@dataclass(frozen=True)
class TensorRenamed:
    tensor: str
    to: str
    shard: str
    before: dict[str, Any]
    after: dict[str, Any]
    recipe_line: str
    kind = "tensor_renamed"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "tensor": self.tensor, "to": self.to, "shard": self.shard,
                "before": self.before, "after": self.after, "recipe_line": self.recipe_line}


@dataclass(frozen=True)
class TensorConverted:
    """A tensor cast, dequantized (``removed``: the companions it consumed; ``to``: its new name)
    or quantized (``added``: the companions written beside it); ``how`` says which."""

    tensor: str
    how: str
    shard: str
    before: dict[str, Any]
    after: dict[str, Any]
    recipe_line: str
    removed: list[str] = ABSENT
    to: str = ABSENT
    added: list[str] = ABSENT
    kind = "tensor_converted"

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, tensor=self.tensor, how=self.how, shard=self.shard,
                        before=self.before, after=self.after, recipe_line=self.recipe_line,
                        removed=self.removed, to=self.to, added=self.added)


@dataclass(frozen=True)
class TensorAdded:
    """A new tensor: a ``copy_of`` another, a part ``split_from`` one, or a ``companion_of`` a
    quantized one (its scale)."""

    tensor: str
    shard: str
    reason: str
    after: dict[str, Any]
    recipe_line: str
    copy_of: str = ABSENT
    companion_of: str = ABSENT
    split_from: str = ABSENT
    kind = "tensor_added"

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, tensor=self.tensor, companion_of=self.companion_of,
                        copy_of=self.copy_of, split_from=self.split_from, shard=self.shard,
                        reason=self.reason, before=None, after=self.after,
                        recipe_line=self.recipe_line)


@dataclass(frozen=True)
class Resharded:
    max_shard_size: int
    shards_before: int
    shards_after: int
    kind = "resharded"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "max_shard_size": self.max_shard_size,
                "shards_before": self.shards_before, "shards_after": self.shards_after}


@dataclass(frozen=True)
class GgufResharded:
    """A GGUF model's files rewritten into another split layout (``--max-shard-size``)."""

    max_shard_size: int
    files_before: list
    files_after: list
    kind = "gguf_resharded"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "max_shard_size": self.max_shard_size,
                "files_before": list(self.files_before), "files_after": list(self.files_after)}


@dataclass(frozen=True)
class GgufMetadata:
    """A GGUF metadata key dropped, renamed (``to``) or set (``before`` may be null; ``type``: the
    GGUF value type of a key the recipe sets)."""

    op: str
    key: str
    recipe_line: str
    to: str = ABSENT
    before: Any = ABSENT
    after: Any = ABSENT
    type: str = ABSENT
    kind = "gguf_metadata"

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, op=self.op, key=self.key, to=self.to, before=self.before,
                        after=self.after, type=self.type, recipe_line=self.recipe_line)


@dataclass(frozen=True)
class ContentSource:
    """Content that a ``from:`` brought in from elsewhere (a hub file, another model, a local
    file): what it fills (``target``: a file, or ``FILE POINTER``), the resolved source's keys
    (``resolved``, ``sha256``, ``size`` ...), the recipe line, and the hub's endpoint when it
    is not the default one."""

    target: str
    source: dict[str, Any]
    loc: str
    endpoint: str = ABSENT
    kind = "content_source"

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, target=self.target, **self.source, loc=self.loc,
                        endpoint=self.endpoint)


Change = Union[FileDropped, FileAdded, TensorDropped, TensorRenamed, TensorConverted, TensorAdded,
               Resharded, GgufResharded, GgufMetadata, ContentSource]
"""Every record but the JSON edits (``patcher.config.ops.Change``), which have ``to_json`` too."""


class ChangeRecord(Protocol):
    """One entry of a plan's change log: a record here, a ``config.ops.Change``, or one read
    back from a saved plan."""

    def to_json(self) -> dict[str, Any]: ...


def changes_json(changes) -> list[dict[str, Any]]:
    """The change log as the plan's JSON and the manifest write it."""
    return [c.to_json() for c in changes]


# -- the manifest's change log: per rule, not per tensor ---------------------------------------

TENSOR_KINDS = ("tensor_converted", "tensor_dropped", "tensor_renamed", "tensor_added")
TENSOR_GROUP = "tensor_group"
GROUP_EXAMPLES = 3
"""Names a group shows (the first in sorted order); the rest are in its digest."""

# the fields that make two tensor changes "the same change": what happened, by which recipe line,
# how, and the dtypes before and after; names, shards and shapes vary within a group
_GROUP_FIELDS = ("how", "reason", "recipe_line")


def _dtype(side: Any) -> Any:
    return side.get("dtype") if isinstance(side, dict) else None


def _group_key(entry: dict[str, Any]) -> tuple:
    return (entry["kind"], *(entry.get(f) for f in _GROUP_FIELDS),
            _dtype(entry.get("before")), _dtype(entry.get("after")),
            "companion" if "companion_of" in entry else None)


def _member(entry: dict[str, Any]) -> str:
    """A tensor's line in its group's digest: its name, and where a rename or a conversion sent
    it, that name too (``name<TAB>to``)."""
    return entry["tensor"] + (f"\t{entry['to']}" if isinstance(entry.get("to"), str) else "")


def members_sha256(entries: list[dict[str, Any]]) -> str:
    """The digest a ``tensor_group`` records: sha256 of its members' lines, sorted, each ending
    in a newline (UTF-8)."""
    import hashlib

    lines = sorted(_member(e) for e in entries)
    return hashlib.sha256("".join(f"{line}\n" for line in lines).encode(
        "utf-8", "surrogatepass")).hexdigest()


def grouped(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The change log as a provenance manifest records it: config, file and GGUF edits as they
    are, tensor changes one record per rule (``tensor_group``: the change's kind, recipe line,
    ``how``, dtypes before and after, the tensor count, the digest of the sorted names
    (``members_sha256``) and the first few names). Its size grows with the recipe's rules and the
    files, never with the tensors: Kimi-K2.5's 273k tensors are a handful of groups. The plan
    keeps every tensor (``plan --json``). Groups stand where their first tensor stood."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    out: list[Any] = []
    for entry in entries:
        if entry.get("kind") not in TENSOR_KINDS:
            out.append(entry)
            continue
        key = _group_key(entry)
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(entry)
    return [_group(item, groups[item]) if isinstance(item, tuple) else item for item in out]


def _group(key: tuple, members: list[dict[str, Any]]) -> dict[str, Any]:
    kind, *fields = key
    how, reason, recipe_line, before, after, companion = fields
    record = _present(kind=TENSOR_GROUP, change=kind,
                      how=how if how is not None else ABSENT,
                      reason=reason if reason is not None else ABSENT,
                      companions=True if companion else ABSENT,
                      before_dtype=before, after_dtype=after,
                      recipe_line=recipe_line if recipe_line is not None else ABSENT)
    record["count"] = len(members)
    record["members_sha256"] = members_sha256(members)
    record["examples"] = sorted(e["tensor"] for e in members)[:GROUP_EXAMPLES]
    return record
