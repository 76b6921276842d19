"""Element operations on JSON arrays in recipe ``config:`` sections::

    - each: /quantization_config/ignore          # map: rewrite matching string elements
      match: {regex: '^language_model\\.'}
      replace: ''                                # re.sub replacement (\\1 groups allowed)
      in_step: true                              # and hf_quant_config.json's exclude_modules
    - each: /quantization_config/ignore          # filter: remove matching elements
      match: {glob: 'vision_tower.*'}
      remove: true
    - append: /quantization_config/ignore        # append unless an equal element is there
      value: lm_head

``in_step: true`` on an op for config.json's ``/quantization_config/ignore`` (compressed-
tensors) adds the same op for hf_quant_config.json's ``/quantization/exclude_modules``
(ModelOpt), and the other way round, so the two lists stay in step; the counterpart is skipped
where the model lacks it.
"""

from __future__ import annotations

import re
from typing import Any

from ..config.json_pointer import join_pointer, json_equal, resolve
from ..errors import PlanError
from . import checks as rc
from .regex_bound import per_name
from .schema import ArrayOp

ARRAY_KEYS = {"each": ("each", "match", "replace", "remove", "in", "missing_ok", "allow_empty",
                       "in_step"),
              "append": ("append", "value", "in", "missing_ok", "in_step")}
ARRAY_REQUIRED = {"each": ("match",), "append": ("value",)}
MATCH_KEYS = ("glob", "regex")                  # match: has one
EACH_ACTIONS = ("replace", "remove")            # each: has one (map, filter)
IN_STEP = {("config.json", "/quantization_config/ignore"):
           ("hf_quant_config.json", "/quantization/exclude_modules"),
           ("hf_quant_config.json", "/quantization/exclude_modules"):
           ("config.json", "/quantization_config/ignore")}


def parse_array_op(v: rc.Validator, node: Any, action: str, file: str | None,
                   pos: rc.Pos) -> list[tuple[str, ArrayOp]]:
    """[(file, op)]: the op, and its in-step counterpart when asked."""
    from .tensor_ops.parse import check_regex

    v.check_keys(node, ARRAY_KEYS[action], f"'{action}' operation")
    path = v.pointer(node, action, allow_root=False)
    scopes = v.scopes(node)
    missing_ok = v.boolean(node, "missing_ok", default=False)
    in_step = v.boolean(node, "in_step", default=False)
    loc = v.loc(pos)
    globs: tuple[str, ...] = ()
    regexes: tuple[str, ...] = ()
    to, value, kind = None, None, "append"
    if action == "append":
        if any(k not in node for k in ARRAY_REQUIRED["append"]):
            v.err(pos, "'append' needs 'value'")
            return []
        value = v.json_value(node["value"], rc.val_pos(node, "value"))
    else:
        match = node.get("match")
        if not rc.is_map(match) or len([k for k in MATCH_KEYS if k in match]) != 1:
            v.err(pos, "'each' needs match: {glob: ...} or match: {regex: ...}")
            return []
        v.check_keys(match, MATCH_KEYS, "match")
        key = "glob" if "glob" in match else "regex"
        patterns = v.strings(match, key) or ()
        if key == "regex" and not all(check_regex(v, p, pp) for p, pp in patterns):
            return []
        texts = tuple(p for p, _ in patterns)
        globs, regexes = (texts, ()) if key == "glob" else ((), texts)
        if sum(k in node for k in EACH_ACTIONS) != 1:
            v.err(pos, "'each' needs one of replace: TEXT (map) and remove: true (filter)")
            return []
        if "remove" in node:
            if node["remove"] is not True:
                v.err(rc.val_pos(node, "remove"), "remove must be true")
                return []
            kind = "filter"
        else:
            if key != "regex":
                v.err(rc.key_pos(node, "replace"), "replace needs match: {regex: ...} (it is "
                      "re.sub's replacement)")
                return []
            to = v.string(node, "replace", nonempty=False)
            kind = "map"
            try:
                for pattern in regexes:
                    re.compile(pattern).sub(to or "", "")
            except (re.error, IndexError) as exc:
                v.err(rc.val_pos(node, "replace"), f"invalid replacement {to!r}: "
                      f"{getattr(exc, 'msg', None) or exc}")
                return []
    if path is None or value is rc.INVALID:
        return []
    op = ArrayOp(kind, path, globs, regexes, to, value, scopes, missing_ok,
                 v.boolean(node, "allow_empty", default=False) if action == "each" else True, loc)
    out = [(file, op)]
    if in_step:
        other = IN_STEP.get((file, path))
        if other is None:
            v.err(rc.key_pos(node, "in_step"), "in_step applies to config.json "
                  "/quantization_config/ignore and hf_quant_config.json "
                  "/quantization/exclude_modules")
            return []
        out.append((other[0], ArrayOp(kind, other[1], globs, regexes, to, value, ("",),
                                      True, True, loc)))
    return out


def apply_array_op(state, op: ArrayOp, scope: str) -> None:
    """Apply ``op`` inside ``scope`` of ``state.doc`` (a config_ops._State)."""
    from .config_ops import JsonEdit  # config_ops imports this module when an array op runs

    pointer = join_pointer(scope, op.path)
    before = resolve(state.doc, pointer)
    if not isinstance(before, list):
        raise PlanError(f"{state.file}: {pointer} is not an array", where=op.loc)
    if op.action == "append":
        if any(json_equal(e, op.value) for e in before):
            return
        after = [*before, op.value]
    else:
        after, hits = _matched(op, before)
        if not hits:
            if op.allow_empty:
                return
            raise PlanError(f"{state.file}: no element of {pointer} matches "
                            f"{list(op.globs or op.regexes)}", where=op.loc,
                            hint="fix the pattern, or set allow_empty: true")
    if after == before:
        return
    state.patch({"op": "replace", "path": pointer, "value": after}, op.loc)
    state.add_change(JsonEdit(state.file, pointer, "set", before, after, op.loc))


def _matched(op: ArrayOp, before: list) -> tuple[list, int]:
    """The array after ``op`` (map or filter) and how many elements it matched, each element
    matched once, within the plan's regex budget (``recipe.regex_bound``)."""
    after, hits = [], 0
    with per_name(f"the {op.action} patterns {list(op.globs or op.regexes)}"[:200], op.loc,
                  len(before), kind="array element") as clock:
        for e in before:
            clock.start(e if isinstance(e, str) else "")
            if not op.matches(e):
                after.append(e)
                continue
            hits += 1
            if op.action == "map":
                after.append(_map(op, e))
    return after, hits


def _map(op: ArrayOp, element: str) -> str:
    for pattern in op.regexes:
        element = re.sub(pattern, op.to or "", element)
    return element
