"""The value schema of every recipe key, by section (``"*"``: the keys that mean the same
everywhere), and the two builders ``patcher.recipe.json_schema`` makes each object of the recipe's
JSON Schema with: ``properties`` of some keys, ``strict`` (an object of exactly those keys)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..model.inspect_model import GROUP_NAMES
from .json_schema_parts import (
    ANY,
    BOOLEAN,
    REGEX,
    block_pair,
    one_or_many,
    ref,
)
from .params import parse as params
from .schema import PARAM_TYPES

IN_STEP = {"type": "boolean", "description": "Also apply to the counterpart list: config.json "
           "/quantization_config/ignore <-> hf_quant_config.json /quantization/exclude_modules "
           "(skipped where missing)."}

# The value of each key, by section; ``"*"`` holds those that mean the same everywhere.
_VALUES: dict[str, dict[str, Any]] = {
    "*": {"in": ref("scopes"), "missing_ok": BOOLEAN, "message": ref("nonEmptyString"),
          "value": ANY, "allow_empty": BOOLEAN, "in_step": IN_STEP, "sha256": ref("sha256Pin")},
    "condition": {"file": ref("fileName"), "path": ref("pointer"), "exists": BOOLEAN,
                  "equals": ANY, "contains": ANY, "one_of": {"type": "array", "minItems": 1},
                  "any_of": {"type": "array", "items": ref("condition"), "minItems": 1},
                  "all_of": {"type": "array", "items": ref("condition"), "minItems": 1},
                  "not": ref("condition")},
    "config": {"drop": ref("innerPointer"), "set": ref("innerPointer"),
               "rename": ref("innerPointer"), "to": ref("innerPointer"),
               "create_parents": {"type": "boolean", "default": True, "description":
                                  "false: a missing parent object is an error instead of "
                                  "being created."},
               "from": {"$ref": "#/$defs/contentSource", "description":
                        "Instead of value: the text of this source, or with #/POINTER the "
                        "JSON value there."},
               "architectures": {"type": "array", "minItems": 1,
                                 "items": ref("nonEmptyString")},
               "model_type": ref("nonEmptyString"),
               "path": ref("pointer"), "each": ref("innerPointer"),
               "append": ref("innerPointer"), "replace": {"type": "string"},
               "remove": {"const": True}},
    "patch": {"path": ref("pointer"), "from": ref("pointer")},
    "file": {"drop": ref("fileName"), "add": ref("fileName"), "content": {"type": "string"},
             "overwrite": BOOLEAN, "from": ref("contentSource")},
    "tensor": {"select": ref("select"), "when": {
                   "$ref": "#/$defs/condition", "description": "A condition as in requires: "
                   "where it does not hold on the model, the operation is skipped."},
               "refuse_empty": {
                   "$ref": "#/$defs/nonEmptyString", "description": "When the selection "
                   "matches no tensor, the recipe refuses the model (exit 1) with this reason, "
                   "instead of the error an empty selection is."},
               "refuse_unless_equal": {
                   "$ref": "#/$defs/nonEmptyString", "description": "A guard on tensor "
                   "values: refuse the model (exit 1) unless every selected tensor has the "
                   "dtype, shape and bytes of the tensor named here."},
               "drop": {"const": True}, "cast": ref("floatTarget"),
               "refuse": {"type": "string", "minLength": 1, "description": "A guard on tensor "
                          "names: refuse the model (exit 1) when the selection matches a "
                          "tensor; the text says why."}},
    "action": {"pattern": REGEX, "to": {"type": "string"},
               "reshape": {"type": "array", "items": {"type": "integer", "minimum": 0},
                           "description": "The new shape, with the same element count: [1], "
                                          "or [] for a scalar."},
               "block": block_pair()},
    "select": {"glob": ref("patterns"), "regex": ref("regexes"),
               "dtype": one_or_many(ref("dtype")),
               "layers": {"type": ["string", "integer"],
                          "pattern": rf"^\s*({params.LAYER_OPERATORS})\s*\S",
                          "description": "Layer index comparison on the 'layers.N.' part of "
                          "the name, e.g. '>= {config.num_hidden_layers}' (the MTP/nextn "
                          "layers)."},
               "group": {"description": "Module groups as `inspect` reports them.",
                         **one_or_many({"enum": list(GROUP_NAMES)})}},
    "param": {"type": {"enum": list(PARAM_TYPES)},
              "default": {"description": "Used when no value is given; without it the "
                          "parameter is required."},
              "description": ref("nonEmptyString"),
              "minimum": {"type": "number", "description": "The smallest value allowed (a "
                          "number, an integer, or each of integers)."},
              "maximum": {"type": "number", "description": "The largest value allowed."},
              "exclusive_minimum": {"type": "number", "description": "Values must be above "
                                    "this (factor > 0: exclusive_minimum: 0)."},
              "enum": {"type": "array", "minItems": 1, "description": "The values allowed "
                       "(a string, integer or number parameter)."}},
    "include": {"recipe": ref("nonEmptyString"),
                "params": {"type": "object", "description": "Values for the included "
                           "recipe's params; may use {references}."}},
    "gguf": {"key": ref("nonEmptyString"), "equals": ANY, "one_of": {"type": "array",
                                                                      "minItems": 1},
             "exists": BOOLEAN, "set": ref("nonEmptyString"), "drop": ref("nonEmptyString"),
             "rename": ref("nonEmptyString"), "to": ref("nonEmptyString"),
             "type": {"type": "string", "description": "A GGUF value type in lower case "
                      "(uint32, float32, string, bool...) or array[TYPE]; default: the key's "
                      "own."},
             "from": ref("contentSource"), "from_model": ref("fileName"),
             "from_key": ref("nonEmptyString"), "path": ref("pointer"), "first": BOOLEAN,
             "token": BOOLEAN, "multiply": {"type": "number", "exclusiveMinimum": 0},
             "strip_nextn": BOOLEAN},
    "ggufSelect": {"glob": {"type": "string"}, "regex": {"type": "string"},
                   "layers": {"type": ["string", "integer"],
                              "description": "Block numbers: N, N-M, N- or last:N."}},
}


def properties(keys: Iterable[str], section: str, **given: Any) -> dict:
    """The ``properties`` of ``keys``: ``given`` first, then the section's value, then the
    common one."""
    out = {}
    for key in keys:
        for table in (given, _VALUES.get(section, {}), _VALUES["*"]):
            if key in table:
                out[key] = table[key]
                break
        else:
            raise KeyError(f"the recipe key {key!r} ({section}) has no value schema: add it to "
                           "patcher.recipe.json_schema_values._VALUES")
    return out


def strict(keys: Sequence[str], section: str, required: Sequence[str] = (),
           description: str | None = None, **given: Any) -> dict:
    """An object of exactly ``keys``."""
    out: dict[str, Any] = {"type": "object"}
    if description:
        out["description"] = description
    out["properties"] = properties(keys, section, **given)
    out["additionalProperties"] = False
    if required:
        out["required"] = list(required)
    return out
