"""One dtype vocabulary: every common spelling in select/cast/dequantize,
one canonical form out, did-you-mean for near misses; ``set`` with ``create_parents: false``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patcher import api
from patcher.errors import PlanError, RecipeError
from patcher.recipe.load import load_recipe
from patcher.recipe.schema import FLOAT_TARGETS, SAFETENSORS_DTYPES, CastTensors, DequantizeTensors
from patcher.recipe.tensor_ops.dtype_names import ALIASES, canonical_dtype, spellings

REPO = Path(__file__).resolve().parents[2]
HEAD = "modelpatch: 1\nname: t\ndescription: d\n"


@pytest.mark.parametrize("spelling, name", [
    ("BF16", "BF16"), ("bf16", "BF16"), ("bfloat16", "BF16"), ("torch.bfloat16", "BF16"),
    ("F32", "F32"), ("fp32", "F32"), ("float32", "F32"), ("Float32", "F32"), ("float", "F32"),
    ("F16", "F16"), ("fp16", "F16"), ("float16", "F16"), ("half", "F16"),
    ("F8_E4M3", "F8_E4M3"), ("fp8", "F8_E4M3"), ("float8_e4m3fn", "F8_E4M3"),
    ("torch.float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("U8", "U8"),
    ("uint8", "U8"), ("float8_e8m0fnu", "F8_E8M0"), ("float4_e2m1fn_x2", "F4"),
])
def test_every_common_spelling_is_one_canonical_name(spelling, name):
    assert canonical_dtype(spelling) == name
    text = HEAD + f"tensors:\n  - select: {{glob: '*', dtype: [{spelling}]}}\n    drop: true\n"
    assert load_recipe(text).tensors[0].select.dtypes == (name,)


@pytest.mark.parametrize("spelling, name", [
    ("bf16", "BF16"), ("BF16", "BF16"), ("bfloat16", "BF16"), ("F32", "F32"), ("float32", "F32"),
    ("fp16", "F16"), ("torch.float16", "F16")])
def test_cast_and_dequantize_take_every_spelling(spelling, name):
    cast = load_recipe(HEAD + f"tensors:\n  - select: {{glob: '*'}}\n    cast: {spelling}\n")
    assert cast.tensors[0].action == CastTensors(name)
    deq = load_recipe(HEAD + "tensors:\n  - select: {glob: '*'}\n"
                      f"    dequantize: {{scheme: auto, to: {spelling}}}\n")
    assert deq.tensors[0].action == DequantizeTensors("auto", name)


@pytest.mark.parametrize("where, spelling, message", [
    ("select", "flaot32", "unknown dtype 'flaot32' (did you mean 'F32'?)"),
    ("select", "bf61", "unknown dtype 'bf61' (did you mean 'BF16'?)"),
    ("cast", "F23", "cast: unknown dtype 'F23' (did you mean 'F32'?)"),
    ("cast", "float8_e4m3fn",
     "cast: dtype 'float8_e4m3fn' (F8_E4M3) is not allowed here; use one of BF16, F16, F32"),
    ("dequantize", "bfloat61", "to: unknown dtype 'bfloat61' (did you mean 'BF16'?)"),
])
def test_near_misses_get_a_did_you_mean_in_canonical_form(where, spelling, message):
    item = {"select": f"  - select: {{glob: '*', dtype: {spelling}}}\n    drop: true\n",
            "cast": f"  - select: {{glob: '*'}}\n    cast: {spelling}\n",
            "dequantize": f"  - select: {{glob: '*'}}\n    dequantize: {{scheme: auto, "
                          f"to: {spelling}}}\n"}[where]
    with pytest.raises(RecipeError) as info:
        load_recipe(HEAD + "tensors:\n" + item)
    assert info.value.message == message


def test_the_plan_prints_the_canonical_name(deepseek_fp8_dir, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(HEAD + "tensors:\n  - select: {glob: '*.embed_tokens.weight', "
                      "dtype: bfloat16}\n    cast: float32\n")
    data = api.plan(recipe, deepseek_fp8_dir).to_json()
    converted = [c for c in data["changes"] if c.get("kind") == "tensor_converted"]
    assert converted and all(c["before"]["dtype"] == "BF16" and c["after"]["dtype"] == "F32"
                             for c in converted)


def test_the_schema_lists_the_same_spellings():
    defs = json.loads((REPO / "patcher" / "schemas" / "recipe.schema.json").read_text())["$defs"]
    assert defs["dtype"]["enum"] == spellings()
    assert defs["floatTarget"]["enum"] == spellings(FLOAT_TARGETS)
    assert set(SAFETENSORS_DTYPES) <= set(spellings())
    assert all(canonical_dtype(s) for s in spellings())
    assert set(ALIASES.values()) == set(SAFETENSORS_DTYPES)


# --- set: create_parents ---------------------------------------------------------------------

def _set_recipe(tmp_path, extra: str) -> Path:
    path = tmp_path / "set.yaml"
    path.write_text(HEAD + "config:\n  config.json:\n    - set: /rope_scaling_new/factor\n"
                    f"      value: 4.0\n{extra}")
    return path


def test_set_creates_missing_parents_by_default(kimi_dir, tmp_path):
    data = api.plan(_set_recipe(tmp_path, ""), kimi_dir).to_json()
    assert any("rope_scaling_new" in json.dumps(c) for c in data["changes"])


def test_set_with_create_parents_false_refuses_a_missing_parent(kimi_dir, tmp_path):
    with pytest.raises(PlanError, match=r"/rope_scaling_new does not exist "
                                        r"\(create_parents: false\)"):
        api.plan(_set_recipe(tmp_path, "      create_parents: false\n"), kimi_dir)
    recipe = HEAD + "config:\n  config.json:\n    - {set: /a, value: 1, create_parents: 2}\n"
    with pytest.raises(RecipeError, match="'create_parents' must be true or false"):
        load_recipe(recipe)


def test_the_schema_knows_create_parents():
    jsonschema = pytest.importorskip("jsonschema")
    from ruamel.yaml import YAML

    schema = json.loads((REPO / "patcher" / "schemas" / "recipe.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    ok = HEAD + "config:\n  config.json:\n    - {set: /a/b, value: 1, create_parents: false}\n"
    bad = HEAD + "config:\n  config.json:\n    - {set: /a/b, value: 1, create_parent: false}\n"
    assert list(validator.iter_errors(YAML(typ="safe", pure=True).load(ok))) == []
    assert list(validator.iter_errors(YAML(typ="safe", pure=True).load(bad)))
