"""The change log as a provenance manifest records it: per rule, not per tensor.

The plan's change records (``patcher.plan.changes``) write their ``to_json()``; the manifest
keeps config, file and GGUF edits as they are and groups tensor changes by rule here, on those
plain JSON entries, so that reading or writing a manifest needs nothing of the plan.
"""

from __future__ import annotations

import hashlib
from typing import Any

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
    record = {"kind": TENSOR_GROUP, "change": kind, "how": how, "reason": reason,
              "companions": True if companion else None}
    record = {k: v for k, v in record.items() if v is not None}
    record.update(before_dtype=before, after_dtype=after)
    if recipe_line is not None:
        record["recipe_line"] = recipe_line
    record["count"] = len(members)
    record["members_sha256"] = members_sha256(members)
    record["examples"] = sorted(e["tensor"] for e in members)[:GROUP_EXAMPLES]
    return record
