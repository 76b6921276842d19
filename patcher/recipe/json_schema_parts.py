"""The parts every section of the recipe's JSON Schema is built from: JSON Schema combinators,
the value schemas used under many keys, and the shared ``$defs`` (pointers, file names, dtype
spellings, content sources, sha256 pins), each taken from the loader's own tables and patterns.
``patcher.recipe.json_schema`` assembles the sections from them."""

from __future__ import annotations

import re
from typing import Iterable

from . import checks
from .sources import SHA256_RE
from .tensor_ops import schema as tensor_schema
from .tensor_ops.dtype_names import spellings

POINTER = r"^(/([^~]|~[01])*)*$"


def ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


def one_or_many(item: dict) -> dict:
    """``item``, or a non-empty list of them."""
    return {"oneOf": [item, {"type": "array", "minItems": 1, "items": item}]}


def nullable(kind: str) -> list[str]:
    """A section that may be written empty (``tensors:`` with nothing under it)."""
    return [kind, "null"]


def fullmatch(regex: re.Pattern | str) -> str:
    """A pattern the loader applies with ``fullmatch`` (or ending in ``\\Z``), anchored for
    JSON Schema, which searches."""
    text = regex if isinstance(regex, str) else regex.pattern
    return "^(?:" + text.removesuffix("\\Z") + ")$"


def any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def block_pair(description: str | None = None) -> dict:
    out = {"type": "array", "minItems": 2, "maxItems": 2,
           "items": {"type": "integer", "minimum": 1}}
    return {"description": description, **out} if description else out


BOOLEAN = {"type": "boolean"}
ANY = True
REGEX = {"type": "string", "format": "regex", "minLength": 1}


def exactly_one(keys: Iterable[str]) -> list[dict]:
    return [{"required": [key]} for key in keys]


# ------------------------------------------------------------------------------ $defs

def file_name() -> dict:
    reserved = "".join(f"(?!{re.escape(d)}(/|$))" for d in checks.RESERVED_DIRS) + "".join(
        f"(?!{re.escape(n)}$)" for n in checks.RESERVED_NAMES)
    part = r"[^/\\\u0000]+"
    return {"type": "string",
            "pattern": rf"^(?![A-Za-z]:){reserved}(?!(.*/)?\.\.?(/|$)){part}(/{part})*$",
            "description": "A relative path inside the model directory: no leading /, no .. "
                           "or . components, no backslashes."}


def shared_defs() -> dict:
    """The ``$defs`` the sections refer to: pointers, file names, patterns, dtypes, content
    sources and sha256 pins."""
    non_empty = {"type": "string", "minLength": 1}
    return {
        "pointer": {"type": "string", "pattern": POINTER,
                    "description": "RFC 6901 JSON Pointer: \"\" or /key/... (~0 is ~, ~1 is /)."},
        "innerPointer": {"type": "string", "pattern": POINTER, "minLength": 1,
                         "description": "A JSON Pointer below the root (not \"\")."},
        "fileName": file_name(),
        "scope": {"type": "string", "pattern": POINTER,
                  "description": "A scope pointer; / (or \"\") is the document root."},
        "scopes": {"description": "Apply/evaluate inside each of these pointers (/ is the "
                                  "root).",
                   "oneOf": [ref("scope"), {"type": "array", "items": ref("scope"),
                                            "minItems": 1, "uniqueItems": True}]},
        "nonEmptyString": {"type": "string", "pattern": r"\S"},
        "patterns": one_or_many(non_empty),
        "regexes": one_or_many(REGEX),
        "dtype": {"enum": spellings(), "description": "safetensors names (canonical), short "
                  "names (bf16, fp8) or torch's (bfloat16, torch.float8_e4m3fn)."},
        "floatTarget": {"enum": spellings(tensor_schema.FLOAT_TARGETS),
                        "description": f"{', '.join(tensor_schema.FLOAT_TARGETS)}, in any of "
                        "their spellings (bf16, bfloat16, float32...)."},
        "contentSource": {
            "type": "string", "minLength": 1,
            "description": "Where the content comes from: a file next to the recipe "
            "(chat_template.jinja; read at load), hf://ORG/NAME[@REV]/PATH (a hub repository's "
            "file; REV percent-decoded), model:PATH (a file of a local model directory) or "
            "file:PATH (a local file). model: and file: only through a {parameter} given with "
            "--set. #/POINTER after an hf://, model: or file: source takes the JSON value at "
            "that pointer. Read once at plan time; the plan and manifest record where from "
            "(the hub commit) and the sha256.",
            "examples": ["chat_template.jinja", "hf://org/base@main/generation_config.json",
                         "hf://org/base/tokenizer_config.json#/chat_template", "{template}"]},
        "sha256Pin": {"type": "string",
                      "pattern": "^(" + SHA256_RE.pattern.removesuffix("\\Z") + r")?$|\{",
                      "description": "The sha256 (64 lowercase hex digits) the from: bytes "
                      "must have; other bytes are refused. Empty: not pinned. May be a "
                      "{parameter}."},
    }
