"""Recipe language v2: params, {reference} templates and expressions, include, several recipes
as one, layer selectors, tensor copy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from tensor_helpers import read_tensors, write_model

from patcher import api
from patcher.cli import main
from patcher.errors import InputError, PlanError, RecipeError, TemplateError
from patcher.recipe.load import load_recipe
from patcher.recipe.params.expr import parse_template

HEAD = "modelpatch: 1\nname: t\ndescription: d\n"


def _model(root: Path, config: dict, tensors: dict | None = None) -> Path:
    import torch

    write_model(root, {"model.safetensors": tensors or {"w": torch.ones(2)}}, config=config)
    return root


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _config(directory) -> dict:
    return json.loads((Path(directory) / "config.json").read_text())


# ------------------------------------------------------------------------- expressions

@pytest.mark.parametrize("text, values, expected", [
    ("{f}", {"f": 4.0}, 4.0),
    ("{f}", {"f": [1, 2]}, [1, 2]),
    ("{f} * {config.n}", {"f": 4, "config.n": 32768}, 131072),
    ("{f} * {config.n} // 1", {"f": 1.5, "config.n": 100}, 150),
    ("({a} + 1) * 2 - {b} / 4", {"a": 1, "b": 2}, 3.5),
    ("-{a} // 2", {"a": 3}, -2),
    ("model-{name}", {"name": "x"}, "model-x"),
])
def test_templates_evaluate_typed(text, values, expected):
    result = parse_template(text).evaluate(values.__getitem__)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize("text", ["{{ messages }}", "{% if x %}", "no refs", "{1abc}"])
def test_plain_strings_and_jinja_are_not_templates(text):
    assert parse_template(text) is None


@pytest.mark.parametrize("text, message", [
    ("{a} ** 2", "only + - * / //"),
    ("{a} % 2", "only + - * / //"),
])
def test_only_arithmetic_is_allowed(text, message):
    with pytest.raises(TemplateError, match=re.escape(message)):
        parse_template(text)


def test_expression_operands_must_be_numbers_and_never_divide_by_zero():
    with pytest.raises(TemplateError, match="is a string, not a number"):
        parse_template("{a} * 2").evaluate(lambda r: "x")
    with pytest.raises(TemplateError, match="division by zero"):
        parse_template("{a} / 0").evaluate(lambda r: 1)


# ------------------------------------------------------------------------------- params

PARAM_RECIPE = HEAD + """params:
  factor: {type: number, default: 2, description: scale}
  name: {type: string, description: required}
config:
  config.json:
    - set: /scaled
      value: {factor: "{factor}", length: "{factor} * {config.n} // 1", tag: "v-{name}"}
"""


def test_params_are_typed_and_derive_from_the_config(tmp_path):
    model = _model(tmp_path / "m", {"n": 100})
    recipe = _write(tmp_path / "r.yaml", PARAM_RECIPE)
    out = api.apply(str(recipe), model, out=tmp_path / "v", params={"factor": "1.5",
                                                                     "name": "a"}).output
    assert _config(out)["scaled"] == {"factor": 1.5, "length": 150, "tag": "v-a"}
    record = json.loads((out / "modelpatch.provenance.json").read_text())
    recipe_entry = record["predicate"]["buildDefinition"]["externalParameters"]["recipe"]
    assert recipe_entry["params"] == {"factor": 1.5, "name": "a"}


def test_a_required_param_and_a_badly_typed_value_are_refused(tmp_path):
    model = _model(tmp_path / "m", {"n": 100})
    recipe = _write(tmp_path / "r.yaml", PARAM_RECIPE)
    with pytest.raises(InputError, match="needs parameter 'name'"):
        api.plan(str(recipe), model)
    with pytest.raises(InputError, match="not a number"):
        api.plan(str(recipe), model, options={"params": {"factor": "big", "name": "a"}})
    with pytest.raises(InputError, match="has no parameter 'fator'"):
        api.plan(str(recipe), model, options={"params": {"fator": "1", "name": "a"}})


def test_a_missing_config_value_names_the_recipe_line(tmp_path):
    model = _model(tmp_path / "m", {"other": 1})
    recipe = _write(tmp_path / "r.yaml", PARAM_RECIPE)
    with pytest.raises(PlanError) as info:
        api.plan(str(recipe), model, options={"params": {"name": "a"}})
    assert "config.json has no n" in str(info.value) and info.value.where.endswith("r.yaml:9:7")


@pytest.mark.parametrize("body, message", [
    ("config:\n  config.json:\n    - set: /x\n      value: '{nope}'\n",
     "{nope} is neither a parameter"),
    ("params:\n  f: {type: float, description: x}\n", "'float'"),
    ("params:\n  f: {type: integer, default: 1.5, description: x}\n", "1.5 is not an integer"),
    ("params:\n  config: {type: integer, description: x}\n", "not a config file name"),
    ("tensors:\n  - select: {layers: 'above 3'}\n    drop: true\n", "layers: must be"),
])
def test_recipe_errors_name_the_line(body, message):
    with pytest.raises(RecipeError) as info:
        load_recipe(HEAD + body)
    assert message in str(info.value)
    assert info.value.where.startswith("<recipe>:")


def test_cli_set_and_recipes_show_lists_params(tmp_path):
    model = _model(tmp_path / "m", {"n": 100})
    recipe = _write(tmp_path / "r.yaml", PARAM_RECIPE)
    runner = CliRunner()
    result = runner.invoke(main, ["apply", str(recipe), str(model), "-o", str(tmp_path / "v"),
                                  "--set", "factor=3", "--set", "name=b"])
    assert result.exit_code == 0, result.output
    assert _config(tmp_path / "v")["scaled"]["length"] == 300
    bad = runner.invoke(main, ["plan", str(recipe), str(model), "--set", "factor"])
    assert bad.exit_code == 2 and "NAME=VALUE" in bad.output
    shown = runner.invoke(main, ["recipes", "show", "yarn"])
    assert shown.exit_code == 0 and "params:" in shown.output
    listed = runner.invoke(main, ["recipes", "list"])
    assert "yarn" in listed.output and "--set factor=4.0" in listed.output


# -------------------------------------------------------------------------- composition

def test_include_with_params_relative_path(tmp_path):
    (tmp_path / "lib").mkdir()
    _write(tmp_path / "lib" / "inner.yaml", PARAM_RECIPE.replace("name: t", "name: inner"))
    outer = _write(tmp_path / "lib" / "outer.yaml", HEAD.replace("name: t", "name: outer") + """\
params:
  k: {type: integer, default: 5, description: passed on}
include:
  - {recipe: inner.yaml, params: {factor: "{k}", name: z}}
config:
  config.json:
    - set: /outer
      value: true
""")
    model = _model(tmp_path / "m", {"n": 10})
    out = api.apply(str(outer), model, out=tmp_path / "v").output
    cfg = _config(out)
    assert cfg["scaled"] == {"factor": 5, "length": 50, "tag": "v-z"} and cfg["outer"] is True
    entry = json.loads((out / "modelpatch.provenance.json").read_text())[
        "predicate"]["buildDefinition"]["externalParameters"]["recipe"]
    assert [c["name"] for c in entry["components"]] == ["inner", "outer"]
    assert entry["components"][0]["params"] == {"factor": 5, "name": "z"}


def test_an_include_cycle_is_refused(tmp_path):
    _write(tmp_path / "a.yaml", HEAD + "include: [./b.yaml]\n")
    _write(tmp_path / "b.yaml", HEAD + "include: [./a.yaml]\n")
    with pytest.raises(RecipeError, match="includes itself"):
        load_recipe(tmp_path / "a.yaml")


def test_several_recipes_are_one_plan_and_one_variant(tmp_path):
    model = _model(tmp_path / "m", {"n": 10, "a": 1})
    r1 = _write(tmp_path / "r1.yaml", HEAD.replace("name: t", "name: one")
                + "config:\n  config.json:\n    - set: /x\n      value: 1\n")
    r2 = _write(tmp_path / "r2.yaml", HEAD.replace("name: t", "name: two")
                + "config:\n  config.json:\n    - drop: /a\n")
    result = CliRunner().invoke(main, ["apply", str(r1), str(r2), str(model)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "m-one+two"
    assert _config(out) == {"n": 10, "x": 1}
    entry = json.loads((out / "modelpatch.provenance.json").read_text())[
        "predicate"]["buildDefinition"]["externalParameters"]["recipe"]
    assert entry["name"] == "one+two"
    assert [c["name"] for c in entry["components"]] == ["one", "two"]
    assert all(c["text"] and len(c["sha256"]) == 64 for c in entry["components"])
    shown = CliRunner().invoke(main, ["plan", str(r1), str(r2), str(model), "--allow-noop"])
    sources = [line for line in shown.output.splitlines() if line.startswith("recipe file")]
    assert [line.split()[2] for line in sources] == [str(r1.resolve()), str(r2.resolve())]


def test_conflicting_recipes_are_refused_naming_both_lines(tmp_path):
    model = _model(tmp_path / "m", {"a": {"b": 1}})
    r1 = _write(tmp_path / "r1.yaml", HEAD.replace("name: t", "name: one")
                + "config:\n  config.json:\n    - set: /a/b\n      value: 2\n")
    r2 = _write(tmp_path / "r2.yaml", HEAD.replace("name: t", "name: two")
                + "config:\n  config.json:\n    - drop: /a\n")
    result = CliRunner().invoke(main, ["plan", str(r1), str(r2), str(model)])
    assert result.exit_code == 2
    assert "r2.yaml:6:7" in result.output and "r1.yaml:6:7" in result.output
    assert "conflict" in result.output
    same = _write(tmp_path / "r3.yaml", HEAD.replace("name: t", "name: three")
                  + "config:\n  config.json:\n    - set: /a/b\n      value: 2\n")
    agreed = CliRunner().invoke(main, ["plan", str(r1), str(same), str(model)])
    assert agreed.exit_code == 0, agreed.output


# ------------------------------------------------------------------ layers and tensor copy

def test_layer_selector_tied_to_the_config_and_copy(tmp_path):
    import torch

    tensors = {f"model.layers.{i}.w": torch.full((2,), float(i)) for i in range(4)}
    tensors["model.embed_tokens.weight"] = torch.arange(6.0).reshape(3, 2)
    model = _model(tmp_path / "m", {"num_hidden_layers": 2}, tensors)
    recipe = _write(tmp_path / "r.yaml", HEAD + """tensors:
  - select: {layers: ">= {config.num_hidden_layers}"}
    drop: true
  - select: {glob: model.embed_tokens.weight}
    copy: {pattern: '^model\\.embed_tokens', to: lm_head}
""")
    out = api.apply(str(recipe), model, out=tmp_path / "v").output
    got = read_tensors(out)
    assert sorted(got) == ["lm_head.weight", "model.embed_tokens.weight",
                           "model.layers.0.w", "model.layers.1.w"]
    assert torch.equal(got["lm_head.weight"], tensors["model.embed_tokens.weight"])


# ---------------------------------------------------------------------------- files: from

def test_files_add_from_a_file_next_to_the_recipe_is_pinned(tmp_path):
    model = _model(tmp_path / "m", {"n": 1})
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "chat_template.jinja").write_text("{{ messages }}{% if x %}y{% endif %}")
    recipe = _write(tmp_path / "r" / "r.yaml", HEAD + "files:\n  - add: chat_template.jinja\n"
                    "    from: chat_template.jinja\n")
    out = api.apply(str(recipe), model, out=tmp_path / "v").output
    assert (out / "chat_template.jinja").read_text() == "{{ messages }}{% if x %}y{% endif %}"
    from patcher.integrity.manifest import read_manifest

    changes = read_manifest(out).changes
    added = [c for c in changes if c["kind"] == "file_added"][0]
    import hashlib

    assert added["from"] == "chat_template.jinja"
    assert added["sha256"] == hashlib.sha256(
        (tmp_path / "r" / "chat_template.jinja").read_bytes()).hexdigest()


@pytest.mark.parametrize("source, message", [
    ("../secret.txt", "outside the recipe's directory"),
    ("/etc/hostname", "outside the recipe's directory"),
    ("missing.txt", "no such file"),
    ("link.txt", "outside the recipe's directory"),
])
def test_files_add_from_stays_beside_the_recipe(tmp_path, source, message):
    (tmp_path / "secret.txt").write_text("key")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "link.txt").symlink_to(tmp_path / "secret.txt")
    recipe = _write(tmp_path / "r" / "r.yaml",
                    HEAD + f"files:\n  - add: x.txt\n    from: {source}\n")
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_recipe(recipe)


# ------------------------------------------------------------------------ array elements

ARRAY_RECIPE = HEAD + r"""config:
  config.json:
    - each: /quantization_config/ignore
      match: {regex: '^language_model\.model\.layers\.(\d+)\.'}
      replace: 'model.layers.\1.'
      in_step: true
    - each: /quantization_config/ignore
      match: {glob: 'vision_tower*'}
      remove: true
      in_step: true
    - append: /quantization_config/ignore
      value: lm_head
      in_step: true
"""


def test_array_element_ops_keep_ignore_and_exclude_modules_in_step(tmp_path):
    entries = ["language_model.model.layers.0.mlp.gate", "vision_tower.blocks.0",
               "language_model.model.layers.12.self_attn", "lm_head"]
    model = _model(tmp_path / "m", {"quantization_config": {"ignore": list(entries)}})
    (model / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"exclude_modules": entries[:3]}}))
    recipe = _write(tmp_path / "r.yaml", ARRAY_RECIPE)
    out = api.apply(str(recipe), model, out=tmp_path / "v").output
    want = ["model.layers.0.mlp.gate", "model.layers.12.self_attn", "lm_head"]
    assert _config(out)["quantization_config"]["ignore"] == want
    assert json.loads((out / "hf_quant_config.json").read_text())[
        "quantization"]["exclude_modules"] == want
    # without hf_quant_config.json the in-step counterpart is skipped
    (model / "hf_quant_config.json").unlink()
    alone = api.apply(str(recipe), model, out=tmp_path / "w").output
    assert _config(alone)["quantization_config"]["ignore"] == want


def test_array_ops_that_match_nothing_or_hit_a_non_array_name_the_line(tmp_path):
    model = _model(tmp_path / "m", {"quantization_config": {"ignore": ["a"]}, "x": 1})
    recipe = _write(tmp_path / "r.yaml", HEAD + "config:\n  config.json:\n"
                    "    - each: /quantization_config/ignore\n      match: {glob: 'b*'}\n"
                    "      remove: true\n")
    with pytest.raises(PlanError, match="no element of /quantization_config/ignore matches"):
        api.plan(str(recipe), model)
    bad = _write(tmp_path / "b.yaml", HEAD + "config:\n  config.json:\n"
                 "    - append: /x\n      value: 2\n")
    with pytest.raises(PlanError) as info:
        api.plan(str(bad), model)
    assert "/x is not an array" in str(info.value) and info.value.where.endswith("b.yaml:6:7")
    with pytest.raises(RecipeError, match="replace needs match: {regex"):
        load_recipe(HEAD + "config:\n  config.json:\n    - each: /a\n"
                    "      match: {glob: x}\n      replace: y\n")


def test_group_selector_uses_inspects_module_groups_and_keeps_dtype(tmp_path):
    import torch

    tensors = {"model.layers.0.self_attn.q_proj.weight": torch.ones(2),
               "model.layers.0.self_attn.k_scale": torch.ones(1, dtype=torch.float32),
               "model.layers.0.mlp.up_proj.weight": torch.ones(2),
               "model.layers.1.self_attn.q_proj.weight": torch.ones(2, dtype=torch.bfloat16)}
    model = _model(tmp_path / "m", {"num_hidden_layers": 1}, tensors)
    recipe = _write(tmp_path / "r.yaml", HEAD + """tensors:
  - select: {group: attention, dtype: F32, layers: '< 1'}
    drop: true
""")
    out = api.apply(str(recipe), model, out=tmp_path / "v").output
    assert sorted(read_tensors(out)) == ["model.layers.0.mlp.up_proj.weight",
                                         "model.layers.1.self_attn.q_proj.weight"]
    with pytest.raises(RecipeError, match="unknown module group 'visual'"):
        load_recipe(HEAD + "tensors:\n  - select: {group: visual}\n    drop: true\n")


def test_tensor_ops_of_two_recipes_on_one_tensor_are_refused_naming_both(tmp_path):
    import torch

    model = _model(tmp_path / "m", {"n": 1},
                   {"a.weight": torch.ones(2), "b.weight": torch.ones(2)})
    r1 = _write(tmp_path / "r1.yaml", HEAD.replace("name: t", "name: one") + """tensors:
  - select: {glob: a.weight}
    rename: {pattern: '^a', to: c}
""")
    r2 = _write(tmp_path / "r2.yaml", HEAD.replace("name: t", "name: two") + """tensors:
  - select: {glob: '*.weight'}
    cast: bf16
""")
    result = CliRunner().invoke(main, ["plan", str(r1), str(r2), str(model)])
    assert result.exit_code == 2
    assert "r2.yaml:5:5" in result.output and "r1.yaml:5:5" in result.output
    assert "two recipes change the same tensor" in result.output
    one = _write(tmp_path / "r3.yaml", HEAD + """tensors:
  - select: {glob: a.weight}
    rename: {pattern: '^a', to: c}
  - select: {glob: '*.weight'}
    cast: bf16
""")
    assert CliRunner().invoke(main, ["plan", str(one), str(model)]).exit_code == 0
