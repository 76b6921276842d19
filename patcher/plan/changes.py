"""The change log of a plan: one typed record per kind of change, each a ``Change``.

``Plan.changes`` holds these records; the plan's ``--json``, the text plan and the provenance
manifest read ``to_json()``, whose keys and their order are the change log's format
(docs/architecture.md §3): the manifest's bytes come from it (grouped per rule by
``patcher.integrity.change_log``). A field left at ``ABSENT`` is not written; ``None`` is written
as ``null``. A record made by a recipe line names it under one key, ``recipe_line``
(``file:line:col``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..recipe.config_ops import JsonEdit

RECIPE_LINE = "recipe_line"
"""The one key of a change record that names the recipe line which made it."""

OLD_RECIPE_LINE_KEYS = ("recipe_loc", "loc")
"""What saved plans written before the key was one called it (JSON edits, content sources)."""


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
"""A field that the record does not have (not written), as opposed to a ``null`` value."""


def _present(**items: Any) -> dict[str, Any]:
    return {k: v for k, v in items.items() if v is not ABSENT}


@dataclass(frozen=True)
class Change:
    """One entry of a plan's change log. Every record has a ``kind`` (a class attribute, or
    the edit of a ``ConfigEdit``) and writes itself with ``to_json()``."""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError


def with_one_recipe_line_key(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` (a change record's JSON) with an older spelling of ``recipe_line`` renamed in
    its place (same position, so the manifest's bytes match a record written today)."""
    if not any(k in entry for k in OLD_RECIPE_LINE_KEYS) or RECIPE_LINE in entry:
        return entry
    return {RECIPE_LINE if k in OLD_RECIPE_LINE_KEYS else k: v for k, v in entry.items()}


def layout(dtype: str, shape) -> dict[str, Any]:
    """A tensor's ``{"dtype", "shape"}`` as change records show it."""
    return {"dtype": dtype, "shape": list(shape)}


@dataclass(frozen=True)
class FileDropped(Change):
    """A file of the base left out of the output: by ``files: drop`` (``size``), or a shard with
    no tensors left (``reason``)."""

    file: str
    size: int | None = ABSENT
    reason: str = ABSENT
    kind = "file_dropped"

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, file=self.file, size=self.size, reason=self.reason)


@dataclass(frozen=True)
class FileAdded(Change):
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
class TensorDropped(Change):
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
class TensorRenamed(Change):
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
class TensorConverted(Change):
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
class TensorAdded(Change):
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
class Resharded(Change):
    max_shard_size: int
    shards_before: int
    shards_after: int
    kind = "resharded"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "max_shard_size": self.max_shard_size,
                "shards_before": self.shards_before, "shards_after": self.shards_after}


@dataclass(frozen=True)
class GgufResharded(Change):
    """A GGUF model's files rewritten into another split layout (``--max-shard-size``)."""

    max_shard_size: int
    files_before: list
    files_after: list
    kind = "gguf_resharded"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "max_shard_size": self.max_shard_size,
                "files_before": list(self.files_before), "files_after": list(self.files_after)}


@dataclass(frozen=True)
class GgufMetadata(Change):
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
class ContentSource(Change):
    """Content that a ``from:`` brought in from elsewhere (a hub file, another model, a local
    file): what it fills (``target``: a file, or ``FILE POINTER``), the resolved source's keys
    (``resolved``, ``sha256``, ``size`` ...), the recipe line, and the hub's endpoint when it
    is not the default one."""

    target: str
    source: dict[str, Any]
    recipe_line: str
    endpoint: str = ABSENT
    kind = "content_source"

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, target=self.target, **self.source,
                        recipe_line=self.recipe_line, endpoint=self.endpoint)


@dataclass(frozen=True)
class ConfigEdit(JsonEdit, Change):
    """One effective edit of a JSON file, as the change log records it: the fields of the
    recipe's ``patcher.recipe.config_ops.JsonEdit`` (``kind``, ``before``, ``after``...)."""

    @classmethod
    def of(cls, edit: JsonEdit) -> ConfigEdit:
        """The record of a ``JsonEdit``."""
        return cls(*(getattr(edit, f.name) for f in fields(JsonEdit)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "kind": self.kind, "path": self.path}
        if self.from_path is not None:
            out["from"] = self.from_path
        out.update(before=self.before, after=self.after, existed=self.existed,
                   recipe_line=self.recipe_line)
        return out


def changes_json(changes) -> list[dict[str, Any]]:
    """The change log as the plan's JSON and the manifest write it."""
    return [c.to_json() for c in changes]
