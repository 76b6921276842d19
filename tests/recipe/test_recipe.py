"""The recipe language: loading, validation errors with exact locations, YAML safety, guards,
built-in recipe lookup, and agreement between the loader and the JSON Schema."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from patcher.errors import GuardRefused, InputError, RecipeError
from patcher.recipe import load as recipe_mod
from patcher.recipe.load import (
    builtin_recipe_dir,
    builtin_recipe_names,
    check_guards,
    evaluate_guards,
    load_recipe,
    resolve_recipe,
)
from patcher.recipe.schema import (
    AddFile,
    AllOf,
    AnyOf,
    CastTensors,
    Check,
    DequantizeTensors,
    DropFile,
    DropOp,
    DropTensors,
    Not,
    PatchOp,
    QuantizeTensors,
    Recipe,
    RenameOp,
    RenameTensors,
    SetOp,
)
from patcher.recipe.yaml_safe import MAX_RECIPE_BYTES

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "patcher" / "schemas" / "recipe.schema.json"
HEAD = "modelpatch: 1\nname: t\ndescription: d\n"


def load(text: str) -> Recipe:
    return load_recipe(textwrap.dedent(text), source_name="recipe.yaml")


def errors(text: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load(text)
    return info.value.errors


def first_error(text: str) -> str:
    with pytest.raises(RecipeError) as info:
        load(text)
    return str(info.value)


# ------------------------------------------------------------------------------ valid recipes

FULL = """\
modelpatch: 1
name: full-example.v1
description: every section
requires:
  - any_of:
      - {file: config.json, path: /quantization_config/kv_cache_scheme, exists: true}
      - {file: config.json, path: /a, equals: {x: [1, 2.5, null, true]}}
    message: no kv cache
  - {file: config.json, path: /architectures, contains: KimiK25ForConditionalGeneration}
  - not: {file: config.json, path: /model_type, one_of: [llama, mistral]}
    in: [/, /text_config]
  - all_of:
      - {file: config.json, path: /x, exists: false}
config:
  config.json:
    - drop: /quantization_config/kv_cache_scheme
      in: [/, /text_config]
    - set: /foo/bar
      value: 3
    - rename: /old_key
      to: /new_key
      missing_ok: true
    - architectures: [DeepseekV3ForCausalLM]
    - model_type: deepseek_v3
    - {op: test, path: /model_type, value: kimi_k25}
    - {op: move, from: /a, path: /b}
    - {op: remove, path: /c, missing_ok: true}
  sub/dir/hf_quant_config.json:
    - drop: /kv_cache_quant_algo
      missing_ok: false
files:
  - drop: some_file.bin
  - add: chat_template.jinja
    content: "{{ messages }}"
    overwrite: true
tensors:
  - select: {glob: "*.k_proj.k_scale", dtype: [F32]}
    drop: true
  - select: {regex: '^language_model\\.'}
    rename: {to: 'model.'}
  - select: {regex: ['a', 'b']}
    allow_empty: true
    rename: {pattern: '^x(\\d+)', to: 'y\\1'}
  - select: {glob: ["*.weight", "*.bias"], dtype: BF16}
    cast: fp16
  - select: {regex: 'experts'}
    dequantize: {scheme: auto}
  - select: {regex: 'mlp'}
    quantize: {scheme: fp8-block, layout: deepseek}
  - select: {regex: 'attn'}
    quantize: {scheme: fp8-tensor, layout: modelopt}
"""


def test_full_recipe_types_and_locations():
    r = load(FULL)
    assert (r.format_version, r.name, r.description) == (1, "full-example.v1", "every section")
    assert r.text == FULL and r.sha256 == hashlib.sha256(FULL.encode()).hexdigest()
    assert r.source == "recipe.yaml" and r.path is None

    any_of, contains, not_, all_of = r.requires
    assert isinstance(any_of, AnyOf) and any_of.message == "no kv cache"
    assert any_of.loc == "recipe.yaml:5:5"
    assert any_of.conditions[0] == Check("config.json", "/quantization_config/kv_cache_scheme",
                                         "exists", True, ("",), None, "recipe.yaml:6:9")
    assert any_of.conditions[1].expected == {"x": [1, 2.5, None, True]}
    assert contains.predicate == "contains" and contains.loc == "recipe.yaml:9:5"
    assert isinstance(not_, Not) and not_.scopes == ("", "/text_config")
    assert not_.condition.expected == ["llama", "mistral"]
    assert isinstance(all_of, AllOf)

    ops = r.config["config.json"]
    assert ops[0] == DropOp("/quantization_config/kv_cache_scheme", ("", "/text_config"), False,
                            "recipe.yaml:16:7")
    assert ops[1] == SetOp("/foo/bar", 3, ("",), "recipe.yaml:18:7")
    assert ops[2] == RenameOp("/old_key", "/new_key", ("",), True, "recipe.yaml:20:7")
    assert ops[3] == SetOp("/architectures", ["DeepseekV3ForCausalLM"], ("",), "recipe.yaml:23:7",
                           label="architectures")
    assert ops[4].path == "/model_type" and ops[4].label == "model_type"
    assert ops[5] == PatchOp("test", "/model_type", "kimi_k25", None, ("",), "recipe.yaml:25:7")
    assert ops[6].as_json_patch("/t") == {"op": "move", "from": "/t/a", "path": "/t/b"}
    assert ops[7].as_json_patch() == {"op": "remove", "path": "/c"} and ops[7].missing_ok
    assert not ops[6].missing_ok
    assert r.config["sub/dir/hf_quant_config.json"][0].missing_ok is False
    assert list(r.config) == ["config.json", "sub/dir/hf_quant_config.json"]

    assert r.files == (DropFile("some_file.bin", True, "recipe.yaml:32:5"),
                       AddFile("chat_template.jinja", "{{ messages }}", True, "recipe.yaml:33:5"))

    t = r.tensors
    assert [op.kind for op in t] == ["drop", "rename", "rename", "cast", "dequantize",
                                     "quantize", "quantize"]
    assert t[0].select.globs == ("*.k_proj.k_scale",) and t[0].select.dtypes == ("F32",)
    assert t[0].action == DropTensors() and t[0].allow_empty is False
    assert t[0].loc == "recipe.yaml:37:5"
    assert t[1].action == RenameTensors(r"^language_model\.", "model.")
    assert t[2].action == RenameTensors(r"^x(\d+)", r"y\1") and t[2].allow_empty is True
    assert t[2].select.regexes == ("a", "b")
    assert t[3].action == CastTensors("F16") and t[3].select.dtypes == ("BF16",)
    assert t[4].action == DequantizeTensors("auto", "BF16")
    assert t[4].action.block is None
    assert t[5].action == QuantizeTensors("fp8-block", "deepseek", (128, 128))
    assert t[6].action == QuantizeTensors("fp8-tensor", "modelopt", None)


def test_tensor_select_matches():
    r = load(FULL)
    glob, regex = r.tensors[0].select, r.tensors[1].select
    assert glob.matches("model.layers.0.self_attn.k_proj.k_scale", "F32")
    assert not glob.matches("model.layers.0.self_attn.k_proj.k_scale", "BF16")
    assert glob.matches("model.layers.0.self_attn.k_proj.k_scale")  # dtype unknown: name only
    assert not glob.matches("model.layers.0.self_attn.K_PROJ.k_scale", "F32")  # case-sensitive
    assert regex.matches("language_model.model.embed_tokens.weight")
    assert not regex.matches("vision_tower.language_model.x")


def test_recipe_is_frozen_and_picklable():
    r = load(FULL)
    with pytest.raises(AttributeError):
        r.name = "other"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(r)) == r


def test_minimal_recipe_and_empty_sections():
    r = load(HEAD + "requires:\nconfig:\n  config.json: []\nfiles: []\ntensors:\n")
    assert r.requires == () and r.config == {"config.json": ()} and r.files == ()
    assert r.tensors == () and not r.touches_tensors


def test_load_from_path_bytes_and_str(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_bytes(FULL.encode())
    by_path = load_recipe(path)
    assert by_path.source == str(path) and by_path.path == path
    assert by_path.requires[0].loc == f"{path}:5:5"
    assert load_recipe(str(path)).path == path  # an existing file named by a str
    assert load_recipe(FULL.encode()).sha256 == by_path.sha256
    assert load_recipe(path, source_name="x.yaml").requires[0].loc == "x.yaml:5:5"


def test_missing_recipe_file(tmp_path):
    with pytest.raises(InputError, match="no such recipe file"):
        load_recipe(tmp_path / "absent.yaml")
    with pytest.raises(InputError, match="absent.yml: no such recipe file"):
        load_recipe(str(tmp_path / "absent.yml"))
    with pytest.raises(InputError, match="directory"):
        load_recipe(tmp_path)


def test_explicit_core_tags_are_fine():
    r = load(HEAD + "config:\n  config.json:\n    - set: /x\n      value: !!str 3\n"
                    "    - set: /y\n      value: !!float 3\n")
    assert r.config["config.json"][0].value == "3"
    assert r.config["config.json"][1].value == 3.0


def test_yaml_values_become_plain_json():
    r = load(HEAD + "config:\n  config.json:\n    - set: /x\n      value: {a: 0x10, b: 1.0e-6, "
                    "c: yes, d: [null, '1']}\n")
    value = r.config["config.json"][0].value
    assert value == {"a": 16, "b": 1e-06, "c": "yes", "d": [None, "1"]}
    assert type(value) is dict and type(value["a"]) is int and type(value["b"]) is float
    assert type(value["d"]) is list and type(value["c"]) is str


# ---------------------------------------------------------------------- validation errors

def located(marked: str) -> tuple[str, str]:
    """Strip the ``§`` marking where an error must point; return (text, "LINE:COL")."""
    index = marked.index("§")
    line = marked.count("\n", 0, index) + 1
    col = index - (marked.rfind("\n", 0, index) + 1) + 1
    return marked.replace("§", "", 1), f"{line}:{col}"


# Each case: the recipe with § just before the character the first error must point at, and
# that error's message.
ERROR_CASES = [
    # unknown keys, with a did-you-mean from difflib
    (HEAD + "§requries: []\n",
     "unknown key 'requries' in recipe (did you mean 'requires'?)"),
    (HEAD + "config:\n  config.json:\n    - §dorp: /x\n",
     "unknown key 'dorp' in config operation (did you mean 'drop'?)"),
    (HEAD + "config:\n  config.json:\n    - drop: /x\n      §mising_ok: true\n",
     "unknown key 'mising_ok' in 'drop' operation (did you mean 'missing_ok'?)"),
    (HEAD + "requires:\n  - {file: config.json, path: /x, §exist: true}\n",
     "unknown key 'exist' in condition (did you mean 'exists'?)"),
    (HEAD + "requires:\n  - §anyof: []\n",
     "unknown key 'anyof' in condition (did you mean 'any_of'?)"),
    (HEAD + "tensors:\n  - select: {glob: x}\n    §dorp: true\n",
     "unknown key 'dorp' in tensor operation (did you mean 'drop'?)"),
    (HEAD + "tensors:\n  - select: {glob: x, §dtpye: [F32]}\n    drop: true\n",
     "unknown key 'dtpye' in select (did you mean 'dtype'?)"),
    (HEAD + "§colour: red\n",
     "unknown key 'colour' in recipe (expected one of: modelpatch, name, description, params, "
     "include, requires, config, files, tensors, output, gguf)"),
    # required keys and wrong types
    ("§modelpatch: 1\nname: t\n", "recipe needs 'description'"),
    ("modelpatch: §'1'\nname: t\ndescription: d\n",
     "'modelpatch' must be an integer; got a string"),
    (HEAD.replace("name: t", "name: §My Recipe"),
     "recipe name 'My Recipe' must match [a-z0-9][a-z0-9._-]* and be at most 100 characters"),
    (HEAD.replace("description: d", "description: §''"), "'description' must not be empty"),
    (HEAD + "requires: §{file: config.json}\n", "'requires' must be a list; got a mapping"),
    (HEAD + "config: §[a]\n", "config: must map file names to lists of operations, e.g. "
     "{config.json: [{drop: /x}]}; got a list"),
    (HEAD + "config:\n  config.json:\n    - §set: /x\n", "'set' operation needs 'value'"),
    (HEAD + "config:\n  config.json:\n    - {drop: /x, missing_ok: §'no'}\n",
     "'missing_ok' must be true or false; got a string"),
    (HEAD + "config:\n  config.json:\n    - {op: add, path: /x, value: 1, §missing_ok: true}\n",
     "'add' takes no 'missing_ok' (only remove, replace, move, copy read a path that may be "
     "missing)"),
    (HEAD + "config:\n  config.json:\n    - {model_type: §3}\n",
     "'model_type' must be a string; got an integer"),
    (HEAD + "config:\n  config.json:\n    - {architectures: §[]}\n",
     "'architectures' must not be empty"),
    (HEAD + "config:\n  config.json:\n    - {architectures: [a, §3]}\n",
     "value must be a string; got an integer"),
    (HEAD + "config:\n  config.json:\n    - §{}\n",
     "a config operation needs one of: drop, set, rename, architectures, model_type, op"),
    (HEAD + "config:\n  config.json:\n    - drop: /x\n      §set: /y\n      value: 1\n",
     "one operation per list item; found 'drop' and 'set'"),
    (HEAD + "config:\n  config.json:\n    - §{op: add, path: /x}\n", "'add' needs 'value'"),
    (HEAD + "config:\n  config.json:\n    - {op: remove, path: /x, §value: 1}\n",
     "'remove' takes no 'value'"),
    (HEAD + "config:\n  config.json:\n    - {op: §moev, path: /x, from: /y}\n",
     "unknown op 'moev' (did you mean 'move'?)"),
    (HEAD + "config:\n  config.json:\n    - {op: move, from: /a, path: §/a/b}\n",
     "cannot move /a into its own child /a/b"),
    (HEAD + "config:\n  config.json:\n    - {rename: /a, to: §/a/b}\n",
     "cannot rename /a to /a/b (inside itself)"),
    (HEAD + "requires:\n  - §{file: config.json, path: /x}\n",
     "a condition needs one of exists, equals, contains, one_of (or any_of, all_of, not)"),
    (HEAD + "requires:\n  - {file: config.json, path: /x, exists: §yes}\n",
     "'exists' must be true or false; got a string"),
    (HEAD + "requires:\n  - {file: config.json, path: /x, exists: true, §equals: 1}\n",
     "a condition has one predicate; found 'exists' and 'equals' (combine them with all_of)"),
    (HEAD + "requires:\n  - {any_of: [], §all_of: []}\n",
     "a condition has one of any_of, all_of, not; found 'any_of' and 'all_of' (nest them "
     "instead)"),
    (HEAD + "requires:\n  - {file: config.json, path: /x, one_of: §[]}\n",
     "'one_of' must not be empty"),
    (HEAD + "requires:\n  - {any_of: §[], message: m}\n", "'any_of' must not be empty"),
    (HEAD + "requires:\n  - §{path: /x, exists: true}\n", "condition needs 'file'"),
    (HEAD + "requires:\n  - §3\n", "a condition must be a mapping such as {file: config.json, "
     "path: /x, exists: true}; got an integer"),
    (HEAD + "requires:\n  - {file: config.json, path: /x, equals: §2024-01-01}\n",
     "a date is not a JSON value (quote it to make a string)"),
    (HEAD + "requires:\n  - {file: config.json, path: /x, equals: §.nan}\n",
     "NaN and infinities are not JSON values"),
    (HEAD + "config:\n  config.json:\n    - set: /x\n      value: {§1: a}\n",
     "JSON object keys must be strings; got an integer (quote it)"),
    (HEAD + "config:\n  config.json:\n    - set: /x\n      value: [1, {a: [§2024-01-01]}]\n",
     "a date is not a JSON value (quote it to make a string)"),
    # JSON pointers (RFC 6901)
    (HEAD + "config:\n  config.json:\n    - drop: §quantization_config\n",
     "JSON pointer 'quantization_config' must start with '/' (or be \"\" for the whole "
     "document)"),
    (HEAD + "config:\n  config.json:\n    - drop: §/a~2b\n",
     "JSON pointer '/a~2b' has '~' not followed by 0 or 1 (write '~0' for '~')"),
    (HEAD + "config:\n  config.json:\n    - drop: §''\n",
     "this operation needs a path inside the document, not \"\" (the root)"),
    (HEAD + "config:\n  config.json:\n    - {drop: /x, in: [/, §text_config]}\n",
     "JSON pointer 'text_config' must start with '/' (or be \"\" for the whole document)"),
    (HEAD + "config:\n  config.json:\n    - {drop: /x, in: [/a, §/a]}\n",
     "scope '/a' is listed twice"),
    (HEAD + "config:\n  config.json:\n    - {drop: /x, in: §[]}\n", "'in' must not be empty"),
    (HEAD + "requires:\n  - {file: config.json, path: §3, exists: true}\n",
     "a JSON pointer must be a string, not int"),
    # file names
    (HEAD + "config:\n  §/etc/passwd: []\n",
     "file name '/etc/passwd' is absolute; give a path relative to the model directory"),
    (HEAD + "config:\n  §../config.json: []\n",
     "file name '../config.json' has a '..' component; it must stay inside the model directory"),
    (HEAD + "files:\n  - drop: §a/../../b\n",
     "file name 'a/../../b' has a '..' component; it must stay inside the model directory"),
    (HEAD + "files:\n  - drop: §'a\\b'\n",
     "file name 'a\\\\b' has a backslash; use '/' between directories"),
    (HEAD + "config:\n  §'': []\n", "a file name must not be empty"),
    (HEAD + "config:\n  §3: []\n", "a file name must be a string; got an integer"),
    (HEAD + "requires:\n  - {file: §C:/x.json, path: /x, exists: true}\n",
     "file name 'C:/x.json' is absolute; give a path relative to the model directory"),
    (HEAD + "files:\n  - drop: §a//b\n", "file name 'a//b' has an empty or '.' component"),
    (HEAD + "files:\n  - drop: §./b\n", "file name './b' has an empty or '.' component"),
    (HEAD + "files:\n  - drop: §.modelpatch/journal.json\n",
     "file name '.modelpatch/journal.json' is reserved for modelpatch's own records"),
    (HEAD + "files:\n  - add: §modelpatch.provenance.json\n    content: x\n",
     "file name 'modelpatch.provenance.json' is reserved for modelpatch's own records"),
    (HEAD + "files:\n  - add: §model.sig\n    content: x\n",
     "file name 'model.sig' is reserved for modelpatch's own records"),
    (HEAD + "files:\n  - §add: x.txt\n",
     "files: add needs one of 'content' (the text) and 'from' (a file next to the recipe)"),
    (HEAD + "files:\n  - {drop: a, §add: b, content: c}\n",
     "one operation per list item; found 'drop' and 'add'"),
    (HEAD + "files:\n  - drop: x.json\n  - §drop: x.json\n",
     "'x.json' already has a file operation at recipe.yaml:5:5"),
    (HEAD + "config:\n  config.json: []\nfiles:\n  - §drop: config.json\n",
     "'config.json' is both dropped here and patched under config:; do one or the other"),
    # regexes and tensor actions
    (HEAD + "tensors:\n  - select: {regex: §'a('}\n    drop: true\n",
     "invalid regex 'a(': missing ), unterminated subpattern at position 1"),
    (HEAD + "tensors:\n  - select: {regex: ['ok', §'[z-a]']}\n    drop: true\n",
     "invalid regex '[z-a]': bad character range z-a at position 1"),
    (HEAD + "tensors:\n  - select: {regex: x}\n    rename: {pattern: §'(?P<', to: y}\n",
     "invalid regex '(?P<': missing group name at position 4"),
    (HEAD + "tensors:\n  - select: {regex: '^(a)'}\n    rename: {to: §'\\2'}\n",
     "invalid replacement '\\\\2' for pattern '^(a)': invalid group reference 2"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    rename: §{to: x}\n",
     "rename needs 'pattern' unless select has exactly one regex"),
    (HEAD + "tensors:\n  - select: §{glob: '*', regex: x}\n    drop: true\n",
     "select needs exactly one of 'glob' and 'regex' (or 'layers' or 'group' alone)"),
    (HEAD + "tensors:\n  - select: {glob: '*', dtype: [§f33]}\n    drop: true\n",
     "unknown dtype 'f33' (did you mean 'F32'?)"),
    (HEAD + "tensors:\n  - select: {glob: '*', dtype: [§Q4_K]}\n    drop: true\n",
     "unknown dtype 'Q4_K' (one of BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, "
     "BF16, F32, F64, C64, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, F4, F6_E2M3, "
     "F6_E3M2)"),
    (HEAD + "tensors:\n  - select: {glob: '*', dtype: [§e4m4]}\n    drop: true\n",
     "unknown dtype 'e4m4' (did you mean 'F8_E4M3'?)"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    cast: §bf17\n",
     "cast: unknown dtype 'bf17' (did you mean 'BF16'?)"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    cast: §fp8\n",
     "cast: dtype 'fp8' (F8_E4M3) is not allowed here; use one of BF16, F16, F32"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    drop: §false\n",
     "drop must be true (leave the item out to keep the tensors)"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    drop: true\n    §cast: bf16\n",
     "one action per tensor operation; found 'drop' and 'cast' (write two list items)"),
    (HEAD + "tensors:\n  - §select: {glob: '*'}\n",
     "a tensor operation needs one of: drop, rename, copy, split, scale, refuse, cast, "
     "dequantize, quantize"),
    (HEAD + "tensors:\n  - §drop: true\n", "tensor operation needs 'select'"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    dequantize: {scheme: §nvfp4}\n",
     "unknown scheme 'nvfp4' (did you mean 'nvfp4-modelopt' or 'nvfp4-compressed-tensors'?)"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    dequantize: {scheme: auto, to: §int8}\n",
     "to: dtype 'int8' (I8) is not allowed here; use one of BF16, F16, F32"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: fp8-block, "
            "layout: §modelopt}\n",
     "layout 'modelopt' has no fp8-block format (use deepseek or compressed-tensors)"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: fp8-tensor, "
            "layout: modelopt, §block: [128, 128]}\n",
     "block applies to fp8-block, not fp8-tensor"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: fp8-block, "
            "layout: deepseek, block: §[128, 0]}\n",
     "block must be two positive integers, e.g. [128, 128]"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: §fp8\n",
     "quantize must be a mapping such as {scheme: fp8-block, layout: deepseek}; got a string"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: §nvfp4-modelopt, "
            "layout: modelopt}\n",
     "ModelOpt NVFP4 is W4A4: its input_scale needs a calibration, which quantizing weights "
     "cannot give; use {scheme: nvfp4-compressed-tensors, layout: compressed-tensors} (weights "
     "only, NVFP4A16)"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: nvfp4-compressed-tensors, "
            "layout: §modelopt}\n",
     "layout 'modelopt' has no nvfp4-compressed-tensors format (use compressed-tensors)"),
    (HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: nvfp4-compressed-tensors, "
            "layout: compressed-tensors, §block: [16, 16]}\n",
     "block applies to fp8-block, not nvfp4-compressed-tensors"),
    # versions
    ("modelpatch: §2\nname: t\ndescription: d\nsomething_new: 1\n",
     "unknown recipe format version 2 (this modelpatch reads version 1; upgrade modelpatch?)"),
]


@pytest.mark.parametrize("marked, message", ERROR_CASES,
                         ids=[f"case{i}" for i in range(len(ERROR_CASES))])
def test_error_locations_and_messages(marked, message):
    text, position = located(marked)
    assert errors(text)[0] == f"recipe.yaml:{position}: {message}"


def test_all_errors_are_collected_in_document_order():
    text = (HEAD + "colour: red\nconfig:\n  /abs.json:\n    - drop: nope\n"
            "tensors:\n  - select: {regex: '('}\n    drop: true\n")
    errs = errors(text)
    assert [e.split(": ", 1)[0] for e in errs] == [
        "recipe.yaml:4:1", "recipe.yaml:6:3", "recipe.yaml:7:13", "recipe.yaml:9:21"]
    message = first_error(text)
    assert message == ("recipe.yaml:4:1: unknown key 'colour' in recipe (expected one of: "
                       "modelpatch, name, description, params, include, requires, config, files, "
                       "tensors, output, gguf) (and 3 more)")
    with pytest.raises(RecipeError) as info:
        load(text)
    assert info.value.where == "recipe.yaml:4:1" and info.value.exit_code == 2


def test_unknown_version_reports_only_the_version():
    assert len(errors("modelpatch: 7\nname: BAD NAME\nbogus: 1\n")) == 1


@pytest.mark.parametrize("text, expected", [
    ("", "recipe.yaml:1:1: the recipe is empty"),
    ("- a\n", "recipe.yaml:1:1: a recipe must be a mapping with keys modelpatch, name, "
              "description...; got a list"),
    ("a: [1\nb: 2\n", "recipe.yaml:2:2: invalid YAML: while parsing a flow sequence; expected "
                      "',' or ']', but got ':'"),
    (HEAD + "name: u\n", "recipe.yaml:4:1: duplicate key 'name'"),
    (HEAD + "---\n" + HEAD, "recipe.yaml:4:1: a recipe is a single YAML document; found a "
                            "second one"),
    (HEAD + "x: !!python/object/apply:os.system [echo pwned]\n",
     "recipe.yaml:4:4: YAML tag !!python/object/apply:os.system is not allowed in recipes (only "
     "the core tags !!str, !!int, !!float, !!bool, !!null, !!seq, !!map)"),
    (HEAD + "x: !custom 1\n", "recipe.yaml:4:4: YAML tag !custom is not allowed in recipes "
                              "(only the core tags !!str, !!int, !!float, !!bool, !!null, "
                              "!!seq, !!map)"),
    (HEAD + "x: !!binary aGk=\n", "recipe.yaml:4:4: YAML tag !!binary is not allowed in recipes "
                                  "(only the core tags !!str, !!int, !!float, !!bool, !!null, "
                                  "!!seq, !!map)"),
    (HEAD + "base: &b {drop: /x}\nconfig:\n  config.json:\n    - *b\n",
     "recipe.yaml:4:7: YAML anchors (&b) are not allowed in recipes"),
    (HEAD + "config:\n  config.json:\n    - <<: *b\n",
     "recipe.yaml:6:11: YAML aliases (*b) are not allowed in recipes"),
    ("[" * 100 + "]" * 100, "recipe.yaml:1:65: nesting deeper than 64 levels"),
])
def test_yaml_level_refusals(text, expected):
    assert errors(text)[0] == expected


def test_billion_laughs_is_refused_before_composing(monkeypatch):
    from ruamel.yaml import YAML

    def no_compose(*args, **kwargs):
        raise AssertionError("the document must not be composed")

    monkeypatch.setattr(YAML, "load", no_compose)
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in "bcdefghi":
        prev = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [" + ",".join([f"*{prev}"] * 9) + "]")
    errs = errors("\n".join(lines) + "\n")
    assert errs[0] == "recipe.yaml:1:4: YAML anchors (&a) are not allowed in recipes"
    # one report per anchor and per aliased anchor name: the list stays short
    assert len(errs) == 17  # anchors &a..&i, aliases *a..*h


def test_oversized_text_is_refused_before_parsing(monkeypatch):
    from patcher.recipe import yaml_safe as recipe_yaml

    monkeypatch.setattr(recipe_yaml, "scan_events", lambda text: pytest.fail("parsed"))
    text = HEAD + "# " + "x" * MAX_RECIPE_BYTES + "\n"
    with pytest.raises(RecipeError, match=r"the limit is 1048576 \(1 MiB\)"):
        load_recipe(text, source_name="recipe.yaml")


def test_oversized_file_is_refused_without_reading_it(tmp_path, monkeypatch):
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(8 << 30)  # sparse 8 GiB file
    monkeypatch.setattr(Path, "open", lambda *a, **k: pytest.fail("opened"))
    with pytest.raises(RecipeError) as info:
        load_recipe(big)
    assert str(info.value) == (f"{big}: recipe is {8 << 30} bytes; the limit is 1048576 (1 MiB)")


def test_limit_boundary(monkeypatch, tmp_path):
    monkeypatch.setattr(recipe_mod, "MAX_RECIPE_BYTES", len(HEAD))
    assert load_recipe(HEAD).name == "t"
    with pytest.raises(RecipeError, match=f"recipe is {len(HEAD) + 1} bytes"):
        load_recipe(HEAD + "\n")
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + "\n")
    with pytest.raises(RecipeError, match=f"recipe is {len(HEAD) + 1} bytes"):
        load_recipe(path)


def test_non_utf8_recipe():
    with pytest.raises(RecipeError, match=r"<recipe>: recipe is not valid UTF-8 \(byte 39\)"):
        load_recipe(HEAD.encode() + b"# \xff\n")


# ------------------------------------------------------------------------------------ guards

def reader(files: dict):
    calls: list[str] = []

    def read_json(name: str):
        calls.append(name)
        return files.get(name)

    read_json.calls = calls  # type: ignore[attr-defined]
    return read_json


GUARDS = HEAD + """\
requires:
  - {file: config.json, path: /model_type, equals: deepseek_v3}
  - {file: config.json, path: /architectures, contains: DeepseekV3ForCausalLM}
  - {file: config.json, path: /name, contains: seek}
  - {file: config.json, path: /torch_dtype, one_of: [bfloat16, float16]}
  - {file: config.json, path: /quantization_config, exists: true}
  - {file: config.json, path: /rope_scaling, exists: false}
  - {file: config.json, path: /num_hidden_layers, equals: 61.0}
  - {file: config.json, path: /flag, equals: true}
"""
GOOD = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
        "name": "deepseek-v3", "torch_dtype": "bfloat16", "quantization_config": {},
        "num_hidden_layers": 61, "flag": True}


def test_guards_pass():
    read = reader({"config.json": GOOD})
    assert evaluate_guards(load(GUARDS), read) == []
    assert read.calls == ["config.json"]  # each file read once


def test_guards_fail_with_messages_naming_the_guard_line():
    bad = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "name": "llama",
           "torch_dtype": "float32", "rope_scaling": None, "num_hidden_layers": 32, "flag": 1}
    assert evaluate_guards(load(GUARDS), reader({"config.json": bad})) == [
        'recipe.yaml:5:5: config.json /model_type is "llama", not "deepseek_v3"',
        'recipe.yaml:6:5: config.json /architectures (["LlamaForCausalLM"]) does not contain '
        '"DeepseekV3ForCausalLM"',
        'recipe.yaml:7:5: config.json /name ("llama") does not contain "seek"',
        'recipe.yaml:8:5: config.json /torch_dtype is "float32", not one of ["bfloat16", '
        '"float16"]',
        "recipe.yaml:9:5: config.json /quantization_config is missing",
        "recipe.yaml:10:5: config.json /rope_scaling is present (null)",
        "recipe.yaml:11:5: config.json /num_hidden_layers is 32, not 61.0",
        "recipe.yaml:12:5: config.json /flag is 1, not true",  # JSON: 1 is not true
    ]


def test_guards_on_a_missing_file():
    text = HEAD + ("requires:\n  - {file: hf_quant_config.json, path: /quantization, "
                   "exists: true}\n  - {file: hf_quant_config.json, path: /x, exists: false}\n"
                   "  - {file: hf_quant_config.json, path: /x, equals: null}\n")
    assert evaluate_guards(load(text), reader({})) == [
        "recipe.yaml:5:5: there is no hf_quant_config.json",
        "recipe.yaml:7:5: there is no hf_quant_config.json",
    ]


def test_contains_on_other_types_and_missing_values():
    text = HEAD + ("requires:\n  - {file: c.json, path: /n, contains: 1}\n"
                   "  - {file: c.json, path: /missing, contains: 1}\n"
                   "  - {file: c.json, path: /list, contains: {a: 1}}\n")
    assert evaluate_guards(load(text), reader({"c.json": {"n": 1, "list": [{"a": 1}]}})) == [
        "recipe.yaml:5:5: c.json /n (1) does not contain 1",
        "recipe.yaml:6:5: c.json /missing is missing",
    ]


def test_combinators_and_custom_messages():
    text = HEAD + """\
requires:
  - any_of:
      - {file: c.json, path: /a, exists: true}
      - {file: c.json, path: /b, exists: true}
  - any_of:
      - {file: c.json, path: /a, exists: true}
      - {file: c.json, path: /b, exists: true}
    message: neither a nor b
  - all_of:
      - {file: c.json, path: /c, equals: 1}
      - {file: c.json, path: /d, equals: 2}
  - not: {file: c.json, path: /c, equals: 1}
  - not: {file: c.json, path: /e, exists: true}
  - any_of:
      - not: {file: c.json, path: /c, exists: true}
      - {file: c.json, path: /c, equals: 1, message: c must be one}
"""
    failures = evaluate_guards(load(text), reader({"c.json": {"c": 1, "d": 3}}))
    assert failures == [
        "recipe.yaml:5:5: none of these holds: (c.json /a is missing); (c.json /b is missing)",
        "recipe.yaml:8:5: neither a nor b",
        "recipe.yaml:12:5: c.json /d is 3, not 2",
        "recipe.yaml:15:5: expected not: c.json /c is 1",
    ]


def test_scoped_guards():
    text = HEAD + """\
requires:
  - {file: config.json, path: /quantization_config/kv_cache_scheme, exists: true,
     in: [/, /text_config]}
  - all_of:
      - {file: config.json, path: /model_type, equals: deepseek_v3}
      - {file: config.json, path: /num_hidden_layers, equals: 2}
    in: [/, /text_config]
  - not: {file: config.json, path: /model_type, equals: kimi_k25}
    in: /text_config
"""
    top = {"quantization_config": {"kv_cache_scheme": {}}, "model_type": "deepseek_v3",
           "num_hidden_layers": 2}
    nested = {"model_type": "kimi_k25",
              "text_config": {"quantization_config": {"kv_cache_scheme": {}},
                              "model_type": "deepseek_v3", "num_hidden_layers": 2}}
    recipe = load(text)
    assert evaluate_guards(recipe, reader({"config.json": top})) == []
    assert evaluate_guards(recipe, reader({"config.json": nested})) == []
    neither = {"model_type": "kimi_k25", "text_config": {"model_type": "kimi_k25"}}
    assert evaluate_guards(recipe, reader({"config.json": neither})) == [
        "recipe.yaml:5:5: in none of the scopes /, /text_config: config.json "
        "/quantization_config/kv_cache_scheme is missing; config.json "
        "/text_config/quantization_config/kv_cache_scheme is missing",
        'recipe.yaml:7:5: in none of the scopes /, /text_config: config.json /model_type is '
        '"kimi_k25", not "deepseek_v3"; config.json /num_hidden_layers is missing; config.json '
        '/text_config/model_type is "kimi_k25", not "deepseek_v3"; config.json '
        '/text_config/num_hidden_layers is missing',
        'recipe.yaml:11:5: expected not: config.json /text_config/model_type is "kimi_k25"',
    ]


def test_check_guards_raises_guard_refused():
    recipe = load(HEAD + "requires:\n  - {file: c.json, path: /a, exists: true}\n"
                         "  - {file: c.json, path: /b, exists: true}\n")
    check_guards(recipe, reader({"c.json": {"a": 1, "b": 2}}))
    with pytest.raises(GuardRefused) as info:
        check_guards(recipe, reader({"c.json": {}}))
    assert info.value.exit_code == 1
    assert str(info.value) == ("recipe 't' refuses this model: recipe.yaml:5:5: c.json /a is "
                               "missing (and 1 more)")
    assert len(info.value.failures) == 2


# -------------------------------------------------------------------------- built-in recipes

def test_builtin_recipe_dir_and_names():
    assert builtin_recipe_dir() == REPO / "patcher" / "builtin_recipes"
    assert builtin_recipe_dir().resolve() == (REPO / "recipes").resolve()
    assert "sm120-fp16-kv" in builtin_recipe_names()


def test_every_builtin_recipe_loads():
    for name in builtin_recipe_names():
        recipe = load_recipe(resolve_recipe(name))
        assert recipe.name == name


def test_resolve_recipe():
    path = resolve_recipe("sm120-fp16-kv")
    assert path == builtin_recipe_dir() / "sm120-fp16-kv.yaml"
    assert resolve_recipe("sm120-fp16-kv.yaml") == path
    assert resolve_recipe(str(path)) == path
    with pytest.raises(InputError) as info:
        resolve_recipe("sm120-fp8-kv")
    assert "built-in recipes: " in str(info.value) and "sm120-fp16-kv" in str(info.value)
    assert info.value.hint == "did you mean 'sm120-fp16-kv'?"
    with pytest.raises(InputError):
        resolve_recipe("some/dir/absent.yaml")


def test_a_file_in_the_current_directory_never_shadows_a_built_in(tmp_path, monkeypatch):
    """A cloned model repo ships a file named like a built-in recipe: the bare word still runs
    the built-in; the file runs only when named as a path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sm120-fp16-kv").write_text(HEAD)
    (tmp_path / "my-fix").write_text(HEAD)
    assert resolve_recipe("sm120-fp16-kv") == builtin_recipe_dir() / "sm120-fp16-kv.yaml"
    assert resolve_recipe("./sm120-fp16-kv") == Path("sm120-fp16-kv")
    with pytest.raises(InputError, match="write ./my-fix"):
        resolve_recipe("my-fix")
    assert resolve_recipe(Path("my-fix")) == Path("my-fix")     # a Path is always a path


def test_plan_and_apply_name_the_recipe_file_and_its_digest(tmp_path):
    from click.testing import CliRunner
    from hostile_helpers import make_model

    from patcher.cli import main

    recipe = builtin_recipe_dir() / "sm120-fp16-kv.yaml"
    digest = hashlib.sha256(recipe.read_bytes()).hexdigest()
    model = make_model(tmp_path / "m")
    plan = CliRunner().invoke(main, ["plan", "sm120-fp16-kv", str(model)])
    assert plan.exit_code == 0, plan.output
    assert f"recipe file {recipe.resolve()} sha256 {digest}" in plan.stdout
    as_json = json.loads(CliRunner().invoke(main, ["plan", "sm120-fp16-kv", str(model),
                                                   "--json"]).stdout)
    assert as_json["recipe"]["path"] == str(recipe.resolve())
    assert as_json["recipe"]["sha256"] == digest
    applied = CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(model), "--json",
                                        "-o", str(tmp_path / "out")])
    assert applied.exit_code == 0, applied.output
    assert json.loads(applied.stdout)["recipe"] == as_json["recipe"]


SM120 = "sm120-fp16-kv"
KV = {"dynamic": False, "num_bits": 8, "type": "float"}


@pytest.mark.parametrize("files", [
    {"config.json": {"quantization_config": {"kv_cache_scheme": KV}}},
    {"config.json": {"text_config": {"quantization_config": {"kv_cache_scheme": KV}}}},
    {"hf_quant_config.json": {"quantization": {"kv_cache_quant_algo": "FP8"}}},
    {"hf_quant_config.json": {"kv_cache_quant_algo": "FP8"}},
    {"hf_quant_config.json": {"quantization": {"kv_cache_scheme": KV}}},
    {"config.json": {"quantization_config": {"kv_cache_quant_algo": "fp8"}}},
    {"config.json": {"quantization_config": {"quantization": {"kv_cache_quant_algo": "FP8"}}}},
    {"config.json": {"quantization_config": {"quantization": {"kv_cache_scheme": KV}}}},
    {"config.json": {"text_config": {"quantization_config": {"kv_cache_quant_algo": "FP8"}}}},
])
def test_sm120_guard_accepts_each_fp8_kv_declaration(files):
    recipe = load_recipe(resolve_recipe(SM120))
    assert evaluate_guards(recipe, reader(files)) == []


@pytest.mark.parametrize("files", [
    {},
    {"config.json": {"quantization_config": {"quant_method": "modelopt"}}},
    {"config.json": {"quantization_config": {"kv_cache_scheme": None}}},
    {"config.json": {"quantization_config": {"kv_cache_scheme": {"num_bits": 8, "type": "int"}}}},
    {"hf_quant_config.json": {"quantization": {"kv_cache_quant_algo": None}}},
])
def test_sm120_guard_refuses_models_without_an_fp8_kv_cache(files):
    recipe = load_recipe(resolve_recipe(SM120))
    [failure] = evaluate_guards(recipe, reader(files))
    assert failure.endswith("the model declares no FP8 KV cache (no kv_cache_scheme of 8-bit "
                            "floats or kv_cache_quant_algo FP8 in config.json's "
                            "quantization_config, its text_config or hf_quant_config.json), so "
                            "this recipe has nothing to do")
    assert failure.startswith(f"{resolve_recipe(SM120).resolve()}:")  # recipes/NAME.yaml


def test_sm120_recipe_is_config_only_and_nulls_every_spelling():
    recipe = load_recipe(resolve_recipe(SM120))
    assert recipe.tensors == () and recipe.files == ()
    assert set(recipe.config) == {"config.json", "hf_quant_config.json"}
    assert [(op.path, op.scopes) for op in recipe.config["config.json"]] == [
        (f"/quantization_config{inner}/{key}", ("", "/text_config"))
        for inner in ("", "/quantization") for key in ("kv_cache_scheme", "kv_cache_quant_algo")]
    assert [(op.path, op.scopes) for op in recipe.config["hf_quant_config.json"]] == [
        ("/kv_cache_scheme", ("", "/quantization")),
        ("/kv_cache_quant_algo", ("", "/quantization"))]
    assert all(isinstance(op, PatchOp)
               and (op.op, op.value, op.missing_ok) == ("replace", None, True)
               for ops in recipe.config.values() for op in ops)


# ------------------------------------------------------------------------------ JSON Schema

def _schema_validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema,
                                           format_checker=jsonschema.FormatChecker())


def _plain(text: str):
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(text)


SCHEMA_VALID = [
    HEAD + "tensors:\n  - select: {group: [vision, lm_head], dtype: F32}\n    drop: true\n"
           "  - select: {regex: 'x', group: attention, layers: '< 3'}\n    cast: bf16\n",
    HEAD + "config:\n  config.json:\n    - each: /quantization_config/ignore\n"
           "      match: {regex: '^a\\.'}\n      replace: ''\n      in_step: true\n"
           "    - {each: /q/ignore, match: {glob: 'v*'}, remove: true}\n"
           "    - {append: /q/ignore, value: lm_head}\n",
    HEAD + "params:\n  f: {type: number, default: 2, description: x}\ninclude:\n  - yarn\n"
           "  - {recipe: yarn, params: {factor: '{f}'}}\nconfig:\n  config.json:\n"
           "    - set: /a\n      value: '{f} * {config.b} // 1'\n",
    HEAD + "tensors:\n  - select: {layers: '>= {config.num_hidden_layers}'}\n    drop: true\n"
           "  - select: {glob: 'x*', layers: '< 2'}\n    copy: {pattern: x, to: y}\n",
    HEAD + "output:\n  max_shard_size: 5GB\n",
    HEAD + "output:\n  max_shard_size: 1.5 GiB\n",
    HEAD + "output:\n  max_shard_size: 1000000\n",
    HEAD + "output:\n",
    FULL,
    HEAD,
    HEAD + "requires: []\nconfig: {}\nfiles: []\ntensors: []\n",
    HEAD + "config:\n  config.json:\n    - {op: add, path: /x, value: null}\n"
           "    - {op: replace, path: '', value: {}}\n    - {op: copy, from: /a, path: /b}\n"
           "    - {set: /a, value: [1, {b: c}], in: /text_config}\n",
    HEAD + "tensors:\n  - select: {glob: '*', dtype: F8_E4M3}\n"
           "    dequantize: {scheme: fp8-block, to: fp32}\n"
           "  - select: {glob: '*', dtype: [f32, bfloat16, torch.float8_e4m3fn, fp8]}\n"
           "    cast: float16\n"
           "  - select: {regex: '.*'}\n    quantize: {scheme: fp8-block, layout: "
           "compressed-tensors, block: [64, 32]}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n"
           "    dequantize: {scheme: fp8-block, block: [64, 64]}\n"
           "  - select: {glob: '*'}\n    dequantize: {scheme: auto, to: fp16, block: [1, 128]}\n",
    HEAD + "requires:\n  - not: {any_of: [{all_of: [{file: a.json, path: '', exists: true}]}]}\n"
           "    in: ['/', /x]\n    message: m\n",
    (REPO / "recipes" / "sm120-fp16-kv.yaml").read_text(),
    (REPO / "recipes" / "nvfp4a16.yaml").read_text(),
    HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: nvfp4-compressed-tensors, "
           "layout: compressed-tensors}\n",
]

SCHEMA_INVALID = [
    HEAD + "tensors:\n  - select: {group: visual}\n    drop: true\n",
    HEAD + "tensors:\n  - select: {glob: x, regex: y}\n    drop: true\n",
    HEAD + "config:\n  config.json:\n    - {each: /a, match: {glob: x}, replace: y}\n",
    HEAD + "config:\n  config.json:\n    - {each: /a, match: {glob: x}}\n",
    HEAD + "config:\n  config.json:\n    - {append: /a}\n",
    HEAD + "files:\n  - {add: x.txt, content: a, from: b.txt}\n",
    HEAD + "files:\n  - {add: x.txt}\n",
    HEAD + "params:\n  f: {type: float, description: x}\n",
    HEAD + "params:\n  f: {type: number}\n",
    HEAD + "include:\n  - {recipe: yarn, with: {}}\n",
    HEAD + "tensors:\n  - select: {layers: 'above 2'}\n    drop: true\n",
    HEAD + "tensors:\n  - select: {glob: x}\n    copy: {to: y}\n    drop: true\n",
    HEAD + "output:\n  max_shard_size: 5 lots\n",
    HEAD + "output:\n  max_shard_size: 5K\n",
    HEAD + "output:\n  max_shard_size: 0\n",
    HEAD + "output:\n  shards: 4\n",
    HEAD + "output: [1]\n",
    HEAD.replace("modelpatch: 1", "modelpatch: 2"),
    HEAD + "requries: []\n",
    "modelpatch: 1\nname: t\n",
    HEAD.replace("name: t", "name: Bad_Name"),
    HEAD + "config:\n  config.json:\n    - dorp: /x\n",
    HEAD + "config:\n  config.json:\n    - drop: x\n",
    HEAD + "config:\n  config.json:\n    - drop: /a~2\n",
    HEAD + "config:\n  config.json:\n    - drop: ''\n",
    HEAD + "config:\n  config.json:\n    - {drop: /x, set: /y, value: 1}\n",
    HEAD + "config:\n  config.json:\n    - {op: remove, path: /x, value: 1}\n",
    HEAD + "config:\n  config.json:\n    - {op: add, path: /x}\n",
    HEAD + "config:\n  config.json:\n    - {op: frob, path: /x}\n",
    HEAD + "config:\n  config.json:\n    - {architectures: []}\n",
    HEAD + "config:\n  /abs.json: []\n",
    HEAD + "config:\n  a/../b.json: []\n",
    HEAD + "config:\n  'a\\b.json': []\n",
    HEAD + "config:\n  '': []\n",
    HEAD + "files:\n  - drop: .modelpatch/x\n",
    HEAD + "files:\n  - add: x\n",
    HEAD + "requires:\n  - {file: c.json, path: /x}\n",
    HEAD + "requires:\n  - {file: c.json, path: /x, exists: true, equals: 1}\n",
    HEAD + "requires:\n  - {file: c.json, path: /x, exists: 1}\n",
    HEAD + "requires:\n  - {any_of: [], message: m}\n",
    HEAD + "requires:\n  - {any_of: [{file: c.json, path: /x, exists: true}], not: {}}\n",
    HEAD + "tensors:\n  - select: {regex: '('}\n    drop: true\n",
    HEAD + "tensors:\n  - select: {glob: '*', regex: x}\n    drop: true\n",
    HEAD + "tensors:\n  - select: {glob: '*', dtype: [f33]}\n    drop: true\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    drop: false\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    drop: true\n    cast: bf16\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: fp8-block, layout: "
           "modelopt}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: fp8-tensor, layout: "
           "modelopt, block: [1, 1]}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: fp8-block, layout: "
           "deepseek, block: [1]}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    dequantize: {scheme: nvfp4-modelopt, "
           "block: [64, 64]}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: nvfp4-modelopt, "
           "layout: modelopt}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: nvfp4-compressed-tensors, "
           "layout: modelopt}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    quantize: {scheme: nvfp4-compressed-tensors, "
           "layout: compressed-tensors, block: [16, 16]}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n"
           "    dequantize: {scheme: fp8-block, block: [0, 64]}\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    dequantize: {scheme: fp8-block, block: 64}\n",
]

# Checks only the loader can make (they need the whole recipe or Python's regex engine);
# the schema accepts these.
LOADER_ONLY = [
    HEAD + "output:\n  max_shard_size: 0GB\n",
    HEAD + "tensors:\n  - select: {glob: '*'}\n    rename: {to: x}\n",
    HEAD + "tensors:\n  - select: {regex: '^(a)'}\n    rename: {to: '\\2'}\n",
    HEAD + "config:\n  config.json: []\nfiles:\n  - drop: config.json\n",
    HEAD + "config:\n  config.json:\n    - {rename: /a, to: /a/b}\n",
]


@pytest.mark.parametrize("text", SCHEMA_VALID)
def test_schema_and_loader_accept(text):
    validator = _schema_validator()
    assert [e.message for e in validator.iter_errors(_plain(text))] == []
    load(text)


def test_dequantize_block_is_parsed():
    recipe = load(HEAD + "tensors:\n  - select: {glob: '*'}\n"
                  "    dequantize: {scheme: fp8-block, block: [64, 32]}\n")
    assert recipe.tensors[0].action == DequantizeTensors("fp8-block", "BF16", (64, 32))
    with pytest.raises(RecipeError, match="block applies to fp8-block or auto, not fp8-tensor"):
        load(HEAD + "tensors:\n  - select: {glob: '*'}\n"
             "    dequantize: {scheme: fp8-tensor, block: [64, 32]}\n")


@pytest.mark.parametrize("text", SCHEMA_INVALID)
def test_schema_and_loader_reject(text):
    validator = _schema_validator()
    assert list(validator.iter_errors(_plain(text))), "the schema accepted it"
    with pytest.raises(RecipeError):
        load(text)


@pytest.mark.parametrize("text", LOADER_ONLY)
def test_loader_only_checks(text):
    validator = _schema_validator()
    assert list(validator.iter_errors(_plain(text))) == []
    with pytest.raises(RecipeError):
        load(text)


def test_builtin_recipe_points_editors_at_the_schema():
    first = (REPO / "recipes" / "sm120-fp16-kv.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../patcher/schemas/recipe.schema.json"


# ------------------------------------------------------------------------------ no torch

def test_recipe_modules_do_not_import_torch():
    code = ("import sys\n"
            "import patcher.recipe.load, patcher.recipe.config_ops, patcher.config.jsonfile\n"
            "import patcher.recipe.guards\n"
            "patcher.recipe.load.load_recipe(patcher.recipe.load.resolve_recipe('sm120-fp16-kv'))\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_module_api():
    assert set(recipe_mod.__all__) >= {"load_recipe", "evaluate_guards", "builtin_recipe_dir",
                                       "resolve_recipe", "Recipe"}
