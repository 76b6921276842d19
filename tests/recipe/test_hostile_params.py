"""Hostile values in recipe parameters and templates, and parameter ranges: one
``modelpatch: error:`` line naming the parameter or the recipe line (exit 2), never a
traceback; nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli import main
from patcher.errors import InputError, RecipeError, TemplateError
from patcher.recipe.load import load_recipe
from patcher.recipe.params.expr import parse_template


def _cli_error(*args: str, code: int = 2) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == code, (result.output, result.exc_info)
    assert result.exc_info[0] is SystemExit, result.exc_info      # no escaped exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelpatch: error: "), result.stderr
    return lines[0]


def _config_model(root: Path, config: str) -> Path:
    """A config-only model; ``config`` is raw JSON text (Python's json reads 1e400 as inf)."""
    root.mkdir()
    (root / "config.json").write_text(config)
    return root


# --- template arithmetic ------------------------------------------------------------------------

@pytest.mark.parametrize("value, needle", [
    ("1" + "0" * 400, "an integer of 401 digits) is outside the 64-bit integer range"),
    ("1e400", "inf is not a finite number"),
])
def test_yarn_on_a_huge_max_position_embeddings_is_one_line(tmp_path, value, needle):
    model = _config_model(tmp_path / "m", '{"model_type": "llama", "max_position_embeddings": '
                          + value + "}")
    line = _cli_error("apply", "yarn", model, "-o", tmp_path / "out")
    assert "yarn.yaml:" in line and "{config.max_position_embeddings}" in line, line
    assert needle in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, values, needle", [
    ("{a} * {b}", {"a": 2 ** 62, "b": 4}, "the result 18446744073709551616 is outside"),
    ("{a} / {b}", {"a": 10 ** 18, "b": 1e-300}, "the result inf is not a finite number"),
    ("{a} // {b}", {"a": 1e308, "b": 1e-308}, "the result inf is not a finite number"),
    ("{a} * 1e400", {"a": 1}, "the number inf is not a finite number"),
    ("{a} + 99999999999999999999", {"a": 1}, "outside the 64-bit integer range"),
    ("{a} * {b}", {"a": 3, "b": float("nan")}, "{b}: nan is not a finite number"),
])
def test_template_arithmetic_never_overflows_into_a_traceback(text, values, needle):
    with pytest.raises(TemplateError) as info:
        parse_template(text).evaluate(values.__getitem__)
    assert needle in str(info.value), str(info.value)


def test_template_arithmetic_keeps_exact_64_bit_integers():
    big = 2 ** 62
    assert parse_template("{a} - 1 + {a}").evaluate({"a": big}.__getitem__) == 2 ** 63 - 1
    assert parse_template("{a} * {b} // 1").evaluate({"a": 4.0, "b": 32768}.__getitem__) == 131072


# --- --set of a list parameter ------------------------------------------------------------------

NO_REMOTE = '{"model_type": "x", "architectures": ["XForCausalLM"], "auto_map": {}}'


@pytest.mark.parametrize("value, needle", [
    ("[NaN]", "NaN is not a finite number"),
    ('["A", Infinity]', "Infinity is not a finite number"),
    ("-Infinity,B", "-Infinity is not a finite number"),
    ("[" * 100000 + "]" * 100000, "nested deeper than 4 levels"),
    ('[[[[["A"]]]]]', "nested deeper than 4 levels"),
    ('A,[[[["B"]]]]', "nested deeper than 4 levels"),
])
def test_set_of_a_list_refuses_non_finite_numbers_and_deep_nesting(tmp_path, value, needle):
    model = _config_model(tmp_path / "m", NO_REMOTE)
    line = _cli_error("plan", "no-remote-code", model, "--set", "model_type=qwen3",
                      "--set", f"architectures={value}")
    assert "--set architectures=" in line and needle in line, line
    assert len(line) < 400, line


@pytest.mark.parametrize("value, want", [
    ('[[[["A"]]]]', [[[["A"]]]]),
    ('["a\\"[[[[[[", "B"]', ['a"[[[[[[', "B"]),
    ("A,B", ["A", "B"]),
])
def test_set_of_a_list_takes_plain_json_within_the_budget(tmp_path, value, want):
    model = _config_model(tmp_path / "m", NO_REMOTE)
    result = CliRunner().invoke(main, ["plan", "no-remote-code", str(model), "--json", "--set",
                                       "model_type=qwen3", "--set", f"architectures={value}"])
    assert result.exit_code == 0, result.output
    assert json.dumps(want) in json.dumps(json.loads(result.stdout)), result.stdout


# --- parameter ranges ---------------------------------------------------------------------------

HEAD = "modelpatch: 1\nname: ranged\ndescription: d\n"
RANGED = HEAD + """params:
  factor: {type: number, default: 2, exclusive_minimum: 0, maximum: 8, description: scale}
  mode: {type: string, default: a, enum: [a, b], description: which}
  ids: {type: integers, default: [1], minimum: 0, description: token ids}
config:
  config.json:
    - set: /x
      value: "{factor}"
    - set: /mode
      value: "{mode}"
    - set: /ids
      value: "{ids}"
"""


def test_yarn_refuses_a_negative_factor_naming_the_parameter_and_its_line(tmp_path):
    model = _config_model(tmp_path / "m", '{"model_type": "llama", "max_position_embeddings": 64}')
    line = _cli_error("apply", "yarn", model, "--set", "factor=-1", "-o", tmp_path / "out")
    assert "yarn.yaml:" in line and "parameter factor: -1 is below the minimum 1" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given, needle", [
    ("factor=0", "parameter factor: 0 is not above 0 (exclusive_minimum)"),
    ("factor=8.5", "parameter factor: 8.5 is above the maximum 8"),
    ("mode=c", 'parameter mode: "c" is not one of "a", "b"'),
    ("ids=3,-1", "parameter ids: -1 is below the minimum 0"),
])
def test_set_values_outside_the_declared_range_are_refused(tmp_path, given, needle):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RANGED)
    model = _config_model(tmp_path / "m", "{}")
    line = _cli_error("plan", recipe, model, "--set", given)
    assert needle in line and "r.yaml:" in line, line


def test_values_inside_the_range_are_taken(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RANGED)
    model = _config_model(tmp_path / "m", "{}")
    out = api.apply(recipe, model, out=tmp_path / "out",
                    params={"factor": "8", "mode": "b", "ids": "0,5"}).output
    assert json.loads((out / "config.json").read_text()) == {"x": 8, "mode": "b", "ids": [0, 5]}


@pytest.mark.parametrize("params, needle", [
    ("factor: {type: number, default: -1, minimum: 0, description: d}",
     "parameter factor: default -1 is below the minimum 0"),
    ("name: {type: string, minimum: 0, description: d}", "minimum bounds a number"),
    ("n: {type: integer, maximum: x, description: d}", "maximum must be a number"),
    ("n: {type: integer, minimum: 5, maximum: 1, description: d}", "no value fits"),
    ("n: {type: integer, enum: [1, a], description: d}", 'enum value "a" is not an integer'),
    ("n: {type: integers, enum: [[1]], description: d}", "enum lists values of a string"),
    ("n: {type: integer, enum: [], description: d}", "enum must be a non-empty list"),
])
def test_range_declarations_and_defaults_are_checked_at_load(params, needle):
    with pytest.raises(RecipeError) as info:
        load_recipe(HEAD + "params:\n  " + params + "\n")
    assert needle in str(info.value) and info.value.where.startswith("<recipe>:5:"), \
        (str(info.value), info.value.where)


def test_include_params_outside_the_range_are_refused_at_load_and_at_bind(tmp_path):
    (tmp_path / "ranged.yaml").write_text(RANGED)
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(HEAD.replace("ranged", "fixed") + "include:\n"
                     "  - {recipe: ./ranged.yaml, params: {factor: 9}}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(fixed)
    assert "parameter factor: 9 is above the maximum 8" in str(info.value)
    assert str(info.value.where).endswith("fixed.yaml:5:38"), info.value.where
    templated = tmp_path / "templated.yaml"
    templated.write_text(HEAD.replace("ranged", "templated") + "include:\n"
                         "  - {recipe: ./ranged.yaml, params: {factor: '{config.f}'}}\n")
    model = _config_model(tmp_path / "m", '{"f": -2}')
    with pytest.raises(InputError) as info:
        api.plan(templated, model)
    assert "parameter factor: -2 is not above 0" in str(info.value)
    assert "ranged.yaml:5:" in str(info.value.where), info.value.where


def test_recipes_show_lists_the_ranges():
    result = CliRunner().invoke(main, ["recipes", "show", "sampling-defaults"])
    assert "#   top_p (number > 0, <= 1, default 1.0)" in result.output, result.output
