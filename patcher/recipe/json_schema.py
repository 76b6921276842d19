"""The recipe's JSON Schema (Draft 2020-12), built from the loader's own tables.

``patcher/schemas/recipe.schema.json`` (what editors validate recipes with, through
``# yaml-language-server: $schema=...``) is this module's output, never edited by hand:
``modelpatch recipes schema`` prints it, and a test fails when the committed file differs
(``python -m patcher.cli recipes schema > patcher/schemas/recipe.schema.json`` rewrites it).

What the schema takes from the code, so that a change there changes it too:

- the keys each section, condition, operation and action accepts, and those it needs
  (``load.TOP_KEYS``, ``sections.CONFIG_KEYS``, ``config_arrays.ARRAY_KEYS``,
  ``tensor_ops.schema.ACTION_KEYS``, ``gguf_section.META_KEYS``...);
- the names: quantization schemes and the layouts each writes (``tensors.schemes.SCHEMES``
  through ``tensor_ops.schema``), dtype spellings (``tensor_ops.dtype_names``), module groups,
  parameter types, RFC 6902 operations, scale modes and dtypes;
- the patterns: recipe and parameter names, reserved file names, ``layers:`` comparisons, shard
  size units, sha256 pins.

What it adds: the type of each key's value (``json_schema_values``, by key name; a key the code
accepts and that table does not know makes the build fail, naming it) and the descriptions. The
loader checks more than a JSON Schema can say (regexes that backtrack, replacement templates, the
whole recipe's cross-checks); the schema never refuses what the loader accepts on those grounds. The
combinators and the shared ``$defs`` are in ``json_schema_parts``; this module assembles the
sections.
"""

from __future__ import annotations

import json

from ..units import SIZE_UNITS
from . import checks, load, sections
from . import config_arrays as arrays
from . import gguf_section as gguf_section
from .json_schema_parts import (
    BOOLEAN,
    any_case,
    block_pair,
    exactly_one,
    fullmatch,
    nullable,
    ref,
    shared_defs,
)
from .json_schema_values import properties, strict
from .params import include as includes
from .params import parse as params
from .schema import PATCH_OP_OPERAND, RECIPE_FORMAT_VERSIONS, PatchOp
from .tensor_ops import parse as tensor_parse
from .tensor_ops import schema as tensor_schema
from .tensor_ops.dtype_names import spellings
from .tensor_ops.split_scale import RECIPROCAL_MODES, SCALE_DTYPES

SCHEMA_ID = ("https://github.com/modelpatch/modelpatch/blob/main/patcher/schemas/"
             "recipe.schema.json")
REGENERATE = "python -m patcher.cli recipes schema > patcher/schemas/recipe.schema.json"

# ------------------------------------------------------------------------------ sections

def _top_level() -> dict:
    versions = RECIPE_FORMAT_VERSIONS
    return properties(load.TOP_KEYS, "top", **{
        "modelpatch": {**({"const": versions[0]} if len(versions) == 1
                          else {"enum": list(versions)}),
                       "description": "Recipe format version."},
        "name": {"type": "string", "pattern": fullmatch(checks.NAME_RE),
                 "description": "Recipe name; the default output directory is "
                                "<model>-<name>."},
        "description": {"type": "string", "pattern": r"\S",
                        "description": "What the recipe does and why."},
        "params": {"type": nullable("object"),
                   "description": "Parameters the recipe's values use as {name}; given with "
                   "apply/plan --set NAME=VALUE (typed by 'type'), or by an including recipe.",
                   "propertyNames": {"pattern": fullmatch(params.PARAM_NAME_RE),
                                     "not": {"enum": list(params.RESERVED_PARAM_NAMES)}},
                   "additionalProperties": ref("param")},
        "include": {"type": nullable("array"),
                    "description": "Other recipes applied first, in order: a built-in name or "
                    "a path relative to this recipe, optionally with parameter values.",
                    "items": {"oneOf": [ref("nonEmptyString"),
                                        strict(includes.INCLUDE_KEYS, "include",
                                               includes.INCLUDE_REQUIRED)]}},
        "requires": {"type": nullable("array"), "items": ref("condition"),
                     "description": "Guards: every condition must hold or the model is "
                                    "refused."},
        "config": {"type": nullable("object"), "propertyNames": ref("fileName"),
                   "additionalProperties": {"type": nullable("array"),
                                            "items": ref("configOp")},
                   "description": "Operations on JSON files, by file name."},
        "files": {"type": nullable("array"), "items": ref("fileOp")},
        "tensors": {"type": nullable("array"), "items": ref("tensorOp")},
        "output": {"type": nullable("object"), "additionalProperties": False,
                   "description": "How the variant's shards are laid out.",
                   "properties": properties(load.OUTPUT_KEYS, "output",
                                            max_shard_size=_shard_size())},
        "gguf": _gguf(),
    })


def _shard_size() -> dict:
    units = "|".join(any_case(unit) for unit in SIZE_UNITS if unit)
    return {"description": "Reshard the variant into shards of at most this size, as "
            "transformers' save_pretrained(max_shard_size=...) does: 5GB, 500MB (decimal "
            "units), 2GiB (binary units), or a byte count.",
            "oneOf": [{"type": "integer", "minimum": 1},
                      {"type": "string", "pattern": rf"^\s*\d+(\.\d+)?\s*({units})?\s*$"}]}


def _gguf() -> dict:
    g = gguf_section
    guard = strict(g.GUARD_KEYS, "gguf", g.GUARD_REQUIRED)
    metadata = {"oneOf": [
        {**strict(keys, "gguf", (kind,)),
         **({"oneOf": exactly_one(g.SET_SOURCES)} if kind == "set" else {})}
        for kind, keys in g.META_KEYS.items()]}
    select = {**strict(g.SELECT_KEYS, "ggufSelect"), "minProperties": 1}
    rename = {"type": "object", "required": list(g.RENAME_KEYS),
              "properties": {key: {"type": "string"} for key in g.RENAME_KEYS}}
    tensor = strict(g.TENSOR_KEYS, "gguf", ("select",), select=select, drop=BOOLEAN,
                    rename=rename)
    items = {"requires": guard, "metadata": metadata, "tensors": tensor}
    return strict(g.SECTION_KEYS, "gguf", description="GGUF edits "
                  "(patcher.recipe.gguf_section): requires, metadata set/drop/rename, tensors "
                  "select+drop/rename, strip_nextn.",
                  **{k: {"type": "array", "items": item} for k, item in items.items()})


def _condition() -> dict:
    s = sections
    leaf = strict(s.LEAF_KEYS, "condition", s.LEAF_REQUIRED)
    leaf["oneOf"] = exactly_one(s.PREDICATES)
    combined = [strict((kind, *s.COMBINATOR_KEYS), "condition", (kind,))
                for kind in s.COMBINATORS]
    return {"oneOf": [leaf, *combined]}


_CONFIG_DESCRIPTIONS = {
    "drop": "Remove a key. A key missing from every scope is an error unless missing_ok: true.",
    "set": "Set a value (or the content of from:), creating missing parent objects (unless "
           "create_parents: false).",
    "rename": "Move a key. A source missing from every scope is an error unless missing_ok: "
              "true.",
    "each": "Element op on a JSON array: replace (re.sub on the string elements a regex "
            "matches) or remove: true (drop the elements a glob or regex matches).",
    "append": "Append value to a JSON array unless an equal element is there.",
}


def _config_op() -> dict:
    s, a = sections, arrays
    branches = []
    for action in s.CONFIG_ACTIONS:
        if action == "op":
            branches += [_patch_op(op) for op in s.PATCH_OPS]
            continue
        branch = strict(s.CONFIG_KEYS[action], "config",
                        (action, *s.CONFIG_REQUIRED.get(action, ())),
                        _CONFIG_DESCRIPTIONS.get(action))
        if action == "set":
            branch["oneOf"] = exactly_one(s.SET_SOURCES)
        branches.append(branch)
    match = strict(a.MATCH_KEYS, "select")
    match["oneOf"] = exactly_one(a.MATCH_KEYS)
    for action, keys in a.ARRAY_KEYS.items():
        branch = strict(keys, "config", (action, *a.ARRAY_REQUIRED[action]),
                        _CONFIG_DESCRIPTIONS[action], match=match)
        if action == "each":
            mapped, filtered = a.EACH_ACTIONS
            branch["oneOf"] = [{"required": [mapped],
                                "properties": {"match": {"required": ["regex"]}}},
                               {"required": [filtered]}]
        branches.append(branch)
    return {"oneOf": branches}


def _patch_op(op: str) -> dict:
    """One RFC 6902 operation: the keys of ``op:`` items less the operands it does not take."""
    operand = PATCH_OP_OPERAND[op]
    others = {k for k in PATCH_OP_OPERAND.values() if k and k != operand}
    if op not in PatchOp.MISSING_OK_OPS:
        others.add("missing_ok")
    keys = [k for k in sections.CONFIG_KEYS["op"] if k not in others]
    required = ["op", *sections.CONFIG_REQUIRED["op"], *([operand] if operand else [])]
    reads = "'from'" if operand == "from" else "the path"
    about = f"RFC 6902 {op}" + (f"; missing_ok: true skips scopes without {reads}."
                                if op in PatchOp.MISSING_OK_OPS else ".")
    return strict(keys, "patch", required, about, op={"const": op})


def _file_op() -> dict:
    s = sections
    branches = []
    for action, keys in s.FILE_KEYS.items():
        branch = strict(keys, "file", (action,))
        if action == "add":
            branch["oneOf"] = exactly_one(s.ADD_SOURCES)
        branches.append(branch)
    return {"oneOf": branches}


def _select() -> dict:
    t = tensor_parse
    out = strict(t.SELECT_KEYS, "select", description="glob: fnmatch on the full tensor name; "
                 "regex: re.search; layers: a layer index comparison; group: inspect's module "
                 "groups. All given must match.")
    out["anyOf"] = exactly_one(k for k in t.SELECT_KEYS if k != "dtype")
    out["not"] = {"required": list(t.PATTERN_KEYS)}
    return out


def _tensor_op() -> dict:
    t, ts = tensor_parse, tensor_schema
    given = {
        "split": {"to": {"type": "array", "minItems": 2, "uniqueItems": True,
                         "items": {"type": "string"}}},
        "scale": {"reciprocal": {
            "enum": list(RECIPROCAL_MODES), "description": "1/x rounded to nearest in the "
            "input's dtype. exact: refuse a value that 1/(1/x) does not give back bit for bit; "
            "nearest: accept it (what compressed-tensors' ModelOpt converter writes). Zero, "
            "inf, NaN and out-of-range results are always refused."},
            "cast": {"enum": spellings(SCALE_DTYPES),
                     "description": "Refused unless every value comes back bit for bit."}},
        "dequantize": {"scheme": {"enum": list(ts.DEQUANT_SCHEMES)}, "to": ref("floatTarget"),
                       "block": block_pair(
                           f"{' or '.join(ts.DEQUANT_BLOCK_SCHEMES)} only: [bm, bn]; default: "
                           "the config's quantization_config.weight_block_size, else "
                           f"{list(ts.DEFAULT_BLOCK)}")},
        "quantize": {"scheme": {"enum": list(ts.QUANT_SCHEMES)},
                     "layout": {"enum": list(ts.QUANT_LAYOUTS)}},
    }
    actions = {action: strict(keys, "action", ts.ACTION_REQUIRED[action],
                              **given.get(action, {}))
               for action, keys in ts.ACTION_KEYS.items()}
    actions["copy"]["description"] = ("Add a byte-identical copy of each selected tensor named "
                                      "re.sub(pattern, to, name).")
    actions["split"]["description"] = (
        "Replace each selected tensor by byte-identical copies named re.sub(pattern, to[i], "
        "name), e.g. {pattern: 'kv_scale$', to: [k_scale, v_scale]}; the source name is "
        "removed unless it is one of them.")
    scale = actions["scale"]
    scale["minProperties"] = 1
    scale["description"] = ("Elementwise scale math, in the order reciprocal, cast, reshape; "
                            "exact or refused (exit 2, naming the tensor).")
    dequantize = actions["dequantize"]
    dequantize["if"] = {"required": ["block"]}
    dequantize["then"] = {"properties": {"scheme": {"enum": list(ts.DEQUANT_BLOCK_SCHEMES)}}}
    quantize = actions["quantize"]
    quantize["oneOf"] = [
        {"properties": {"scheme": {"const": scheme},
                        "layout": {"enum": [lay for s, lay in ts.QUANT_COMBINATIONS
                                            if s == scheme]}},
         **({} if scheme in ts.QUANT_BLOCK_SCHEMES else {"not": {"required": ["block"]}})}
        for scheme in ts.QUANT_SCHEMES]
    out = strict(t.TENSOR_KEYS, "tensor", t.TENSOR_REQUIRED, **actions)
    out["oneOf"] = exactly_one(t.TENSOR_ACTIONS)
    return out


# ------------------------------------------------------------------------------- schema

def recipe_schema() -> dict:
    """The recipe's JSON Schema (Draft 2020-12), as a dict."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "modelpatch recipe",
        "description": "A declarative patch for a Hugging Face model directory (format version "
                       f"{', '.join(map(str, RECIPE_FORMAT_VERSIONS))}). Generated from the "
                       "loader's tables by patcher.recipe.json_schema (modelpatch recipes "
                       "schema); do not edit. The loader also refuses YAML anchors, aliases, "
                       "custom tags and multiple documents, which a JSON Schema cannot express.",
        "type": "object",
        "additionalProperties": False,
        "required": list(load.REQUIRED_TOP_KEYS),
        "properties": _top_level(),
        "$defs": {**shared_defs(), "condition": _condition(), "configOp": _config_op(),
                  "fileOp": _file_op(), "select": _select(), "tensorOp": _tensor_op(),
                  "param": strict(params.PARAM_KEYS, "param", params.PARAM_REQUIRED)},
    }


def schema_text() -> str:
    """The schema as ``patcher/schemas/recipe.schema.json`` holds it."""
    return json.dumps(recipe_schema(), indent=2, ensure_ascii=False) + "\n"
