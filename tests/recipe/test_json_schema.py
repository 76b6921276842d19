"""The recipe JSON Schema is generated from the loader's tables (``patcher.recipe.json_schema``):
the committed file is its output, it is a valid Draft 2020-12 schema, every recipe shipped passes
it, and a name or key added to the code reaches it without a second edit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher.cli import main
from patcher.recipe import json_schema, sections
from patcher.recipe.load import load_recipe
from patcher.recipe.tensor_ops import schema as tensor_schema
from patcher.tensors.schemes import SCHEMES

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "patcher" / "schemas" / "recipe.schema.json"
SHIPPED = sorted([*(REPO / "recipes").glob("*.y*ml"), *(REPO / "examples").rglob("*.y*ml")])


def _validator(schema: dict):
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def test_the_committed_schema_is_the_generators_output():
    assert SCHEMA_PATH.read_text(encoding="utf-8") == json_schema.schema_text(), (
        "patcher/schemas/recipe.schema.json is out of date; regenerate it with "
        + json_schema.REGENERATE)


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(json_schema.recipe_schema())


def test_recipes_schema_prints_it():
    result = CliRunner().invoke(main, ["recipes", "schema"])
    assert result.exit_code == 0, result.output
    assert result.output == json_schema.schema_text()
    assert json.loads(result.output)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_every_built_in_recipe_is_checked():
    assert {p.stem for p in SHIPPED} >= {p.stem for p in (REPO / "recipes").glob("*.yaml")}
    assert len(SHIPPED) >= 20


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_recipe_passes_the_schema_and_the_loader(path):
    from ruamel.yaml import YAML

    load_recipe(path)
    data = YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))
    problems = [f"{list(e.absolute_path)}: {e.message}"
                for e in _validator(json_schema.recipe_schema()).iter_errors(data)]
    assert problems == []


def test_the_quantize_schemes_are_the_registrys():
    defs = json_schema.recipe_schema()["$defs"]
    quantize = defs["tensorOp"]["properties"]["quantize"]
    dequantize = defs["tensorOp"]["properties"]["dequantize"]
    assert quantize["properties"]["scheme"]["enum"] == [
        name for name, scheme in SCHEMES.items() if scheme.layouts]
    assert {branch["properties"]["scheme"]["const"]: branch["properties"]["layout"]["enum"]
            for branch in quantize["oneOf"]} == {
        name: list(scheme.layouts) for name, scheme in SCHEMES.items() if scheme.layouts}
    assert dequantize["properties"]["scheme"]["enum"] == [*SCHEMES, "auto"]
    layouts = quantize["properties"]["layout"]["enum"]
    assert {lay for scheme in SCHEMES.values() for lay in scheme.layouts} <= set(layouts)


def test_a_new_scheme_reaches_the_schema(monkeypatch):
    """A scheme that gains layouts in the registry (as an NVFP4 quantizer would) becomes a
    quantize scheme of the loader's tables, and so of the schema, with its own layouts."""
    monkeypatch.setattr(tensor_schema, "QUANT_SCHEMES", (*tensor_schema.QUANT_SCHEMES, "nv-x"))
    monkeypatch.setattr(tensor_schema, "QUANT_COMBINATIONS",
                        (*tensor_schema.QUANT_COMBINATIONS, ("nv-x", "modelopt")))
    validator = _validator(json_schema.recipe_schema())
    ok = {"modelpatch": 1, "name": "t", "description": "d", "tensors": [
        {"select": {"glob": "*"}, "quantize": {"scheme": "nv-x", "layout": "modelopt"}}]}
    assert list(validator.iter_errors(ok)) == []
    ok["tensors"][0]["quantize"]["layout"] = "deepseek"
    assert list(validator.iter_errors(ok))
    ok["tensors"][0]["quantize"] = {"scheme": "nv-x", "layout": "modelopt", "block": [1, 1]}
    assert list(validator.iter_errors(ok))


def test_a_key_added_to_the_loader_reaches_the_schema(monkeypatch):
    keys = {**sections.CONFIG_KEYS, "drop": (*sections.CONFIG_KEYS["drop"], "allow_empty")}
    monkeypatch.setattr(sections, "CONFIG_KEYS", keys)
    drop = json_schema.recipe_schema()["$defs"]["configOp"]["oneOf"][0]
    assert drop["required"] == ["drop"] and drop["properties"]["allow_empty"] == {
        "type": "boolean"}


def test_a_key_without_a_value_schema_fails_the_build(monkeypatch):
    keys = {**sections.CONFIG_KEYS, "drop": (*sections.CONFIG_KEYS["drop"], "frobnicate")}
    monkeypatch.setattr(sections, "CONFIG_KEYS", keys)
    with pytest.raises(KeyError, match="'frobnicate'.*json_schema_values._VALUES"):
        json_schema.recipe_schema()


HEAD = "modelpatch: 1\nname: t\ndescription: d\n"
GGUF_VALID = [
    HEAD + "gguf:\n  requires:\n    - {key: general.architecture, one_of: [llama], "
           "missing_ok: true, message: m}\n  metadata:\n"
           "    - {set: '{arch}.context_length', from_key: '{arch}.context_length', multiply: 4}\n"
           "    - {set: a.b, value: [1, 2], type: 'array[uint32]'}\n"
           "    - {drop: general.url, missing_ok: true}\n    - {rename: general.name, to: x}\n"
           "  tensors:\n    - {select: {glob: 'blk.*.nextn.*', layers: '3-'}, drop: true}\n"
           "    - {select: {regex: '^output'}, rename: {pattern: '^output', to: lm_head}}\n"
           "  strip_nextn: true\n",
    HEAD + "tensors:\n  - select: {glob: a}\n    scale: {cast: double, reshape: []}\n",
]
GGUF_INVALID = [
    HEAD + "gguf:\n  metadata:\n    - {sett: a.b, value: 1}\n",
    HEAD + "gguf:\n  metadata:\n    - {set: a.b, value: 1, from_key: c}\n",
    HEAD + "gguf:\n  metadata:\n    - {set: a.b}\n",
    HEAD + "gguf:\n  metadata:\n    - {drop: a.b, to: c}\n",
    HEAD + "gguf:\n  requires:\n    - {one_of: [llama]}\n",
    HEAD + "gguf:\n  tensors:\n    - {select: {glob: x}, drop: true, extra: 1}\n",
    HEAD + "gguf:\n  tensors:\n    - {select: {globb: x}, drop: true}\n",
    HEAD + "gguf:\n  stripnextn: true\n",
]


def _plain(text: str):
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(text)


@pytest.mark.parametrize("text", GGUF_VALID)
def test_schema_and_loader_accept_gguf_items_and_scale_spellings(text):
    assert [e.message for e in _validator(json_schema.recipe_schema()).iter_errors(
        _plain(text))] == []
    load_recipe(text)


@pytest.mark.parametrize("text", GGUF_INVALID)
def test_schema_and_loader_reject_bad_gguf_keys(text):
    from patcher.errors import RecipeError

    assert list(_validator(json_schema.recipe_schema()).iter_errors(_plain(text)))
    with pytest.raises(RecipeError):
        load_recipe(text)
