"""Tensor actions ``split``, ``scale`` and ``refuse``: their
validation into the dataclasses of ``tensor_ops.schema``. Planning is in
``patcher.tensors.scale_planning``, the arithmetic in ``patcher.tensors.scale_math``.

::

    - select: {glob: "*.self_attn.kv_scale"}
      split: {pattern: 'kv_scale$', to: [k_scale, v_scale]}   # byte-identical copies; the
                                                               # source is removed
    - select: {glob: "*.weight_scale_2"}
      scale: {reciprocal: nearest, reshape: [1], cast: F32}    # each step optional, in this
                                                               # order; at least one
    - select: {glob: ["*.k_bias", "*.v_bias"]}
      refuse: the affine KV cache has no compressed-tensors form   # a guard on tensor names

``reciprocal: exact`` refuses a value whose reciprocal does not give it back (the reverse
conversion could not restore it); ``reciprocal: nearest`` accepts the nearest value, as the
producers' converters compute it. ``cast`` refuses a value the target dtype cannot hold exactly.
``reshape`` keeps the element count. The exact rules are in README.md ("Scale math").
"""

from __future__ import annotations

import re
from typing import Any

from .. import checks as rc
from .dtype_names import canonical_dtype, dtype_problem
from .schema import ACTION_KEYS, ACTION_REQUIRED, RefuseTensors, ScaleTensors, SplitTensors

RECIPROCAL_MODES = ("exact", "nearest")
SCALE_DTYPES = ("F64", "F32", "F16", "BF16")    # what a scale may be read as and written as


def parse_refuse(v: rc.Validator, value: Any, pos: rc.Pos) -> RefuseTensors | None:
    message = v.check_string(value, pos, what="'refuse'")
    return None if message is None else RefuseTensors(message)


def parse_split(v: rc.Validator, value: Any, pos: rc.Pos, check_regex) -> SplitTensors | None:
    if not rc.is_map(value):
        v.err(pos, "split must be a mapping such as {pattern: 'kv_scale$', to: [k_scale, "
              f"v_scale]}}; got {rc.yaml_type(value)}")
        return None
    v.check_keys(value, ACTION_KEYS["split"], "split", required=ACTION_REQUIRED["split"])
    pattern = v.string(value, "pattern") if "pattern" in value else None
    names = v.strings(value, "to") if "to" in value else None
    if pattern is None or names is None:
        return None
    if not check_regex(v, pattern, rc.val_pos(value, "pattern")):
        return None
    if len(names) < 2:
        v.err(rc.val_pos(value, "to"), "split needs at least two names in 'to' (one name is "
              "a rename or a copy)")
        return None
    compiled = re.compile(pattern)
    for to, tpos in names:
        try:
            compiled.sub(to, "")
        except (re.error, IndexError) as exc:
            v.err(tpos, f"invalid replacement {to!r} for pattern {pattern!r}: "
                  f"{getattr(exc, 'msg', None) or exc}")
            return None
    if len({to for to, _ in names}) != len(names):
        v.err(rc.val_pos(value, "to"), "split names the same target twice")
        return None
    return SplitTensors(pattern, tuple(to for to, _ in names))


def parse_scale(v: rc.Validator, value: Any, pos: rc.Pos) -> ScaleTensors | None:
    if not rc.is_map(value):
        v.err(pos, "scale must be a mapping such as {reciprocal: nearest, reshape: [1]}; got "
              f"{rc.yaml_type(value)}")
        return None
    v.check_keys(value, ACTION_KEYS["scale"], "scale")
    if not any(k in value for k in ACTION_KEYS["scale"]):
        v.err(pos, "scale needs at least one of reciprocal, cast, reshape")
        return None
    reciprocal = cast = reshape = None
    ok = True
    if "reciprocal" in value:
        reciprocal = v.choice(value, "reciprocal", RECIPROCAL_MODES)
        ok = reciprocal is not None
    if "cast" in value:
        cast = _scale_dtype(v, value)
        ok = ok and cast is not None
    if "reshape" in value:
        raw = value["reshape"]
        if not (rc.is_seq(raw) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                       for d in raw)):
            v.err(rc.val_pos(value, "reshape"), "reshape must be a list of sizes, e.g. [1], "
                  "or [] for a scalar")
            ok = False
        else:
            reshape = tuple(int(d) for d in raw)
    return ScaleTensors(reciprocal, cast, reshape) if ok else None


def _scale_dtype(v: rc.Validator, value: Any) -> str | None:
    spelling = v.check_string(value["cast"], rc.val_pos(value, "cast"), what="'cast'")
    if spelling is None:
        return None
    problem = dtype_problem(spelling, SCALE_DTYPES)
    if problem:
        v.err(rc.val_pos(value, "cast"), f"cast: {problem}")
        return None
    return canonical_dtype(spelling)
