"""Recipe guards (``requires:``): conditions on a model's JSON files that must all hold.

A leaf condition reads one value, ``path`` in ``file``, and tests it with one predicate:
``exists`` (true/false), ``equals`` (JSON equality: ``1 == 1.0``, ``true != 1``), ``contains``
(an array holds an equal element, or a string holds a substring) or ``one_of`` (equals one of a
list). ``any_of``/``all_of``/``not`` combine conditions. ``in: [/, /text_config]`` on any
condition makes it hold if it holds with its pointers read inside ANY of those scopes (scopes
nest). A missing file reads as absent: only ``exists: false`` holds on it.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ..config.json_pointer import MISSING, join_pointer, json_equal, resolve
from ..errors import GuardRefused
from .schema import AllOf, AnyOf, Check, Condition, Not, Recipe

ReadJson = Callable[[str], Any]

_UNREAD = object()


def evaluate_guards(recipe: Recipe, read_json: Callable[[str], Any | None]) -> list[str]:
    """Evaluate every ``requires`` condition of ``recipe``.

    Args:
        read_json: ``read_json(file)`` returns the parsed JSON of a file in the model directory,
            or None if there is no such file. Each file is read at most once.
    Returns:
        One message per condition that does not hold, ``"recipe.yaml:LINE:COL: why"``, using
        the condition's ``message`` when it has one. Empty when the model passes.
    """
    cache: dict[str, Any] = {}

    def read(file: str) -> Any:
        value = cache.get(file, _UNREAD)
        if value is _UNREAD:
            value = cache[file] = read_json(file)
        return value

    failures = []
    for condition in recipe.requires:
        holds, why = evaluate(condition, read, "")
        if not holds:
            failures.append(f"{condition.loc}: {condition.message or why}")
    return failures


def evaluate(cond: Condition, read: ReadJson, prefix: str) -> tuple[bool, str]:
    """(holds, why it does not) for ``cond`` with its pointers read under ``prefix``."""
    reasons = []
    for scope in cond.scopes:
        holds, why = _evaluate_in(cond, read, join_pointer(prefix, scope))
        if holds:
            return True, ""
        reasons.append(why)
    reason = "; ".join(dict.fromkeys(reasons))
    if len(cond.scopes) > 1:
        reason = f"in none of the scopes {', '.join(s or '/' for s in cond.scopes)}: {reason}"
    return False, cond.message or reason


def _evaluate_in(cond: Condition, read: ReadJson, prefix: str) -> tuple[bool, str]:
    if isinstance(cond, Check):
        return _check(cond, read, join_pointer(prefix, cond.path))
    if isinstance(cond, Not):
        holds, _ = evaluate(cond.condition, read, prefix)
        return (not holds), f"expected not: {_describe(cond.condition, prefix)}"
    results = [evaluate(c, read, prefix) for c in cond.conditions]
    if isinstance(cond, AnyOf):
        if any(h for h, _ in results):
            return True, ""
        return False, "none of these holds: " + "; ".join(f"({w})" for _, w in results)
    if not isinstance(cond, AllOf):
        raise TypeError(f"not a recipe condition: {cond!r}")
    failed = [w for h, w in results if not h]
    return (not failed), "; ".join(failed)


def _show(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check(c: Check, read: ReadJson, pointer: str) -> tuple[bool, str]:
    data = read(c.file)
    where = f"{c.file} {pointer or '(whole document)'}"
    if data is None:
        return (c.predicate == "exists" and c.expected is False), f"there is no {c.file}"
    value = resolve(data, pointer)
    if c.predicate == "exists":
        if (value is not MISSING) == c.expected:
            return True, ""
        return False, (f"{where} is missing" if c.expected else
                       f"{where} is present ({_show(value)})")
    if value is MISSING:
        return False, f"{where} is missing"
    if c.predicate == "equals":
        return json_equal(value, c.expected), f"{where} is {_show(value)}, not {_show(c.expected)}"
    if c.predicate == "one_of":
        return (any(json_equal(value, e) for e in c.expected),
                f"{where} is {_show(value)}, not one of {_show(c.expected)}")
    # contains
    if isinstance(value, list):
        holds = any(json_equal(item, c.expected) for item in value)
    elif isinstance(value, str) and isinstance(c.expected, str):
        holds = c.expected in value
    else:
        holds = False
    return holds, f"{where} ({_show(value)}) does not contain {_show(c.expected)}"


def _describe(cond: Condition, prefix: str) -> str:
    """A positive statement of ``cond`` (for ``not`` failures)."""
    if cond.message:
        return cond.message
    parts = []
    for scope in cond.scopes:
        inner = join_pointer(prefix, scope)
        if isinstance(cond, Check):
            where = f"{cond.file} {join_pointer(inner, cond.path) or '(whole document)'}"
            verb = {"exists": "exists" if cond.expected else "does not exist",
                    "equals": f"is {_show(cond.expected)}",
                    "contains": f"contains {_show(cond.expected)}",
                    "one_of": f"is one of {_show(cond.expected)}"}[cond.predicate]
            parts.append(f"{where} {verb}")
        elif isinstance(cond, Not):
            parts.append(f"not ({_describe(cond.condition, inner)})")
        else:
            joiner = " or " if isinstance(cond, AnyOf) else " and "
            parts.append(joiner.join(f"({_describe(c, inner)})" for c in cond.conditions))
    return " or ".join(parts)


def check_guards(recipe: Recipe, read_json: Callable[[str], Any | None]) -> None:
    """Raise ``GuardRefused`` (exit code 1) if any ``requires`` guard does not hold."""
    failures = evaluate_guards(recipe, read_json)
    if failures:
        extra = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        err = GuardRefused(f"recipe {recipe.name!r} refuses this model: {failures[0]}{extra}")
        err.failures = failures
        raise err
