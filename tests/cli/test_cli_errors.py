"""The command line a new user meets: errors with their did-you-mean and no traceback,
--debug/-q/--json on either side of the subcommand, JSON errors, a folder that is no model,
library errors worded as parameters and shown as flags, help for every option, readable lists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli import main
from patcher.errors import InputError
from patcher.recipe.load import builtin_recipe_dir, load_recipe

# 'vaule' (line 7) is why 'value' is missing (line 6): the did-you-mean is the second problem.
MISSPELLED = """\
modelpatch: 1
name: typo
description: misspelled value
config:
  config.json:
    - set: /max_position_embeddings
      vaule: 131072
"""
# four problems: the first (a missing name) has no did-you-mean, the third does
MANY = """\
modelpatch: 1
description: many problems
config:
  config.json:
    - set: /a
      vaule: 1
    - set: /b
      value: 2
      bogus: 3
extra_key: 1
"""


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


@pytest.fixture
def recipe(tmp_path) -> Path:
    path = tmp_path / "typo.yaml"
    path.write_text(MISSPELLED)
    return path


def _error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("modelpatch:")]


# --- the first problem, its did-you-mean and a count, without --debug ---------------

def test_first_problem_and_its_did_you_mean_without_debug(recipe, kimi_dir):
    result = run("plan", recipe, kimi_dir)
    assert result.exit_code == 2
    lines = _error_lines(result)
    assert lines[0] == f"modelpatch: error: {recipe}:6:7: 'set' operation needs 'value'"
    assert lines[1].endswith("unknown key 'vaule' in 'set' operation (did you mean 'value'?)")
    assert len(lines) == 2 and "Traceback" not in result.output


def test_the_rest_is_counted(tmp_path, kimi_dir):
    path = tmp_path / "many.yaml"
    path.write_text(MANY)
    problems = load_error(path).errors
    assert len(problems) == 5
    lines = _error_lines(run("plan", path, kimi_dir))
    assert lines[0] == f"modelpatch: error: {problems[0]}"
    assert lines[1] == (f"modelpatch: error: {problems[2]} "      # the first did-you-mean
                        "(and 3 more; --debug lists them all)")
    assert "did you mean 'value'" in lines[1]
    assert len(lines) == 2


def test_one_problem_line_without_a_did_you_mean(tmp_path, kimi_dir):
    path = tmp_path / "two.yaml"
    path.write_text(MISSPELLED.replace("vaule", "value").replace("config:", "extra: 1\nother: 2"
                                                                 "\nconfig:"))
    problems = load_error(path).errors
    assert len(problems) == 2 and not any("did you mean" in p for p in problems)
    lines = _error_lines(run("plan", path, kimi_dir))
    assert lines == [f"modelpatch: error: {problems[0]} (and 1 more; --debug lists them all)"]


def load_error(path: Path):
    with pytest.raises(Exception) as info:
        load_recipe(path)
    return info.value


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_lists_every_problem_without_a_traceback(tmp_path, kimi_dir, where):
    path = tmp_path / "many.yaml"
    path.write_text(MANY)
    args = ["plan", path, kimi_dir]
    result = run(*(["--debug", *args] if where == "before" else [*args, "--debug"]))
    assert result.exit_code == 2
    assert _error_lines(result) == [f"modelpatch: error: {p}" for p in load_error(path).errors]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("how", ["twice", "env"])
def test_the_traceback_on_request(recipe, kimi_dir, how):
    if how == "twice":
        result = run("--debug", "plan", recipe, kimi_dir, "--debug")
    else:
        result = run("plan", recipe, kimi_dir, env={"MODELPATCH_TRACEBACK": "1"})
    assert result.exit_code == 2                     # still the documented exit code
    assert "Traceback (most recent call last)" in result.stderr
    assert "RecipeError" in result.stderr


@pytest.mark.parametrize("command", ["plan", "inspect", "revert", "verify", "apply"])
def test_quiet_and_json_after_the_subcommand(command, kimi_dir, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(kimi_dir, model)
    args = {"plan": ["plan", "sm120-fp16-kv", model], "inspect": ["inspect", model],
            "revert": ["revert", model], "verify": ["verify", model],
            "apply": ["apply", "sm120-fp16-kv", model, "-o", tmp_path / "v"]}[command]
    result = run(*args, "-q", "--json")
    assert "no such option" not in result.output.lower(), result.output
    data = json.loads(result.stdout)
    if command in ("revert", "verify"):            # no patch recorded, no manifest: errors
        assert result.exit_code == 2 and data["error"]["exit_code"] == 2
    else:
        assert result.exit_code == 0 and "error" not in data


def test_group_json_before_the_subcommand_makes_its_output_json(kimi_dir):
    result = run("--json", "plan", "sm120-fp16-kv", kimi_dir)
    assert result.exit_code == 0
    assert "files" in json.loads(result.stdout)


# --- a folder that is not a model ---------------------------------------------------

def test_inspect_of_a_folder_that_is_no_model(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("hello")
    result = run("inspect", tmp_path / "notes")
    assert result.exit_code == 2 and result.stdout == ""
    assert _error_lines(result) == [f"modelpatch: error: {tmp_path / 'notes'}: not a model "
                                    "directory (no config.json, no *.safetensors, no *.gguf)"]
    with pytest.raises(InputError, match="not a model directory"):
        api.inspect(tmp_path / "notes")


# --- errors as JSON under --json ----------------------------------------------------

@pytest.mark.parametrize("where", ["before", "after"])
def test_json_error_on_stdout_and_text_on_stderr(recipe, kimi_dir, where):
    args = ["plan", recipe, kimi_dir]
    result = run(*(["--json", *args] if where == "before" else [*args, "--json"]))
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert {"type", "message", "where", "hint", "exit_code"} <= set(error)
    assert error["type"] == "RecipeError" and error["exit_code"] == 2
    assert error["where"] == f"{recipe}:6:7"
    assert error["message"] == "'set' operation needs 'value'"
    assert any("did you mean 'value'" in p for p in error["problems"])
    assert _error_lines(result)[0].startswith("modelpatch: error: ")


def test_json_usage_error(tmp_path):
    result = run("--json", "apply", "sm120-fp16-kv", tmp_path, "--in-place", "-o", tmp_path / "x")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["type"] == "UsageError" and error["exit_code"] == 2
    assert "exclude each other" in error["message"]


def test_json_os_error(kimi_dir, tmp_path, monkeypatch):
    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x"))

    monkeypatch.setattr(api, "inspect", refuse)
    result = run("inspect", kimi_dir, "--json")
    assert result.exit_code == 3
    assert json.loads(result.stdout)["error"] == {
        "type": "PermissionError", "message": "Permission denied", "where": str(tmp_path / "x"),
        "hint": None, "exit_code": 3, "tensor": None, "problems": []}


# --- help for every option, -q everywhere, parameters in the library ---------------

def _commands(group: click.Group, path=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def test_every_option_has_help():
    missing = [f"{name} {'/'.join(param.opts)}"
               for name, command in [("modelpatch", main), *_commands(main)]
               for param in command.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert missing == []


def test_every_command_takes_the_global_options():
    for name, command in _commands(main):
        opts = {opt for param in command.params for opt in param.opts}
        assert {"-q", "--debug", "--json"} <= opts, name


def test_library_errors_speak_of_parameters_the_cli_of_flags(kimi_dir, tmp_path):
    out = tmp_path / "variant"
    api.apply("sm120-fp16-kv", kimi_dir, out=out)
    with pytest.raises(InputError) as info:
        api.apply("sm120-fp16-kv", kimi_dir, out=out)
    assert info.value.hint == "force=True replaces it" and "--force" not in str(info.value)
    result = run("apply", "sm120-fp16-kv", kimi_dir, "-o", out)
    assert result.exit_code == 2
    assert _error_lines(result) == [f"modelpatch: error: {out}: output already exists "
                                    "(--force replaces it)"]
    with pytest.raises(InputError) as info:
        api.apply("sm120-fp16-kv", kimi_dir, out=kimi_dir)
    assert "apply_in_place()" in str(info.value)
    assert "--in-place" in run("apply", "sm120-fp16-kv", kimi_dir, "-o", kimi_dir).stderr


def test_parameters_become_flags_in_messages_and_log_lines():
    import logging

    from patcher.cli.error_report import FlagWording, as_flags

    assert as_flags("force=True reverts anyway; use device='cpu'") == \
        "--force reverts anyway; use --device cpu"
    assert as_flags("verify() lists them") == "`modelpatch verify` lists them"
    assert as_flags("no parameter here: enforce=True") == "no parameter here: enforce=True"
    record = logging.LogRecord("modelpatch", logging.WARNING, __file__, 1,
                               "%s: reverting anyway (force=True)", ("/m",), None)
    assert FlagWording().filter(record) and record.getMessage() == "/m: reverting anyway (--force)"


# --- readable lists -----------------------------------------------------------------

@pytest.mark.parametrize("columns", [60, 100, 1000])
def test_recipes_list_fits_the_terminal_and_cuts_at_a_word(columns):
    result = run("recipes", "list", env={"COLUMNS": str(columns)})
    assert result.exit_code == 0
    descriptions = {r.name: " ".join(r.description.split()) for r in
                    map(load_recipe, sorted(builtin_recipe_dir().glob("*.yaml")))}
    lines = [line for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert len(lines) == len(descriptions)
    assert all(len(line) <= columns for line in result.stdout.splitlines())   # params lines too
    for line in lines:
        name, shown = line.split(None, 1)
        full = descriptions[name]
        assert len(line) <= columns
        if shown != full:
            assert shown.endswith("…")
            kept = shown[:-1]
            assert full.startswith(kept) and full[len(kept)] in " ,;:.-"
    if columns == 1000:
        assert all(not line.endswith("…") for line in lines)


def test_plan_lists_shards_in_order_with_companions_under_their_weight(kimi_dir):
    text = run("plan", "nvfp4-to-bf16", kimi_dir).stdout
    block = text[text.index("tensors:"):].split("\n\n")[0].splitlines()
    shards = [line.strip() for line in block if line.startswith("  ") and
              not line.startswith("    ")]
    assert shards == sorted(shards) and len(shards) > 1
    assert "(companion of" not in text
    assert max(map(len, block)) <= 130
    weight = next(i for i, line in enumerate(block) if line.endswith("(dequantize:nvfp4-modelopt)"))
    assert [line.split()[1] for line in block[weight + 1:weight + 4]] == [
        "input_scale", "weight_scale", "weight_scale_2"]
    assert all(line.startswith("        - ") for line in block[weight + 1:weight + 4])
    shown = sum(1 for line in block if line.lstrip()[:2] in ("~ ", "- ", "+ ", "> "))
    more = sum(int(line.split()[2]) for line in block if line.strip().startswith("... and"))
    assert shown + more == int(block[0].split()[1])       # "tensors: N touched": all counted
