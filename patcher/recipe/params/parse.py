"""Recipe ``params:``, ``include:`` and ``{reference}`` templates: parsing and typing.

::

    params:
      factor: {type: number, default: 4, description: YaRN scaling factor}
    include:
      - fix-eos                                   # a built-in name, or
      - {recipe: ./other.yaml, params: {x: "{factor}"}}   # a path relative to this recipe
    config:
      config.json:
        - set: /rope_scaling/factor
          value: "{factor}"                       # the typed value, see patcher.recipe.params.expr

Templates are parsed when the recipe loads (a syntax error or an unknown name is a recipe error
naming the line); they are evaluated when the recipe is bound to a model
(``patcher.recipe.params.bind``).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any, Callable

from ...errors import InputError, TemplateError
from .. import checks as rc
from ..schema import (
    LAYER_COMPARISONS,
    PARAM_TYPES,
    REQUIRED,
    ArrayOp,
    Param,
    PatchOp,
    SetOp,
    TensorOp,
)
from .expr import CONFIG_FILES, Template, config_ref, parse_template, walk_templates

PARAM_KEYS = ("type", "default", "description", "minimum", "maximum", "exclusive_minimum",
              "enum")
# the range keys that bound a number, and the types they apply to (integers: each item)
BOUND_KEYS = ("minimum", "maximum", "exclusive_minimum")
NUMERIC_TYPES = ("integer", "number", "integers")
ENUM_TYPES = ("string", "integer", "number")
PARAM_REQUIRED = ("type", "description")
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_PARAM_NAMES = tuple(CONFIG_FILES)      # {config.KEY} and the like read the model
# the comparisons of ``layers:``, longest first so that ">=" is not read as ">"
LAYER_OPERATORS = "|".join(re.escape(c) for c in sorted(LAYER_COMPARISONS, key=len, reverse=True))
_LAYERS_RE = re.compile(rf"\s*({LAYER_OPERATORS})\s*(.+?)\s*\Z")


def parse_params(v: rc.Validator, root: Any) -> tuple[Param, ...]:
    node = root.get("params")
    if node is None:
        return ()
    if not rc.is_map(node):
        v.err(rc.val_pos(root, "params"), "params: must map parameter names to "
              f"{{type, default, description}}; got {rc.yaml_type(node)}")
        return ()
    out = []
    for name in node:
        pos = rc.key_pos(node, name)
        spec = node[name]
        if not isinstance(name, str) or not PARAM_NAME_RE.fullmatch(name) \
                or name in RESERVED_PARAM_NAMES:
            v.err(pos, f"parameter name {name!r} must be an identifier ([A-Za-z_][A-Za-z0-9_]*) "
                  "and not a config file name")
            continue
        if not rc.is_map(spec):
            v.err(rc.val_pos(node, name), f"parameter {name}: needs {{type, default, "
                  f"description}}; got {rc.yaml_type(spec)}")
            continue
        v.check_keys(spec, PARAM_KEYS, f"parameter {name!r}", required=PARAM_REQUIRED)
        kind = v.choice(spec, "type", PARAM_TYPES)
        description = v.string(spec, "description")
        ranges = _parse_range(v, spec, name, kind)
        default = REQUIRED
        if "default" in spec and kind is not None:
            value = v.json_value(spec["default"], rc.val_pos(spec, "default"))
            problem = None if value is rc.INVALID else type_problem(kind, value)
            if problem is None and value is not rc.INVALID:
                problem = range_problem(Param(name, kind, value, "", "", **ranges), value)
            if problem:
                v.err(rc.val_pos(spec, "default"), f"parameter {name}: default {problem}")
            default = value
        if kind is not None and description is not None:
            out.append(Param(name, kind, default, description, v.loc(pos), **ranges))
    return tuple(out)


def _parse_range(v: rc.Validator, spec: Any, name: str, kind: str | None) -> dict[str, Any]:
    """The declared ``minimum``/``maximum``/``exclusive_minimum``/``enum`` of a parameter."""
    out: dict[str, Any] = {}
    for key in BOUND_KEYS:
        if key not in spec or kind is None:
            continue
        pos = rc.val_pos(spec, key)
        value = v.json_value(spec[key], pos)
        if kind not in NUMERIC_TYPES:
            v.err(pos, f"parameter {name}: {key} bounds a number; {name} is {_article(kind)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            v.err(pos, f"parameter {name}: {key} must be a number")
        else:
            out[key] = value
    low = out.get("minimum", out.get("exclusive_minimum"))
    if low is not None and "maximum" in out and low > out["maximum"]:
        v.err(rc.val_pos(spec, "maximum"), f"parameter {name}: maximum {out['maximum']} is "
              f"below its lower bound {low}: no value fits")
    if "enum" in spec and kind is not None:
        pos = rc.val_pos(spec, "enum")
        values = v.json_value(spec["enum"], pos)
        if kind not in ENUM_TYPES:
            v.err(pos, f"parameter {name}: enum lists values of a string, integer or number; "
                  f"{name} is {_article(kind)}")
        elif not isinstance(values, list) or not values:
            v.err(pos, f"parameter {name}: enum must be a non-empty list of values")
        else:
            wrong = [x for x in values if type_problem(kind, x)]
            if wrong:
                v.err(pos, f"parameter {name}: enum value {json.dumps(wrong[0])} is not "
                      f"{_article(kind)}")
            else:
                out["enum"] = tuple(values)
    return out


def range_problem(param: Param, value: Any) -> str | None:
    """Why ``value`` (of the parameter's type) is outside the parameter's declared range, or
    None. An ``integers`` parameter's bounds apply to each item."""
    if param.enum is not None and value not in param.enum:
        return (f"{json.dumps(value)} is not one of "
                f"{', '.join(json.dumps(x) for x in param.enum)}")
    items = value if param.type == "integers" else [value]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if param.minimum is not None and item < param.minimum:
            return f"{json.dumps(item)} is below the minimum {param.minimum}"
        if param.exclusive_minimum is not None and item <= param.exclusive_minimum:
            return f"{json.dumps(item)} is not above {param.exclusive_minimum} (exclusive_minimum)"
        if param.maximum is not None and item > param.maximum:
            return f"{json.dumps(item)} is above the maximum {param.maximum}"
    return None


def range_text(param: Param) -> str:
    """The declared range for people: ``> 0, <= 1``, ``one of "a", "b"``; empty if none."""
    parts = []
    if param.exclusive_minimum is not None:
        parts.append(f"> {param.exclusive_minimum}")
    if param.minimum is not None:
        parts.append(f">= {param.minimum}")
    if param.maximum is not None:
        parts.append(f"<= {param.maximum}")
    if param.enum is not None:
        parts.append("one of " + ", ".join(json.dumps(x) for x in param.enum))
    return ", ".join(parts)


def type_problem(kind: str, value: Any) -> str | None:
    """Why ``value`` is not of parameter type ``kind``, or None."""
    ok = {"string": isinstance(value, str), "token": isinstance(value, str),
          "integer": isinstance(value, int) and not isinstance(value, bool),
          "number": isinstance(value, (int, float)) and not isinstance(value, bool),
          "boolean": isinstance(value, bool),
          "list": isinstance(value, list),
          "integers": isinstance(value, list) and bool(value) and all(
              isinstance(x, int) and not isinstance(x, bool) for x in value)}[kind]
    return None if ok else f"{json.dumps(value)} is not {_article(kind)}"


def _article(kind: str) -> str:
    if kind == "integers":
        return "a non-empty list of integers"
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def parse_set_value(param: Param, text: str) -> Any:
    """The typed value of ``--set NAME=TEXT`` for ``param``; InputError if it does not fit."""
    try:
        if param.type in ("string", "token"):
            return text
        if param.type == "integer":
            return int(text)
        if param.type == "number":
            return int(text) if re.fullmatch(r"[-+]?\d+", text.strip()) else _finite(text)
        if param.type == "boolean":
            low = text.strip().lower()
            if low in ("true", "yes", "1", "false", "no", "0"):
                return low in ("true", "yes", "1")
            raise ValueError(text)
        value = _json(text, MAX_SET_DEPTH) if text.strip().startswith("[") else \
            [_scalar(t.strip()) for t in text.split(",") if t.strip()]
        if not isinstance(value, list) or type_problem(param.type, value):
            raise ValueError(text)
        return value
    except InputError as exc:                # from _json: NaN/Infinity, or nested too deep
        raise InputError(f"--set {param.name}={_shown(text)}: {exc.message}",
                         hint=f"{param.name}: {param.description}") from None
    except ValueError:
        raise InputError(f"--set {param.name}={_shown(text)}: not {_article(param.type)}",
                         hint=f"{param.name}: {param.description}") from None


# ``--set NAME=[...]`` nests at most this deep (lists of lists of scalars or small objects)
MAX_SET_DEPTH = 4


def _json(text: str, max_depth: int) -> Any:
    """Strict JSON: ValueError if it is not JSON; InputError for NaN and Infinity, and for
    nesting deeper than ``max_depth`` (refused before the parser's recursion could fail)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:                          # bracket depth outside strings
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    if deepest > max_depth:
        raise InputError(f"nested deeper than {MAX_SET_DEPTH} levels")
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise InputError(f"{name} is not a finite number")


def _shown(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _finite(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(text)
    return value


def _scalar(text: str) -> Any:
    """One item of ``--set NAME=a,b,c``: JSON when it parses as plain data (inside the list,
    so one level less deep), else the text itself."""
    try:
        return _json(text, MAX_SET_DEPTH - 1)
    except ValueError:
        return text


# ------------------------------------------------------------------------------ templates

def template_value(v: rc.Validator, value: Any, pos: rc.Pos, names: set[str]) -> Any:
    """``value`` with every string that holds a reference parsed into a ``Template``; problems
    (syntax, unknown names) are recorded at ``pos``."""
    def convert(item: Any) -> Any:
        if isinstance(item, str):
            try:
                template = parse_template(item)
            except TemplateError as exc:
                v.err(pos, str(exc))
                return item
            if template is not None:
                for ref in template.refs:
                    if ref not in names and config_ref(ref) is None:
                        v.err(pos, f"{{{ref}}} is neither a parameter of this recipe ("
                              f"{', '.join(sorted(names)) or 'none declared'}) nor config.KEY, "
                              "generation_config.KEY, tokenizer_config.KEY, hf_quant_config.KEY, "
                              "compressed_tensors_ignore.KEY")
            return item if template is None else template
        if isinstance(item, dict):
            return {k: convert(x) for k, x in item.items()}
        if isinstance(item, list):
            return [convert(x) for x in item]
        return item
    return convert(value)


def pos_of_loc(loc: str) -> rc.Pos:
    line, col = loc.rsplit(":", 2)[1:]
    return int(line), int(col)


def template_ops(v: rc.Validator, config: dict, names: set[str]) -> dict:
    """The config ops with their values templated."""
    out = {}
    for file, ops in config.items():
        new = []
        for op in ops:
            if isinstance(op, (SetOp, PatchOp, ArrayOp)) and op.value is not None \
                    and getattr(op, "source", None) is None:      # from: content is data
                op = replace(op, value=template_value(v, op.value, pos_of_loc(op.loc), names))
            new.append(op)
        out[file] = tuple(new)
    return out


def parse_layers(v: rc.Validator, node: Any, pos: rc.Pos, names: set[str]):
    """``layers: ">= {config.num_hidden_layers}"`` -> (comparison, int or Template)."""
    text = str(node) if isinstance(node, (str, int)) and not isinstance(node, bool) else None
    found = _LAYERS_RE.match(text) if text is not None else None
    if found is None:
        v.err(pos, "layers: must be a comparison and a layer index, such as '>= 61' or "
              "'>= {config.num_hidden_layers}' (one of " + ", ".join(LAYER_COMPARISONS) + ")")
        return None
    bound = found.group(2)
    if re.fullmatch(r"\d+", bound):
        return found.group(1), int(bound)
    template = template_value(v, bound, pos, names)
    if not isinstance(template, Template):
        v.err(pos, f"layers: {bound!r} is neither an integer nor a {{reference}} expression")
        return None
    return found.group(1), template


def bind_tensor_ops(tensors: tuple[TensorOp, ...],
                    evaluate: Callable[[Any, str], Any]) -> tuple[TensorOp, ...]:
    """The tensor ops with their ``layers:`` bounds evaluated (PlanError naming the line)."""
    from ...errors import PlanError

    out = []
    for op in tensors:
        layers = op.select.layers
        if layers is not None and isinstance(layers[1], Template):
            bound = evaluate(layers[1], op.select.loc)
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise PlanError(f"layers: {layers[1].source!r} is {bound!r}, not an integer "
                                "layer index", where=op.select.loc)
            op = replace(op, select=replace(op.select, layers=(layers[0], bound)))
        out.append(op)
    return tuple(out)


def has_templates(value: Any) -> bool:
    found = []
    walk_templates(value, lambda t: found.append(t))
    return bool(found)
