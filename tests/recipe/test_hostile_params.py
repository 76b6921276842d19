"""Hostile values in recipe parameters and templates: one ``modelpatch: error:`` line naming
the parameter or the recipe line (exit 2), never a traceback; nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher.cli import main
from patcher.errors import TemplateError
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
