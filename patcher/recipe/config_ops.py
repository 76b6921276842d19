"""Recipe ``config:`` operations carried out on parsed JSON documents (the plan, and the binding
of recipes in turn, run them).

``apply_config_ops`` is pure: it copies the document, applies the ops in recipe order, and
returns the new document with one ``JsonEdit`` per effective edit. Every edit is carried out as an
RFC 6902 operation through the ``jsonpatch`` library; the friendly ops translate as

    drop   -> remove          (a missing path fails unless missing_ok: true)
    set    -> add / replace   (after adding ``{}`` for each missing parent object, unless
                               create_parents: false)
    rename -> move            (a missing source fails unless missing_ok: true; a key renamed
                               within its object keeps its position)
    architectures / model_type -> set /architectures, /model_type

An op with ``in: [scope, ...]`` runs once per scope with its pointers read inside that scope.
A scope missing from the document (or not an object/array) is skipped. ``drop``/``rename`` (and
``op: remove/replace/move/copy`` with ``missing_ok: true``) skip the scopes that lack their path;
a path found in none of the existing scopes, or no existing scope at all, is a PlanError unless
``missing_ok: true``. So ``drop: /quantization_config, in: [/, /text_config]`` drops it wherever
it is, and fails only when neither place has it.

Failures raise ``PlanError`` naming the file, the JSON pointer and the recipe line.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Sequence

import jsonpatch
import jsonpointer

from ..config.json_pointer import (
    MISSING,
    deepest_existing,
    join_pointer,
    json_equal,
    json_type,
    make_pointer,
    parent_pointer,
    resolve,
    split_pointer,
)
from ..config.jsonfile import unified_diff  # re-exported: the plan renders config changes with it
from ..errors import PlanError
from .schema import ArrayOp, ConfigOp, DropOp, PatchOp, RenameOp, SetOp

__all__ = ["JsonEdit", "apply_config_ops", "unified_diff", "EDIT_KINDS"]

EDIT_KINDS = ("removed", "set", "renamed", "copied", "test")


@dataclass(frozen=True)
class JsonEdit:
    """One effective edit of a JSON file, as the plan's change log records it
    (``patcher.plan.changes.ConfigEdit``).

    ``kind``: ``removed`` (``before`` is the removed value), ``set`` (``existed`` tells whether
    ``path`` had a value, then in ``before``), ``renamed`` / ``copied`` (from ``from_path`` to
    ``path``), ``test`` (an RFC 6902 test that passed; ``before == after``). ``recipe_line`` is
    the recipe line of the op. Values are plain JSON.
    """

    file: str
    path: str
    kind: str
    before: Any
    after: Any
    recipe_line: str
    from_path: str | None = None
    existed: bool = True


def apply_config_ops(doc: Any, ops: Sequence[ConfigOp], *,
                     file: str) -> tuple[Any, list[JsonEdit]]:
    """Apply ``ops`` to a copy of ``doc``.

    Args:
        doc: a parsed JSON document (not modified).
        ops: the recipe's ops for this file.
        file: the file's name, for changes and errors.
    Returns:
        ``(new_doc, changes)``; ``changes`` is empty when nothing changed (a ``set`` to the value
        already there is not a change).
    Raises:
        PlanError: an op cannot apply (missing path or parent, failed test, type conflict).
    """
    state = _State(copy.deepcopy(doc), file)
    for op in ops:
        scopes = [s for s in op.scopes if isinstance(resolve(state.doc, s), (dict, list))]
        tolerant = getattr(op, "missing_ok", False)
        if not scopes:
            if tolerant:
                continue
            shown = ", ".join(s or "/" for s in op.scopes)
            raise PlanError(f"{file}: none of the scopes {shown} exists, so "
                            f"{_label(op)} {op.path} has nothing to apply to", where=op.loc)
        read = _read_path(op)
        applied = 0
        for scope in scopes:
            if read is not None and resolve(state.doc, join_pointer(scope, read)) is MISSING:
                continue
            _APPLY[type(op)](state, op, scope)
            applied += 1
        if read is not None and not applied and not tolerant:
            raise _missing_everywhere(file, op, read, scopes)
    return state.doc, state.changes


def _read_path(op: ConfigOp) -> str | None:
    """The pointer an op needs to find in a scope to apply there, or None for ops that apply
    wherever the scope exists (set, add, test; remove/replace/move/copy without missing_ok,
    which fail as RFC 6902 says)."""
    if isinstance(op, (DropOp, RenameOp, ArrayOp)):
        return op.path
    if isinstance(op, PatchOp) and op.missing_ok:
        return op.read_path()
    return None


def _missing_everywhere(file: str, op: ConfigOp, read: str, scopes: list[str]) -> PlanError:
    if len(scopes) == 1:
        where = f"{join_pointer(scopes[0], read)}: it does not exist"
    else:
        where = f"{read}: it exists in none of the scopes {', '.join(s or '/' for s in scopes)}"
    return PlanError(f"{file}: cannot {_label(op)} {where}", where=op.loc,
                     hint="add missing_ok: true to the operation if the path is optional")


def _label(op: ConfigOp) -> str:
    if isinstance(op, SetOp):
        return op.label
    if isinstance(op, PatchOp):
        return op.op
    if isinstance(op, ArrayOp):
        return f"{op.action} elements of" if op.action != "append" else "append to"
    return op.kind


class _State:
    def __init__(self, doc: Any, file: str):
        self.doc = doc
        self.file = file
        self.changes: list[JsonEdit] = []

    def patch(self, operation: dict[str, Any], loc: str) -> None:
        """Apply one RFC 6902 operation in place, turning library errors into PlanErrors."""
        try:
            self.doc = jsonpatch.JsonPatch([operation]).apply(self.doc, in_place=True)
        except jsonpatch.JsonPatchTestFailed:
            actual = resolve(self.doc, operation["path"])
            shown = "it does not exist" if actual is MISSING else f"it is {_show(actual)}"
            raise PlanError(f"{self.file}: test {operation['path'] or '(whole document)'} "
                            f"failed: {shown}, the recipe expects "
                            f"{_show(operation['value'])}", where=loc) from None
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise PlanError(f"{self.file}: {operation['op']} {operation['path']}: "
                            f"{self.explain(operation, exc)}", where=loc) from None

    def explain(self, operation: dict[str, Any], exc: Exception) -> str:
        """Say which pointer is missing, if that is why ``operation`` failed."""
        path = operation["path"]
        needed = [operation["from"]] if "from" in operation else []
        if operation["op"] in ("remove", "replace", "test"):
            needed.append(path)
        elif path:
            needed.append(parent_pointer(path)[0])
        for pointer in needed:
            if resolve(self.doc, pointer) is MISSING:
                found, value = deepest_existing(self.doc, pointer)
                return (f"{pointer} does not exist ({found or 'the document'} is "
                        f"{_article(json_type(value))} without "
                        f"{split_pointer(pointer)[len(split_pointer(found))]!r})")
        return str(exc)

    def add_change(self, change: JsonEdit) -> None:
        self.changes.append(_plain(change))


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _show(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _plain(change: JsonEdit) -> JsonEdit:
    """Detach the change's values from the document (later ops may modify it)."""
    return JsonEdit(change.file, change.path, change.kind, copy.deepcopy(change.before),
                  copy.deepcopy(change.after), change.recipe_line, change.from_path, change.existed)


def _drop(state: _State, op: DropOp, scope: str) -> None:
    pointer = join_pointer(scope, op.path)
    before = resolve(state.doc, pointer)
    state.patch({"op": "remove", "path": pointer}, op.loc)
    state.add_change(JsonEdit(state.file, pointer, "removed", before, None, op.loc))


def _set(state: _State, op: SetOp, scope: str) -> None:
    pointer = join_pointer(scope, op.path)
    before = resolve(state.doc, pointer)
    if before is not MISSING and json_equal(before, op.value):
        return
    # Create missing parent objects, one level at a time (unless create_parents: false).
    tokens = split_pointer(pointer)
    scope_depth = len(split_pointer(scope))
    for depth in range(scope_depth + 1, len(tokens)):
        parent = make_pointer(tokens[:depth])
        value = resolve(state.doc, parent)
        if value is MISSING and not op.create_parents:
            raise PlanError(f"{state.file}: cannot set {pointer}: {parent} does not exist "
                            "(create_parents: false)", where=op.loc)
        if value is MISSING:
            state.patch({"op": "add", "path": parent, "value": {}}, op.loc)
        elif not isinstance(value, (dict, list)):
            raise PlanError(f"{state.file}: cannot set {pointer}: {parent} is a "
                            f"{json_type(value)}, not an object", where=op.loc)
    operation = "replace" if before is not MISSING else "add"
    state.patch({"op": operation, "path": pointer, "value": copy.deepcopy(op.value)}, op.loc)
    state.add_change(JsonEdit(state.file, pointer, "set", None if before is MISSING else before,
                            op.value, op.loc, existed=before is not MISSING))


def _rename(state: _State, op: RenameOp, scope: str) -> None:
    source = join_pointer(scope, op.path)
    target = join_pointer(scope, op.to)
    value = resolve(state.doc, source)
    if resolve(state.doc, target) is not MISSING:
        raise PlanError(f"{state.file}: cannot rename {source} to {target}: {target} already "
                        "exists (drop it first)", where=op.loc)
    parent, new_key = parent_pointer(target)
    if not isinstance(resolve(state.doc, parent), (dict, list)):
        raise PlanError(f"{state.file}: cannot rename {source} to {target}: "
                        f"{parent or 'the document'} is not an object", where=op.loc)
    old_parent, old_key = parent_pointer(source)
    container = resolve(state.doc, old_parent)
    order = list(container) if isinstance(container, dict) else None
    state.patch({"op": "move", "from": source, "path": target}, op.loc)
    if order is not None and old_parent == parent:
        # A rename within one object keeps the key's position.
        items = [(new_key if k == old_key else k, container[new_key if k == old_key else k])
                 for k in order]
        container.clear()
        container.update(items)
    state.add_change(JsonEdit(state.file, target, "renamed", value, value, op.loc,
                            from_path=source))


def _patch(state: _State, op: PatchOp, scope: str) -> None:
    operation = op.as_json_patch(scope)
    pointer = operation["path"]
    source = operation.get("from")
    before = resolve(state.doc, pointer)
    moved = resolve(state.doc, source) if source is not None else MISSING
    into_array = bool(pointer) and isinstance(resolve(state.doc, parent_pointer(pointer)[0]),
                                              list)
    if "value" in operation:
        operation["value"] = copy.deepcopy(operation["value"])
    state.patch(operation, op.loc)
    if op.op == "test":
        change = JsonEdit(state.file, pointer, "test", before, before, op.loc)
    elif op.op == "remove":
        change = JsonEdit(state.file, pointer, "removed", before, None, op.loc)
    elif op.op in ("move", "copy"):
        change = JsonEdit(state.file, pointer, "renamed" if op.op == "move" else "copied", moved,
                        moved, op.loc, from_path=source,
                        existed=before is not MISSING and not into_array)
    else:  # add, replace; an add into an array inserts
        existed = before is not MISSING and not (op.op == "add" and into_array)
        if existed and json_equal(before, op.value):
            return
        change = JsonEdit(state.file, pointer, "set", before if existed else None, op.value,
                        op.loc, existed=existed)
    state.add_change(change)


def _array(state: _State, op: ArrayOp, scope: str) -> None:
    from .config_arrays import apply_array_op

    apply_array_op(state, op, scope)


_APPLY = {DropOp: _drop, SetOp: _set, RenameOp: _rename, PatchOp: _patch, ArrayOp: _array}
