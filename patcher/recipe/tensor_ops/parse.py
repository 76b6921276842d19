"""The ``tensors:`` section of a recipe: structure validation into ``TensorOp`` dataclasses.

Each item selects tensors and names exactly one action::

    - select: {glob: "*.k_proj.k_scale", dtype: [F32]}   # or regex: '...'; str or list
      allow_empty: false
      # refuse_empty: "why"   (instead: when it matches nothing, the recipe refuses the model)
      # when: {file: config.json, path: /kv_lora_rank, exists: true, in: [/, /text_config]}
      #       (a condition as in requires:; where it does not hold, the operation is skipped)
      drop: true
      # rename: {pattern: '^language_model\\.', to: 'model.'}  (re.sub; pattern defaults to the
      #                                                        select regex)
      # cast: bf16 | fp16 | fp32
      # split: {pattern: 'kv_scale$', to: [k_scale, v_scale]}   (see split_scale)
      # scale: {reciprocal: exact | nearest, cast: F32, reshape: [1]}
      # refuse: "why"   (a guard: exit 1 when the selection matches a tensor)
      # dequantize: {scheme: fp8-tensor | fp8-block | nvfp4-modelopt |
      #              nvfp4-compressed-tensors | mxfp4-gpt-oss | auto,
      #              to: bf16 | fp16 | fp32,   (to: bf16)
      #              block: [128, 128]}   (fp8-block/auto; default: the config's
      #                                    weight_block_size, else 128x128)
      # quantize: {scheme: fp8-tensor | fp8-block | nvfp4-compressed-tensors,
      #            layout: modelopt | deepseek | compressed-tensors, block: [128, 128]}
      #            (nvfp4-compressed-tensors: layout compressed-tensors, weights only)

Executing them is the tensor engine's job; this module only checks what can be checked without a
model: keys, types, regexes and replacement templates, dtype names, scheme/layout pairs.
Dtypes take any spelling ``dtype_names`` knows (BF16, bf16, bfloat16...), stored canonical.
"""

from __future__ import annotations

import re
from typing import Any

from .. import checks as rc
from ..schema import (
    DEFAULT_BLOCK,
    DEQUANT_SCHEMES,
    FLOAT_TARGETS,
    QUANT_COMBINATIONS,
    QUANT_LAYOUTS,
    QUANT_SCHEMES,
    CastTensors,
    CopyTensors,
    DequantizeTensors,
    DropTensors,
    QuantizeTensors,
    RenameTensors,
    TensorAction,
    TensorOp,
    TensorSelect,
)
from .dtype_names import canonical_dtype, dtype_problem
from .schema import ACTION_KEYS, ACTION_REQUIRED, DEQUANT_BLOCK_SCHEMES, QUANT_BLOCK_SCHEMES
from .split_scale import parse_refuse, parse_scale, parse_split

TENSOR_ACTIONS = ("drop", "rename", "copy", "split", "scale", "refuse", "cast", "dequantize",
                  "quantize")
TENSOR_KEYS = ("select", "allow_empty", "refuse_empty", "refuse_unless_equal", "when",
               *TENSOR_ACTIONS)
TENSOR_REQUIRED = ("select",)
PATTERN_KEYS = ("glob", "regex")                # a select has one, or layers/group alone
SELECT_KEYS = (*PATTERN_KEYS, "dtype", "layers", "group")


def parse_tensor_op(v: rc.Validator, node: Any, pos: rc.Pos) -> TensorOp | None:
    if not rc.is_map(node):
        v.err(pos, "a tensor operation must be a mapping such as {select: {glob: '*.k_scale'}, "
              f"drop: true}}; got {rc.yaml_type(node)}")
        return None
    unknown = v.check_keys(node, TENSOR_KEYS, "tensor operation", required=TENSOR_REQUIRED)
    actions = [k for k in node if k in TENSOR_ACTIONS]
    select = _select(v, node["select"], rc.val_pos(node, "select")) if "select" in node else None
    allow_empty = v.boolean(node, "allow_empty", default=False)
    refuse_empty = v.string(node, "refuse_empty")
    unless_equal = v.string(node, "refuse_unless_equal")
    when = None
    if "when" in node:
        from ..sections import parse_condition

        when = parse_condition(v, node["when"], rc.val_pos(node, "when"))
    if refuse_empty is not None and allow_empty:
        v.err(rc.key_pos(node, "refuse_empty"), "refuse_empty: and allow_empty: true "
              "contradict each other (give one)")
    if not actions:
        if not unknown:
            v.err(pos, "a tensor operation needs one of: " + ", ".join(TENSOR_ACTIONS))
        return None
    if len(actions) > 1:
        v.err(rc.key_pos(node, actions[1]), f"one action per tensor operation; found "
              f"{actions[0]!r} and {actions[1]!r} (write two list items)")
        return None
    action = _action(v, node, actions[0], select)
    if select is None or action is None:
        return None
    return TensorOp(select, action, allow_empty or action.kind == "refuse", v.loc(pos),
                    refuse_empty, unless_equal, when)


def _select(v: rc.Validator, node: Any, pos: rc.Pos) -> TensorSelect | None:
    if not rc.is_map(node):
        v.err(pos, "select must be a mapping such as {glob: '*.weight'} or {regex: '...'}; got "
              f"{rc.yaml_type(node)}")
        return None
    v.check_keys(node, SELECT_KEYS, "select")
    kinds = [k for k in PATTERN_KEYS if k in node]
    layers = groups = None
    if "layers" in node:
        from ..params.parse import parse_layers

        layers = parse_layers(v, node["layers"], rc.val_pos(node, "layers"),
                              getattr(v, "param_names", set()))
        if layers is None:
            return None
    if "group" in node:
        groups = _groups(v, node)
        if groups is None:
            return None
    if len(kinds) > 1 or (not kinds and layers is None and groups is None):
        v.err(pos, "select needs exactly one of 'glob' and 'regex' (or 'layers' or 'group' alone)")
        return None
    patterns = v.strings(node, kinds[0]) if kinds else ()
    if patterns is None:
        return None
    ok = True
    if kinds and kinds[0] == "regex":
        for pattern, ppos in patterns:
            ok = check_regex(v, pattern, ppos) and ok
    dtypes = None
    if "dtype" in node:
        names = v.strings(node, "dtype")
        if names is None:
            return None
        for name, npos in names:
            problem = dtype_problem(name)
            if problem:
                v.err(npos, problem)
                ok = False
        dtypes = tuple(canonical_dtype(name) for name, _ in names)
    if not ok:
        return None
    texts = tuple(p for p, _ in patterns)
    glob = bool(kinds) and kinds[0] == "glob"
    return TensorSelect(texts if glob else (), () if glob else texts, dtypes, v.loc(pos),
                        layers=layers, groups=groups)


def _groups(v: rc.Validator, node: Any) -> tuple[str, ...] | None:
    """``group: attention`` or a list: the module groups ``inspect`` reports."""
    from ...model.inspect_model import GROUP_NAMES

    names = v.strings(node, "group")
    if names is None:
        return None
    for name, npos in names:
        if name not in GROUP_NAMES:
            v.err(npos, f"unknown module group {name!r} (one of {', '.join(GROUP_NAMES)})")
            return None
    return tuple(name for name, _ in names)


def check_regex(v: rc.Validator, pattern: str, pos: rc.Pos) -> bool:
    try:
        re.compile(pattern)
        risk = backtracking_risk(pattern)
    except re.error as exc:
        v.err(pos, f"invalid regex {pattern!r}: {exc.msg}"
              + (f" at position {exc.pos}" if exc.pos is not None else ""))
        return False
    except RecursionError:
        v.err(pos, f"regex {pattern[:40]!r}... is nested too deeply")
        return False
    if risk:
        v.err(pos, f"regex {pattern!r} can backtrack catastrophically ({risk}); rewrite it "
              "without a repeat around a repeat or around alternatives that start alike, or "
              "make the inner part possessive (a++) or atomic ((?>...))")
        return False
    return True


def check_replacement(v: rc.Validator, pattern: str, to: str, pos: rc.Pos) -> bool:
    """``to`` is a valid ``re.sub`` replacement for ``pattern`` (a checked regex): compiling
    the template makes bad group references fail here, not at plan time."""
    try:
        re.compile(pattern).sub(to, "")
    except (re.error, IndexError) as exc:
        v.err(pos, f"invalid replacement {to!r} for pattern {pattern!r}: "
              f"{getattr(exc, 'msg', None) or exc}")
        return False
    return True


# --- catastrophic backtracking -----------------------------------------------------------------
# Python's re has no timeout, and a recipe regex runs against every tensor name of a model. A
# pattern is refused when a repeat that can run more than once (``*``, ``+``, ``{m,n}`` with
# n > 1) contains an unbounded repeat, or contains alternatives that do not all start with
# distinct literal characters: the two shapes of exponential backtracking (``(a+)+``,
# ``(.*a){20}``, ``(a|aa)+``, ``(\w|\d)*``). The check is conservative; possessive repeats and
# atomic groups never backtrack into themselves and are allowed.

try:
    from re import _constants as _sre  # Python 3.11+
    from re import _parser as _sre_parse
except ImportError:                                             # pragma: no cover
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT)
_ATOMIC = tuple(getattr(_sre, n) for n in ("ATOMIC_GROUP", "POSSESSIVE_REPEAT") if hasattr(_sre, n))


def backtracking_risk(pattern: str) -> str | None:
    """Why ``pattern`` can backtrack exponentially, or None (see the comment above)."""
    return _risk(_sre_parse.parse(pattern))


def _children(op, av) -> list:
    """The sub-patterns of one parsed item."""
    if op in _REPEATS or op is getattr(_sre, "POSSESSIVE_REPEAT", None):
        return [av[2]]
    if op is getattr(_sre, "ATOMIC_GROUP", None):
        return [av]
    if op is _sre.SUBPATTERN:
        return [av[-1]]
    if op is _sre.BRANCH:
        return list(av[1])
    if op in (_sre.ASSERT, _sre.ASSERT_NOT):
        return [av[1]]
    if op is _sre.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    return []


def _risk(items) -> str | None:
    for op, av in items:
        if op in _REPEATS and (av[1] > 1 or av[1] == _sre.MAXREPEAT):
            if _holds_unbounded_repeat(av[2]):
                return "a repeat inside a repeat"
            if _holds_ambiguous_branch(av[2]):
                return "repeated alternatives that can match alike"
        for child in _children(op, av):
            found = _risk(child)
            if found:
                return found
    return None


def _holds_unbounded_repeat(items) -> bool:
    for op, av in items:
        if op in _ATOMIC:
            continue
        if op in _REPEATS and av[1] == _sre.MAXREPEAT:
            return True
        if any(_holds_unbounded_repeat(c) for c in _children(op, av)):
            return True
    return False


def _holds_ambiguous_branch(items) -> bool:
    for op, av in items:
        if op in _ATOMIC:
            continue
        if op is _sre.BRANCH:
            firsts = [alt[0] if len(alt) else None for alt in av[1]]
            literals = [f[1] for f in firsts if f is not None and f[0] is _sre.LITERAL]
            if len(literals) != len(firsts) or len(set(literals)) != len(literals):
                return True
        if any(_holds_ambiguous_branch(c) for c in _children(op, av)):
            return True
    return False


def _action(v: rc.Validator, node: Any, action: str,
            select: TensorSelect | None) -> TensorAction | None:
    value = node[action]
    pos = rc.val_pos(node, action)
    if action == "drop":
        if value is not True:
            v.err(pos, "drop must be true (leave the item out to keep the tensors)")
            return None
        return DropTensors()
    if action == "cast":
        to = _float_target(v, node, "cast")
        return None if to is None else CastTensors(to)
    if action == "split":
        return parse_split(v, value, pos, check_regex)
    if action == "scale":
        return parse_scale(v, value, pos)
    if action == "refuse":
        return parse_refuse(v, value, pos)
    if not rc.is_map(value):
        example = {"rename": "{pattern: '^old\\.', to: 'new.'}",
                   "copy": "{pattern: 'embed_tokens', to: 'lm_head'}",
                   "dequantize": "{scheme: auto, to: bf16}",
                   "quantize": "{scheme: fp8-block, layout: deepseek}"}[action]
        v.err(pos, f"{action} must be a mapping such as {example}; got {rc.yaml_type(value)}")
        return None
    if action in ("rename", "copy"):
        renamed = _rename(v, value, pos, select, action)
        if renamed is None or action == "rename":
            return renamed
        return CopyTensors(renamed.pattern, renamed.to)
    if action == "dequantize":
        return _dequantize(v, value)
    v.check_keys(value, ACTION_KEYS["quantize"], "quantize", required=ACTION_REQUIRED["quantize"])
    if value.get("scheme") == "nvfp4-modelopt":
        v.err(rc.val_pos(value, "scheme"), "ModelOpt NVFP4 is W4A4: its input_scale needs a "
              "calibration, which quantizing weights cannot give; use {scheme: "
              "nvfp4-compressed-tensors, layout: compressed-tensors} (weights only, NVFP4A16)")
        return None
    scheme = v.choice(value, "scheme", QUANT_SCHEMES)
    layout = v.choice(value, "layout", QUANT_LAYOUTS)
    if scheme is None or layout is None:
        return None
    if (scheme, layout) not in QUANT_COMBINATIONS:
        fits = [lay for s, lay in QUANT_COMBINATIONS if s == scheme]
        v.err(rc.val_pos(value, "layout"), f"layout {layout!r} has no {scheme} format (use "
              f"{' or '.join(fits)})")
        return None
    if "block" not in value:
        return QuantizeTensors(scheme, layout,
                               DEFAULT_BLOCK if scheme in QUANT_BLOCK_SCHEMES else None)
    block = _block(v, value, scheme, QUANT_BLOCK_SCHEMES)
    return None if block is None else QuantizeTensors(scheme, layout, block)


def _float_target(v: rc.Validator, node: Any, key: str) -> str | None:
    """The canonical name of the cast/dequantize target at ``key`` (any spelling of BF16, F16
    or F32), or None after recording the problem."""
    spelling = v.check_string(node[key], rc.val_pos(node, key), what=f"{key!r}")
    if spelling is None:
        return None
    problem = dtype_problem(spelling, FLOAT_TARGETS)
    if problem:
        v.err(rc.val_pos(node, key), f"{key}: {problem}")
        return None
    return canonical_dtype(spelling)


def _dequantize(v: rc.Validator, value: Any) -> DequantizeTensors | None:
    v.check_keys(value, ACTION_KEYS["dequantize"], "dequantize",
                 required=ACTION_REQUIRED["dequantize"])
    scheme = v.choice(value, "scheme", DEQUANT_SCHEMES)
    to = _float_target(v, value, "to") if "to" in value else "BF16"
    if scheme is None or to is None:
        return None
    if "block" not in value:
        return DequantizeTensors(scheme, to)
    block = _block(v, value, scheme, DEQUANT_BLOCK_SCHEMES)
    return None if block is None else DequantizeTensors(scheme, to, block)


def _block(v: rc.Validator, value: Any, scheme: str,
           schemes: tuple[str, ...]) -> tuple[int, int] | None:
    """``value['block']`` as ``(bm, bn)``, or None after reporting why it is not one."""
    if scheme not in schemes:
        v.err(rc.key_pos(value, "block"), f"block applies to {' or '.join(schemes)}, not "
              f"{scheme}")
        return None
    raw = value["block"]
    if not (rc.is_seq(raw) and len(raw) == 2 and all(
            isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in raw)):
        v.err(rc.val_pos(value, "block"), "block must be two positive integers, e.g. "
              "[128, 128]")
        return None
    return (int(raw[0]), int(raw[1]))


def _rename(v: rc.Validator, value: Any, pos: rc.Pos, select: TensorSelect | None,
            action: str = "rename") -> RenameTensors | None:
    v.check_keys(value, ACTION_KEYS[action], action, required=ACTION_REQUIRED[action])
    to = v.string(value, "to", nonempty=False)
    if "pattern" in value:
        pattern = v.string(value, "pattern")
        ppos = rc.val_pos(value, "pattern")
        if pattern is None or not check_regex(v, pattern, ppos):
            return None
    elif select is not None and len(select.regexes) == 1:
        pattern, ppos = select.regexes[0], pos
    else:
        if select is not None:
            v.err(pos, f"{action} needs 'pattern' unless select has exactly one regex")
        return None
    if to is None or not check_replacement(v, pattern, to, rc.val_pos(value, "to")):
        return None
    return RenameTensors(pattern, to)
