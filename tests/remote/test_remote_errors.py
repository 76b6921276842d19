"""Hub errors of ``hf://`` models and ``from: hf://`` sources: a missing
revision is named (exit 2), ``doctor``'s errors say doctor."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hub_fixtures import TOKENS, configure_hf_client, running_hub
from remote_fixtures import store_model

from patcher.cli import main

REPO = "alice/llama"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = tmp_path_factory.mktemp("remote-errors")
    model = base / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "chat_template.jinja").write_text("{{ messages }}")
    store_model(base / "hub", REPO, model)
    with pytest.MonkeyPatch.context() as mp:
        configure_hf_client(mp, base / "hf-home")
        with running_hub(base / "hub", TOKENS) as hub:
            mp.setenv("HF_ENDPOINT", hub.endpoint)
            yield hub, model


def _run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("command", ["doctor", "inspect"])
def test_missing_revision_is_named_and_exit_2(served, command):
    out = _run(command, f"hf://{REPO}@nobranch")
    assert out.exit_code == 2, out.output
    assert f"{command}: revision 'nobranch' not found in {REPO}" in out.output
    assert "HTTP 404" not in out.output


def test_doctor_hub_errors_say_doctor(served):
    out = _run("doctor", "hf://alice/nothere")
    assert out.exit_code == 3, out.output
    assert "doctor: repository not found" in out.output and "inspect" not in out.output


RECIPE = """\
modelpatch: 1
name: tmpl
description: a chat template from the hub
files:
  - add: chat_template.jinja
    from: "{source}"
    overwrite: true
"""


def test_from_source_at_a_missing_revision_is_named_exit_2(served, tmp_path):
    _, model = served
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(source=f"hf://{REPO}@nobranch/chat_template.jinja"))
    out = _run("plan", str(recipe), str(model))
    assert out.exit_code == 2, out.output
    assert f"fetch: revision 'nobranch' not found in {REPO}" in out.output, out.output
    assert "HTTP 404" not in out.output
