"""Rule files are data, like recipes: ``fix.recipe`` names a built-in (a recipe file only with
``doctor --allow-recipe-files``, and then only below the rule's directory), and ``fix.params``
never name a local path (``model:``, ``file:``), which only the user's own ``--set`` may give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher.cli import main
from patcher.doctor.fix import fixing_params
from patcher.doctor.report import DoctorReport, Finding, Fix
from patcher.doctor.rules import load_rules
from patcher.doctor.target import Target
from patcher.errors import InputError, RecipeError
from patcher.model.safetensors_io import OutputTensor, encode_header

RULE = ("doctor: 1\nid: mine\nseverity: blocker\nsummary: s\n"
        "evidence: [{source: x, versions: any}]\nfix: FIX\n"
        "when: {file: config.json, path: /x, exists: true}\n")


def _rules(tmp_path: Path, fix: str) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "r.yaml").write_text(RULE.replace("FIX", fix))
    return rules


def _model(path: Path) -> Path:
    path.mkdir()
    header, layout = encode_header([OutputTensor("w", "F32", (2,))], {"format": "pt"})
    (path / "model.safetensors").write_bytes(header + bytes(sum(t.nbytes for t in layout)))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "x": 1}))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return path


@pytest.mark.parametrize("fix", ["{recipe: ./fixes/evil.yaml}", "{recipe: fixes/evil.yaml}",
                                 "{recipe: no-such-builtin}"])
def test_fix_recipe_names_a_built_in_only(tmp_path, fix):
    rules = _rules(tmp_path, fix)
    (rules / "fixes").mkdir()
    (rules / "fixes" / "evil.yaml").write_text("modelpatch: 1\nname: evil\ndescription: d\n")
    with pytest.raises(RecipeError) as info:
        load_rules((str(rules),))
    assert "not a built-in recipe" in str(info.value) and "--allow-recipe-files" in str(
        info.value) and "r.yaml:6:" in str(info.value)


def test_allow_recipe_files_takes_a_recipe_below_the_rule_directory(tmp_path):
    rules = _rules(tmp_path, "{recipe: ./fixes/mine.yaml}")
    (rules / "fixes").mkdir()
    (rules / "fixes" / "mine.yaml").write_text("modelpatch: 1\nname: mine\ndescription: d\n")
    rule = load_rules((str(rules),), allow_recipe_files=True)[-1]
    assert rule.fix["recipe"] == str(rules / "fixes" / "mine.yaml")
    for bad, reason in (("../evil.yaml", "'..'"), ("/etc/evil.yaml", "absolute"),
                        (".git/evil.yaml", "dot-directory")):
        _rules(tmp_path, "{recipe: '%s'}" % bad)
        with pytest.raises(RecipeError, match=reason):
            load_rules((str(rules),), allow_recipe_files=True)


@pytest.mark.parametrize("fix, reason", [
    ("{recipe: linked/evil.yaml}", "leads outside the directory"),
    ("{recipe: fixes/missing.yaml}", "no recipe file"),
], ids=["symlink-out", "missing"])
def test_allowed_recipe_files_stay_below_the_rule_directory(tmp_path, fix, reason):
    """--allow-recipe-files: a fix.recipe reached through a symlink out of the rule's directory,
    or no file at all, is refused when the rule is loaded, in one line naming the rule."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "evil.yaml").write_text("modelpatch: 1\nname: e\ndescription: d\n")
    rules = _rules(tmp_path, fix)
    (rules / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RecipeError) as info:
        load_rules((str(rules),), allow_recipe_files=True)
    assert reason in str(info.value) and "r.yaml:6:" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("params", ['{template: "file:/etc/hostname"}',
                                    '{template: "model:/models/base/chat_template.jinja"}',
                                    '{a: [1, {b: "file:x"}]}'])
def test_fix_params_from_a_rule_never_name_a_local_path(tmp_path, params):
    rules = _rules(tmp_path, "{recipe: chat-template, params: %s}" % params)
    with pytest.raises(RecipeError) as info:
        load_rules((str(rules),))
    line = str(info.value)
    assert "names a local path" in line and "r.yaml:6:" in line and "\n" not in line


def test_params_a_model_gives_through_params_from_never_name_a_local_path():
    """``params_from`` reads the model's own facts: data too, refused before anything runs."""
    finding = Finding("r", "warning", "s", None, None, (), Fix(
        "chat-template", {"template": "file:/home/me/.ssh/id_rsa"}), "rules/r.yaml")
    report = DoctorReport("m", Target(), (finding,))
    with pytest.raises(InputError, match="rule r: fix.params value .* names a local path"):
        fixing_params(report)


def test_doctor_fix_does_not_copy_a_local_file_a_rule_names(tmp_path):
    """End to end: a --rules file cannot make ``doctor --fix`` copy a local file into the
    variant; the built-in rules' fixes still apply."""
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    model = _model(tmp_path / "m")
    rules = _rules(tmp_path, '{recipe: chat-template, params: {template: "file:%s"}}' % secret)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["doctor", str(model), "--rules", str(rules), "--fix",
                                       "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "names a local path" in result.output and "Traceback" not in result.output
    assert not out.exists()
