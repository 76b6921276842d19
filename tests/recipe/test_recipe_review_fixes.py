"""Fixes from the session-4 CLI review (recipes, params, ``from:`` sources, built-ins)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli import main
from patcher.errors import InputError, PlanError, RecipeError
from patcher.recipe.load import load_recipe

HEAD = "modelpatch: 1\nname: t\ndescription: d\n"
ZEROS = "0" * 64


def _run(args: list[str]):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _model(path: Path, **tokenizer_config) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 2}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>",
                                                            **tokenizer_config}))
    return path


# --------------------------------------------------------------- item 3: sha256 pins

@pytest.mark.parametrize("source", ["t.jinja", "hf://alice/templates/t.jinja"])
@pytest.mark.parametrize("pin", [ZEROS, "0", "null", "1" * 64])
def test_a_pin_yaml_reads_as_a_number_or_null_is_refused_not_ignored(tmp_path, source, pin):
    (tmp_path / "t.jinja").write_text("hello")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(HEAD + f"files:\n  - add: out.txt\n    from: {source}\n"
                      f"    sha256: {pin}\n")
    with pytest.raises(RecipeError, match=r"sha256: must be a string of 64 lowercase hex "
                       r"digits \(quote it\); got") as caught:
        load_recipe(recipe)
    assert "r.yaml:7:13" in caught.value.one_line()


def test_a_pin_a_parameter_gives_as_a_number_is_refused_once_named(tmp_path):
    (tmp_path / "t.jinja").write_text("hello")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(HEAD + "params:\n  pin: {type: integer, description: d}\n"
                      "files:\n  - {add: out.txt, from: 'hf://alice/t/t.jinja', sha256: '{pin}'}\n")
    model = _model(tmp_path / "m")
    for value, got in (("0", "got 0"), ("7", "got 7")):
        with pytest.raises(PlanError, match="sha256: must be a string") as caught:
            api.plan(str(recipe), model, options={"params": {"pin": value}})
        assert caught.value.one_line().count(got) == 1


def test_a_bad_string_pin_names_the_value_once(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(HEAD + "params:\n  pin: {type: string, description: d}\n"
                      "files:\n  - {add: out.txt, from: 'hf://alice/t/t.jinja', sha256: '{pin}'}\n")
    model = _model(tmp_path / "m")
    with pytest.raises(PlanError, match="64 lowercase hex digits") as caught:
        api.plan(str(recipe), model, options={"params": {"pin": "abc"}})
    assert caught.value.one_line().count("'abc'") == 1
