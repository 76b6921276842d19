"""Recipe pins, parameters, ``from:`` sources and built-ins as a user meets them: one-line errors
blamed on the right line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.changes import changes_json
from patcher.cli import main
from patcher.errors import GuardRefused, InputError, PlanError, RecipeError
from patcher.recipe.load import load_recipe

HEAD = "modelpatch: 1\nname: t\ndescription: d\n"
ZEROS = "0" * 64


def _run(args: list[str]):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _model(path: Path, **tokenizer_config) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 2}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    vocabulary = {"added_tokens_decoder": {"1": {"content": "x", "special": True},
                                           "128009": {"content": "<|eot_id|>", "special": True}}}
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", **vocabulary,
                                                            **tokenizer_config}))
    return path


# --------------------------------------------------------------- sha256 pins

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


# ------------------------------------------------------- fix-eos values

@pytest.mark.parametrize("ids, token", [
    ("abc", "x"), ('[3, "x", 2.5]', "x"), ("3,true", "x"), ("", "x"), ("[]", "x"),
    ("3,2", ""),
])
def test_fix_eos_refuses_values_that_cannot_be_stop_tokens(tmp_path, ids, token):
    model = _model(tmp_path / "m")
    result = _run(["plan", "fix-eos", model, "--set", f"eos_token_id={ids}",
                   "--set", f"eos_token={token}"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("modelpatch: error: --set eos_token"), result.output
    assert "Traceback" not in result.output


def test_fix_eos_takes_integer_ids(tmp_path):
    model = _model(tmp_path / "m")
    plan = api.plan("fix-eos", model, options={"params": {"eos_token_id": "[128001, 128009]",
                                                          "eos_token": "<|eot_id|>"}})
    after = {(c["file"], c["path"]): c["after"] for c in changes_json(plan.changes)
             if "after" in c}
    assert after[("config.json", "/eos_token_id")] == [128001, 128009]
    assert after[("tokenizer_config.json", "/eos_token")] == "<|eot_id|>"
    with pytest.raises(InputError, match="not a non-empty list of integers"):
        api.plan("fix-eos", model, options={"params": {"eos_token_id": [1, "2"],
                                                       "eos_token": "x"}})


# ---------------------------------------------------- --set scoping and repeats

def _param_recipe(path: Path, name: str, kind: str) -> Path:
    path.write_text(f"modelpatch: 1\nname: {name}\ndescription: d\nparams:\n"
                    f"  x: {{type: {kind}, description: the {name} x}}\n"
                    f"config:\n  config.json:\n    - {{set: /{name}, value: '{{x}}'}}\n")
    return path


def test_a_scoped_value_takes_its_recipe_out_of_the_plain_names_ambiguity(tmp_path):
    model = _model(tmp_path / "m")
    a = _param_recipe(tmp_path / "a.yaml", "a", "integer")
    b = _param_recipe(tmp_path / "b.yaml", "b", "string")
    c = _param_recipe(tmp_path / "c.yaml", "c", "string")
    plan = api.plan([str(a), str(b), str(c)], model,
                    options={"params": {"x": "hello", "a.x": "2"}})
    after = {c["path"]: c["after"] for c in changes_json(plan.changes) if "after" in c}
    assert after == {"/a": 2, "/b": "hello", "/c": "hello"}
    with pytest.raises(InputError, match="ambiguous: a declares it as integer"):
        api.plan([str(a), str(b), str(c)], model, options={"params": {"x": "3", "c.x": "3"}})


def test_the_same_set_name_given_twice_is_refused(tmp_path):
    model = _model(tmp_path / "m")
    result = _run(["plan", "fix-eos", model, "--set", "eos_token_id=1", "--set", "eos_token=x",
                   "--set", "eos_token_id=2"])
    assert result.exit_code == 2
    assert "--set eos_token_id given twice ('1' and '2')" in result.output
    result = _run(["plan", "fix-eos", model, "--set", "eos_token_id=1", "--set", "eos_token=x",
                   "--set", "eos_token_id=1"])
    assert result.exit_code == 0, result.output


# -------------------------------------- recipes given together, each in turn

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "modelopt"


def test_recipes_given_together_see_the_configs_the_earlier_ones_leave(tmp_path):
    import shutil

    base = tmp_path / "base"
    shutil.copytree(FIXTURES / "llama-nvfp4", base)
    together = api.apply(["sm120-fp16-kv", "drop-kv-scales"], base, out=tmp_path / "one").output
    first = api.apply("sm120-fp16-kv", base, out=tmp_path / "a").output
    second = api.apply("drop-kv-scales", first, out=tmp_path / "b").output
    for name in ("config.json", "hf_quant_config.json", "model.safetensors"):
        assert (together / name).read_bytes() == (second / name).read_bytes(), name
    with pytest.raises(GuardRefused, match="drop-kv-scales.*refuses this model"):
        api.plan(["drop-kv-scales", "sm120-fp16-kv"], base)


def test_a_later_recipes_references_read_the_earlier_recipes_values(tmp_path):
    model = _model(tmp_path / "m")
    one = tmp_path / "one.yaml"
    one.write_text("modelpatch: 1\nname: one\ndescription: d\nconfig:\n  config.json:\n"
                   "    - {set: /max_position_embeddings, value: 100}\n")
    two = tmp_path / "two.yaml"
    two.write_text("modelpatch: 1\nname: two\ndescription: d\nrequires:\n"
                   "  - {file: config.json, path: /max_position_embeddings, exists: true}\n"
                   "config:\n  generation_config.json:\n"
                   "    - {set: /n, value: '{config.max_position_embeddings} * 2'}\n")
    plan = api.plan([str(one), str(two)], model)
    after = {(c["file"], c["path"]): c["after"] for c in changes_json(plan.changes)
             if "after" in c}
    assert after[("generation_config.json", "/n")] == 200
    with pytest.raises(GuardRefused, match="two"):
        api.plan([str(two), str(one)], model)


# ------------------------------------- built-ins refuse models they don't fit

BUILTIN_PARAMS = {"fix-eos": ["eos_token_id=2", "eos_token=</s>"],
                  "no-remote-code": ["model_type=llama", "architectures=LlamaForCausalLM"],
                  "text-only": ["architectures=LlamaForCausalLM"],
                  "chat-template": ["template=file:{t}"],
                  "gguf-chat-template": ["template=file:{t}"]}


def _safetensors_model(path: Path, *, tied: bool) -> Path:
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
        "tie_word_embeddings": tied, "eos_token_id": 2, "torch_dtype": "bfloat16"}))
    tensors = {"model.embed_tokens.weight": torch.ones(8, 4, dtype=torch.bfloat16),
               "model.layers.0.mlp.up_proj.weight": torch.ones(4, 4, dtype=torch.bfloat16)}
    if not tied:
        tensors["lm_head.weight"] = torch.ones(8, 4, dtype=torch.bfloat16)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def unfit_models(tmp_path_factory) -> dict[str, Path]:
    from gguf_fixtures import write_tiny

    root = tmp_path_factory.mktemp("unfit")
    (root / "g").mkdir()
    write_tiny(root / "g" / "tiny.gguf")
    (root / "t.jinja").write_text("{{ messages }}")
    return {"untied": _safetensors_model(root / "untied", tied=False),
            "tied": _safetensors_model(root / "tied", tied=True), "gguf": root / "g",
            "root": root}


@pytest.mark.parametrize("recipe", sorted(p.stem for p in (
    Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml")))
def test_a_builtin_refuses_a_model_it_does_not_fit_instead_of_blaming_its_own_line(
        unfit_models, recipe):
    """Exit 0 (it fits), or exit 1 'refuses this model'; never an error (exit 2) at a line of
    the built-in, which the user cannot fix."""
    sets = [s.format(t=unfit_models["root"] / "t.jinja") for s in BUILTIN_PARAMS.get(recipe, [])]
    for model in ("untied", "tied", "gguf"):
        args = ["plan", recipe, unfit_models[model]] + [a for s in sets for a in ("--set", s)]
        result = _run(args)
        assert result.exit_code in (0, 1), (model, result.output)
        if result.exit_code == 1:
            assert "refuses this model" in result.output or "changes nothing" in result.output, \
                (model, result.output)


# ------------------------------- a bad --set value is blamed on the --set

@pytest.mark.parametrize("sets, blamed", [
    (["template=file:{t}/nope.jinja"], "--set template=file:{t}/nope.jinja: "),
    (["template=hf://bad"], "--set template=hf://bad: "),
    (["template=model:{t}/nowhere/x.jinja"], "--set template=model:{t}/nowhere/x.jinja: "),
    (["template=file:{t}/t.jinja", "sha256=abc"], "--set sha256=abc: "),
    (["template=file:{t}/t.jinja", f"sha256={ZEROS}"], f"--set sha256={ZEROS}: "),
])
def test_a_bad_set_value_is_blamed_on_the_set_not_the_builtins_line(tmp_path, sets, blamed):
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    model = _model(tmp_path / "m")
    args = ["plan", "chat-template", model]
    for s in sets:
        args += ["--set", s.format(t=tmp_path)]
    result = _run(args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("modelpatch: error: " + blamed.format(t=tmp_path)), \
        result.output
    assert "chat-template.yaml" not in result.output


def test_errors_name_a_builtin_by_the_same_file_plan_shows(unfit_models):
    from patcher.recipe.load import resolve_recipe

    shown = str(resolve_recipe("drop-kv-scales").resolve())
    refused = _run(["plan", "drop-kv-scales", unfit_models["untied"]])
    assert refused.exit_code == 1 and f"{shown}:" in refused.output, refused.output
    planned = _run(["plan", "untie-embeddings", unfit_models["tied"]])
    assert f"recipe file {resolve_recipe('untie-embeddings').resolve()} " in planned.output


# ------------------------------ the gguf: section's from: takes every source

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def _gguf_recipe(path: Path, metadata: str, params: str = "") -> Path:
    path.write_text(f"{HEAD}{params}gguf:\n  metadata:\n{metadata}")
    return path


def test_gguf_from_expands_a_parameter_and_pins_it(tmp_path):
    from gguf_fixtures import read_back, tiny_dir

    root = tiny_dir(tmp_path)
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    (tmp_path / "rec").mkdir()
    recipe = _gguf_recipe(tmp_path / "rec" / "r.yaml", "    - {set: tokenizer.chat_template, "
                          "from: '{template}', sha256: '{pin}'}\n",
                          "params:\n  template: {type: string, description: d}\n"
                          "  pin: {type: string, default: '', description: d}\n")
    params = {"template": f"file:{tmp_path / 't.jinja'}"}
    out = api.apply(str(recipe), root, out=tmp_path / "v", params=params).output
    assert read_back(out / "tiny.gguf")[0]["tokenizer.chat_template"] == TEMPLATE
    from patcher.integrity.manifest import read_manifest

    (entry,) = [c for c in read_manifest(out).changes if c["kind"] == "content_source"]
    assert entry["target"] == "GGUF tokenizer.chat_template"
    with pytest.raises(PlanError, match=r"--set pin=0{64}: .*not the pinned"):
        api.plan(str(recipe), root, options={"params": {**params, "pin": ZEROS}})
    with pytest.raises(RecipeError, match="must come from you"):
        load_recipe(_gguf_recipe(tmp_path / "rec" / "bad.yaml",
                                 f"    - {{set: tokenizer.chat_template, from: "
                                 f"'file:{tmp_path}/t.jinja'}}\n"))


def test_gguf_chat_template_takes_a_template_from_the_hub(tmp_path, monkeypatch):
    from gguf_fixtures import read_back, tiny_dir
    from hub_fixtures import TOKENS, configure_hf_client, running_hub
    from remote_fixtures import store_model

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "chat_template.jinja").write_text(TEMPLATE)
    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    store_model(tmp_path / "hub", "alice/base", base)
    root = tiny_dir(tmp_path)
    with running_hub(tmp_path / "hub", TOKENS) as hub:
        result = _run(["apply", "gguf-chat-template", root, "-o", tmp_path / "v",
                       "--endpoint", hub.endpoint,
                       "--set", "template=hf://alice/base/chat_template.jinja"])
    assert result.exit_code == 0, result.output
    assert read_back(tmp_path / "v" / "tiny.gguf")[0]["tokenizer.chat_template"] == TEMPLATE


# ----------------------------------------------------------- recipe messages

def _errors(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("modelpatch: error")]


def test_a_mistyped_action_is_one_error_not_a_cascade(tmp_path):
    model = _model(tmp_path / "m")
    typo = tmp_path / "typo.yaml"
    typo.write_text(HEAD + "config:\n  config.json:\n    - sett: /x\n      value: 1\n")
    errors = _errors(_run(["--debug", "plan", typo, model]))
    assert errors == [f"modelpatch: error: {typo}:6:7: unknown key 'sett' in config operation "
                      "(did you mean 'set'?)"]
    nodesc = tmp_path / "nodesc.yaml"
    nodesc.write_text(HEAD + "params:\n  x: {type: integer}\n"
                      "config:\n  config.json:\n    - {set: /x, value: '{x}'}\n")
    errors = _errors(_run(["--debug", "plan", nodesc, model]))
    assert errors == [f"modelpatch: error: {nodesc}:5:6: parameter 'x' needs 'description'"]


def test_a_recipe_given_twice_and_a_mistyped_parameter(tmp_path):
    model = _model(tmp_path / "m")
    result = _run(["plan", "yarn", "yarn", model])
    assert result.exit_code == 2 and "recipe 'yarn' given twice" in result.output
    result = _run(["plan", "fix-eos", model, "--set", "eos_token_idd=1"])
    assert result.exit_code == 2 and "did you mean 'eos_token_id'?" in result.output


def test_a_gguf_guard_names_its_line_first(tmp_path):
    from gguf_fixtures import tiny_dir

    recipe = tmp_path / "g.yaml"
    recipe.write_text(HEAD + "gguf:\n  requires:\n    - {key: general.architecture, "
                      "one_of: [qwen2]}\n  metadata:\n    - {drop: general.url}\n")
    result = _run(["plan", recipe, tiny_dir(tmp_path)])
    assert result.exit_code == 1
    assert f"refuses this model: {recipe}:6:7: general.architecture is" in result.output
