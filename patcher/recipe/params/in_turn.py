"""The model's JSON files as a bound recipe leaves them, for the recipes given after it.

``apply R1 R2 MODEL`` is one plan, but it must mean what two applies in a row mean: R2's guards
and ``{config.KEY}`` references read the JSON files as R1 leaves them (its ``config:`` ops
applied, the files it drops absent, the JSON files it adds present), not the base.
"""

from __future__ import annotations

from typing import Any, Callable

from ...config.jsonfile import parse_json
from ..config_ops import apply_config_ops
from ..schema import Recipe

ReadJson = Callable[[str], Any]
_UNREAD = object()


def read_after(read_json: ReadJson, recipe: Recipe) -> ReadJson:
    """``read_json`` as it reads once ``recipe`` (bound: no templates left) has applied. An op
    that cannot apply raises the ``PlanError`` naming its line, as the plan would."""
    cache: dict[str, Any] = {}
    dropped = {op.path for op in recipe.files if op.kind == "drop"}
    added = {op.path: op for op in recipe.files if op.kind == "add"}

    def read(file: str) -> Any:
        value = cache.get(file, _UNREAD)
        if value is _UNREAD:
            value = cache[file] = _after(file)
        return value

    def _after(file: str) -> Any:
        if file in added:
            return parse_json(added[file].content.encode("utf-8"), file, constants=False)
        if file in dropped:
            return None
        document = read_json(file)
        ops = recipe.config.get(file)
        if document is None or not ops:
            return document
        return apply_config_ops(document, ops, file=file)[0]

    return read
