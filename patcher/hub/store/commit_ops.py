"""Commit operations of the hub (add, delete a file, delete a folder) and their effect on a tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..request_errors import BadRequest, EntryNotFound
from .naming import check_path


@dataclass(frozen=True)
class Op:
    """One commit operation: ``add`` (with its tree entry), ``delete_file`` or ``delete_folder``."""

    kind: str
    path: str
    entry: dict[str, Any] | None = None


def apply_ops(tree: dict[str, dict[str, Any]], ops: list[Op]) -> dict[str, dict[str, Any]]:
    """The tree after ``ops`` (``tree`` itself is left alone). Raises EntryNotFound for a delete of
    nothing, BadRequest for an unknown operation or a path that is both a file and a folder."""
    tree = dict(tree)
    for op in ops:
        if op.kind == "add":
            if op.entry is None:
                raise BadRequest(f"add {op.path!r}: the operation carries no file")
            tree[check_path(op.path)] = op.entry
        elif op.kind == "delete_file":
            if tree.pop(op.path, None) is None:
                raise EntryNotFound(f"A file with this name doesn't exist: {op.path}")
        elif op.kind == "delete_folder":
            prefix = op.path.rstrip("/") + "/"
            doomed = [p for p in tree if p.startswith(prefix)] if prefix != "/" else list(tree)
            if not doomed:
                raise EntryNotFound(f"A folder with this name doesn't exist: {op.path}")
            for p in doomed:
                del tree[p]
        else:
            raise BadRequest(f"unknown commit operation {op.kind!r}")
    folders = {p[:i] for p in tree for i, c in enumerate(p) if c == "/"}
    clash = sorted(folders & tree.keys())
    if clash:
        raise BadRequest(f"{clash[0]!r} cannot be both a file and a folder")
    return tree
