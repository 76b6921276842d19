"""One option vocabulary: ``-o``, ``--force``, ``--link``/``--copy``, ``--json`` and
``--endpoint`` are spelled, typed and named alike on every command that takes them; ``--json``
is real wherever it is accepted; usage errors are one ``modelpatch: error:`` line; a hub name
given as a path says how to read it from the hub."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import json
import os
import shutil

import click
import pytest
from click.testing import CliRunner
from hub_fixtures import hub  # noqa: F401

from patcher import api
from patcher.cli import main

SHARED = {"-o": "out", "--force": "force", "--link": "link", "--copy": "force_copy",
          "--json": "as_json", "--endpoint": "endpoint"}


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def _commands(group: click.Group, path=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def _shape(param: click.Option) -> tuple:
    return (tuple(sorted(param.opts)), param.name, param.is_flag, type(param.type).__name__,
            getattr(param.type, "choices", None), param.envvar, param.default)


def test_each_shared_option_has_one_shape_on_every_command():
    shapes: dict[str, set] = {}
    for name, command in [("modelpatch", main), *_commands(main)]:
        for param in command.params:
            for opt in set(param.opts) & set(SHARED):
                assert param.name == SHARED[opt], (name, opt, param.name)
                shapes.setdefault(opt, set()).add(_shape(param))
    assert {opt: len(s) for opt, s in shapes.items()} == {opt: 1 for opt in SHARED}


@pytest.mark.parametrize("command", [["plan"], ["doctor"], ["apply"]])
def test_link_and_copy_go_together(command):
    opts = {opt for param in main.commands[command[0]].params for opt in param.opts}
    assert {"--link", "--copy"} <= opts


def test_no_help_shows_a_parameter_name_as_a_default():
    for name, command in _commands(main):
        with click.Context(command, info_name=name) as ctx:
            text = command.get_help(ctx)
        assert "(as_json)" not in text and "[default: (" not in text, name


def test_json_shapes_the_result_of_every_command_that_has_one():
    errors_only = sorted(name for name, command in _commands(main) for param in command.params
                         if "--json" in param.opts and not param.expose_value)
    assert errors_only == ["hub serve", "recipes schema"]       # a server; JSON already
    for name, command in _commands(main):
        (json_param,) = [p for p in command.params if "--json" in p.opts]
        assert json_param.help.startswith("Errors as") is (name in errors_only), name


# --- one line for a usage error -------------------------------------------------------------

@pytest.mark.parametrize("args, line", [
    (["apply"], "modelpatch: error: missing argument 'MODEL' (see `modelpatch apply --help`)"),
    (["inspect", "x", "--jsn"], "modelpatch: error: no such option '--jsn', did you mean "
                                "'--json'? (see `modelpatch inspect --help`)"),
    (["nosuch"], "modelpatch: error: no such command 'nosuch' (see `modelpatch --help`)"),
    (["recipes", "show"], "modelpatch: error: missing argument 'NAME' (see `modelpatch recipes "
                          "show --help`)"),
    (["apply", "yarn", "m", "--in-place", "-o", "x"],
     "modelpatch: error: --in-place and -o/--output exclude each other (see `modelpatch apply "
     "--help`)"),
])
def test_a_usage_error_is_one_line(args, line):
    result = run(*args)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", line + "\n")


@pytest.mark.parametrize("args", [[], ["recipes"], ["hub"]])
def test_a_group_without_a_command_shows_its_help_whole(args):
    result = run(*args)
    assert "Commands:" in result.output and "modelpatch: error" not in result.output


def test_a_usage_error_under_json_is_a_json_error_too():
    result = run("--json", "plan")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["message"] == "missing argument 'RECIPE...'"
    assert result.stderr.startswith("modelpatch: error: missing argument")


# --- --json is real -------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["before", "after"])
def test_recipes_list_json(where):
    result = run(*(["--json", "recipes", "list"] if where == "before" else
                   ["recipes", "list", "--json"]))
    assert result.exit_code == 0, result.output
    found = {r["name"]: r for r in json.loads(result.stdout)}
    yarn = found["yarn"]
    assert yarn["description"].startswith("Turn on YaRN")
    assert yarn["params"] == [{"name": "factor", "type": "number", "required": False,
                               "default": 4.0, "minimum": 1, "description": yarn["params"][0][
                                   "description"]}]
    assert found["chat-template"]["params"][0]["required"] is True


def test_recipes_show_json():
    result = run("recipes", "show", "yarn", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["name"] == "yarn" and data["text"].startswith("# yaml-language-server")
    assert data["path"].endswith("yarn.yaml") and len(data["sha256"]) == 64
    assert [p["name"] for p in data["params"]] == ["factor"]


def test_pull_json(hub, kimi_dir, tmp_path, monkeypatch):
    base = tmp_path / "kimi"
    shutil.copytree(kimi_dir, base)
    variant = api.apply("sm120-fp16-kv", base, out=tmp_path / "v").output
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/v", endpoint=hub.endpoint)
    result = run("pull", "alice/v", "-o", tmp_path / "pulled", "--endpoint", hub.endpoint,
                 "--json", "-q")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["output"] == str(tmp_path / "pulled") and data["repo_id"] == "alice/v"
    assert data["files"] > 0 and len(data["commit"]) == 40
    assert {"reused_bytes", "downloaded_bytes"} <= set(data)


# --- plan --copy, inspect org/name ------------------------------------------------------------

def test_plan_copy_is_plan_link_copy(kimi_dir, tmp_path):
    copied = json.loads(run("plan", "sm120-fp16-kv", kimi_dir, "--copy", "--json").stdout)
    linked = json.loads(run("plan", "sm120-fp16-kv", kimi_dir, "--link", "copy",
                            "--json").stdout)
    assert copied == linked and copied["link"]["mode"] == "copy"
    both = run("plan", "sm120-fp16-kv", kimi_dir, "--copy", "--link", "hardlink")
    assert both.exit_code == 2 and "--copy is --link copy" in both.stderr


def test_a_hub_name_without_hf_scheme_gets_a_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("inspect", "nvidia/Kimi-K2.5-NVFP4")
    assert result.exit_code == 2
    assert result.stderr == ("modelpatch: error: nvidia/Kimi-K2.5-NVFP4: no such directory "
                             "(did you mean hf://nvidia/Kimi-K2.5-NVFP4?)\n")
    os.mkdir("nvidia")          # a local folder of that name: a path after all, no hint
    assert "did you mean" not in run("inspect", "nvidia/Kimi-K2.5-NVFP4").stderr
    assert "did you mean" not in run("inspect", "./missing").stderr
