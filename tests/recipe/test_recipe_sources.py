"""Content from another model (``from: hf://...``, ``model:``, ``file:``), pinned by sha256; the
``chat-template`` recipe; ``--set RECIPE.NAME`` scoping."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_fixtures import TOKENS, configure_hf_client, running_hub
from remote_fixtures import store_model

from patcher import api
from patcher.changes import changes_json
from patcher.cli import main
from patcher.errors import InputError, PlanError, RecipeError
from patcher.integrity.manifest import read_manifest
from patcher.recipe.load import load_recipe

HEAD = "modelpatch: 1\nname: t\ndescription: d\n"
OLD = "OLD{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
NEW = "NEW{% for m in messages %}<{{ m['role'] }}|{{ m['content'] }}>{% endfor %}" \
      "{% if add_generation_prompt %}<assistant|{% endif %}"
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
NEW_RENDERED = "NEW<system|be brief><user|hi><assistant|"


def _tokenizer_model(path: Path, template: str, *, jinja_file: bool = True) -> Path:
    """A Llama config and a fast tokenizer saved by transformers' own save_pretrained (5.x
    writes the template to chat_template.jinja; ``jinja_file=False``: the legacy
    tokenizer_config.json "chat_template")."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "hi": 3, "be": 4, "brief": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                  unk_token="[UNK]")
    tok.chat_template = template
    tok.save_pretrained(path, save_jinja_files=jinja_file)
    LlamaConfig(vocab_size=6, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1).save_pretrained(path)
    return path


def _rendered(directory: Path) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(directory))
    return tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)


def _sources(directory: Path) -> list[dict]:
    return [c for c in read_manifest(directory).changes if c["kind"] == "content_source"]


def _run(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


# ------------------------------------------------------------------------- chat-template

def test_chat_template_from_a_file_renders_in_transformers(tmp_path):
    model = _tokenizer_model(tmp_path / "m", OLD)
    assert _rendered(model).startswith("OLD")
    (tmp_path / "new.jinja").write_text(NEW)
    source = f"file:{tmp_path / 'new.jinja'}"
    plan = _run(["plan", "chat-template", str(model), "--set", f"template={source}"])
    digest = hashlib.sha256(NEW.encode()).hexdigest()
    assert plan.exit_code == 0, plan.output
    assert f"content chat_template.jinja <- {tmp_path / 'new.jinja'} sha256 {digest}" \
        in plan.output
    out = api.apply("chat-template", model, out=tmp_path / "v",
                    params={"template": source}).output
    assert _rendered(out) == NEW_RENDERED
    assert (out / "chat_template.jinja").read_text() == NEW
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == NEW
    assert {(s["target"], s["sha256"]) for s in _sources(out)} == {
        ("chat_template.jinja", digest), ("tokenizer_config.json /chat_template", digest)}
    assert api.verify(out).ok
    assert (model / "chat_template.jinja").read_text() == OLD          # base untouched


@pytest.fixture
def hub_with_base(tmp_path, monkeypatch):
    """The embedded hub serving ``alice/base``, whose template is in chat_template.jinja."""
    base = _tokenizer_model(tmp_path / "base", NEW)
    from transformers import GenerationConfig

    GenerationConfig(bos_token_id=1, eos_token_id=[2, 5], temperature=0.6,
                     do_sample=True).save_pretrained(base)
    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    store_model(tmp_path / "hub", "alice/base", base)
    with running_hub(tmp_path / "hub", TOKENS) as hub:
        yield hub


def test_chat_template_from_a_base_on_the_hub_is_fetched_once_and_pinned(
        tmp_path, hub_with_base, monkeypatch):
    from patcher.remote.hub_files import HubFiles

    reads = []
    real_read = HubFiles.read
    monkeypatch.setattr(HubFiles, "read", lambda self, path, *a: reads.append(path)
                        or real_read(self, path, *a))
    model = _tokenizer_model(tmp_path / "m", OLD, jinja_file=False)   # legacy: in the config
    source = "hf://alice/base@main/chat_template.jinja"
    out = api.apply("chat-template", model, out=tmp_path / "v", params={"template": source},
                    endpoint=hub_with_base.endpoint).output
    assert reads == ["chat_template.jinja"]            # two ops, one fetch
    assert _rendered(out) == NEW_RENDERED
    commit = hub_with_base.api().model_info("alice/base").sha
    (entry, *_) = _sources(out)
    assert entry["resolved"] == f"hf://alice/base@{commit}/chat_template.jinja"
    assert entry["sha256"] == hashlib.sha256(NEW.encode()).hexdigest()
    assert entry["endpoint"] == hub_with_base.endpoint

    wrong = "0" * 64
    with pytest.raises(PlanError, match=f"has sha256 {entry['sha256']}, not the pinned {wrong}"):
        api.apply("chat-template", model, out=tmp_path / "w", endpoint=hub_with_base.endpoint,
                  params={"template": source, "sha256": wrong})
    assert not (tmp_path / "w").exists()
    pinned = api.apply("chat-template", model, out=tmp_path / "p",
                       endpoint=hub_with_base.endpoint,
                       params={"template": source, "sha256": entry["sha256"]}).output
    assert _rendered(pinned) == NEW_RENDERED


def test_a_recipe_brings_back_a_lost_generation_config_from_the_hub(tmp_path, hub_with_base):
    """mergekit#275 / GPTQModel#1291: the merged or quantized model lost generation_config.json;
    a recipe names the base's file on the hub, in its own text (hub sources may be written)."""
    from transformers import GenerationConfig

    model = _tokenizer_model(tmp_path / "m", OLD)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(HEAD + "files:\n  - add: generation_config.json\n"
                      "    from: hf://alice/base@main/generation_config.json\n")
    plan = _run(["plan", str(recipe), str(model), "--endpoint", hub_with_base.endpoint])
    commit = hub_with_base.api().model_info("alice/base").sha
    assert f"content generation_config.json <- hf://alice/base@{commit}/generation_config.json" \
        in plan.output
    out = api.apply(str(recipe), model, out=tmp_path / "v",
                    endpoint=hub_with_base.endpoint).output
    loaded = GenerationConfig.from_pretrained(out)
    assert (loaded.eos_token_id, loaded.temperature) == ([2, 5], 0.6)


def test_a_file_missing_from_the_hub_repo_names_the_commit(tmp_path, hub_with_base):
    model = _tokenizer_model(tmp_path / "m", OLD)
    with pytest.raises(PlanError, match=r"alice/base@[0-9a-f]{40} has no file nothing\.jinja"):
        api.plan("chat-template", model, endpoint=hub_with_base.endpoint,
                 options={"params": {"template": "hf://alice/base/nothing.jinja"}})


def test_an_unreachable_hub_is_one_line_exit_3(tmp_path):
    model = _tokenizer_model(tmp_path / "m", OLD)
    result = _run(["apply", "chat-template", str(model), "-o", str(tmp_path / "v"),
                   "--endpoint", "http://127.0.0.1:9", "--set",
                   "template=hf://alice/base/chat_template.jinja"])
    assert result.exit_code == 3
    assert "cannot reach the hub" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "v").exists()


def test_from_a_local_model_and_a_json_pointer(tmp_path):
    base = _tokenizer_model(tmp_path / "base", NEW, jinja_file=False)
    model = _tokenizer_model(tmp_path / "m", OLD)
    source = f"model:{base / 'tokenizer_config.json'}#/chat_template"
    plan = _run(["plan", "chat-template", str(model), "--set", f"template={source}"])
    assert f"content tokenizer_config.json /chat_template <- {base / 'tokenizer_config.json'}" \
           f"#/chat_template sha256 " in plan.output
    out = api.apply("chat-template", model, out=tmp_path / "v",
                    params={"template": source}).output
    assert _rendered(out) == NEW_RENDERED
    (entry, *_) = _sources(out)
    assert entry["pointer"] == "/chat_template"
    assert entry["sha256"] == hashlib.sha256(
        (base / "tokenizer_config.json").read_bytes()).hexdigest()


def test_chat_template_refuses_named_templates_and_cleans_processor_copies(tmp_path):
    model = _tokenizer_model(tmp_path / "m", OLD)
    (tmp_path / "new.jinja").write_text(NEW)
    params = {"template": f"file:{tmp_path / 'new.jinja'}"}
    (model / "chat_template.json").write_text(json.dumps({"chat_template": OLD}))
    (model / "processor_config.json").write_text(json.dumps({"chat_template": OLD, "x": 1}))
    out = api.apply("chat-template", model, out=tmp_path / "v", params=params).output
    assert not (out / "chat_template.json").exists()
    assert json.loads((out / "processor_config.json").read_text()) == {"x": 1}
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": OLD}]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    from patcher.errors import GuardRefused

    with pytest.raises(GuardRefused, match="named chat templates"):
        api.plan("chat-template", model, options={"params": params})


# --------------------------------------------------------------------- who may name what

def test_a_local_path_written_in_a_recipe_is_refused(tmp_path):
    (tmp_path / "secret.txt").write_text("key")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(HEAD + f"files:\n  - add: x.txt\n    from: file:{tmp_path}/secret.txt\n")
    with pytest.raises(RecipeError, match="must come from you, as a --set value"):
        load_recipe(recipe)
    model = _tokenizer_model(tmp_path / "m", OLD)
    for text in (HEAD + "params:\n  p: {type: string, default: 'file:%s/secret.txt', "
                 "description: d}\nfiles:\n  - {add: x.txt, from: '{p}'}\n" % tmp_path,
                 HEAD + "params:\n  d: {type: string, description: d}\n"
                 "files:\n  - {add: x.txt, from: 'file:{d}/secret.txt'}\n"):
        recipe.write_text(text)
        with pytest.raises(PlanError, match="must come from you"):
            api.plan(str(recipe), model, options={"params": {"d": str(tmp_path)}}
                     if "{d}" in text else None)
    inner = tmp_path / "inner.yaml"
    inner.write_text(HEAD.replace("name: t", "name: inner") + "params:\n  p: {type: string, "
                     "description: d}\nfiles:\n  - {add: x.txt, from: '{p}'}\n")
    recipe.write_text(HEAD + "include:\n  - {recipe: inner.yaml, params: "
                      "{p: 'file:%s/secret.txt'}}\n" % tmp_path)
    with pytest.raises(PlanError, match="must come from you"):
        api.plan(str(recipe), model)
    recipe.write_text(HEAD + "params:\n  q: {type: string, description: d}\ninclude:\n"
                      "  - {recipe: inner.yaml, params: {p: '{q}'}}\n")     # passed straight
    plan = api.plan(str(recipe), model,
                    options={"params": {"q": f"file:{tmp_path}/secret.txt"}})
    assert any(f.path == "x.txt" for f in plan.files)


@pytest.mark.parametrize("source, message", [
    ("model:{t}/base/../secret.txt", "no model directory"),
    ("model:{t}/base/escape.txt", "escapes the model directory"),
    ("model:{t}/base/.git/config.json", "is inside the dot-directory"),
    ("model:{t}/base/missing.jinja", "has no model file missing.jinja"),
    ("file:{t}/binary.bin", "is not UTF-8 text"),
    ("file:{t}/big.txt", "the limit is 16 MiB"),
    ("file:{t}", "no such regular file"),
    ("model:{t}/base/tokenizer_config.json#/nope", "the JSON has nothing at /nope"),
    ("hf://alice/base/../x.jinja", "'..'"),
    ("nothing-here.jinja", "must be a file next to the recipe, hf://"),
])
def test_bad_local_and_hub_sources_are_refused_naming_the_line(tmp_path, source, message):
    base = _tokenizer_model(tmp_path / "base", NEW)
    (tmp_path / "secret.txt").write_text("key")
    if "escape" in source:          # a model with a symlink out of it is refused whole
        (base / "escape.txt").symlink_to(tmp_path / "secret.txt")
    (base / ".git").mkdir()
    (base / ".git" / "config.json").write_text("{}")
    (tmp_path / "binary.bin").write_bytes(b"\xff\xfe")
    with open(tmp_path / "big.txt", "wb") as f:
        f.truncate((16 << 20) + 1)
    model = _tokenizer_model(tmp_path / "m", OLD)
    with pytest.raises(InputError, match=re.escape(message)) as caught:
        api.plan("chat-template", model,
                 options={"params": {"template": source.format(t=tmp_path)}})
    assert caught.value.one_line().startswith(f"--set template={source.format(t=tmp_path)}: ")


# ------------------------------------------------------------------------- --set scoping

def _param_recipe(path: Path, name: str, kind: str, file: str) -> Path:
    value = "'{x}'" if kind == "string" else "'{x}'"
    path.write_text(f"modelpatch: 1\nname: {name}\ndescription: d\nparams:\n"
                    f"  x: {{type: {kind}, description: the {name} x}}\n"
                    f"config:\n  {file}:\n    - {{set: /{name}, value: {value}}}\n")
    return path


def test_set_scoped_to_one_recipe_and_ambiguous_plain_names_refused(tmp_path):
    model = _tokenizer_model(tmp_path / "m", OLD)
    a = _param_recipe(tmp_path / "a.yaml", "a", "integer", "config.json")
    b = _param_recipe(tmp_path / "b.yaml", "b", "string", "tokenizer_config.json")
    c = _param_recipe(tmp_path / "c.yaml", "c", "integer", "tokenizer_config.json")
    with pytest.raises(InputError, match=r"--set x: ambiguous: a declares it as integer "
                       r"\(the a x\), b declares it as string") as caught:
        api.plan([str(a), str(b)], model, options={"params": {"x": "3"}})
    assert "--set a.x=VALUE or --set b.x=VALUE" in caught.value.one_line()
    plan = api.plan([str(a), str(b)], model, options={"params": {"a.x": "3", "b.x": "3"}})
    changes = {(c["file"], c["path"]): c["after"] for c in changes_json(plan.changes)
               if "after" in c}
    assert changes == {("config.json", "/a"): 3, ("tokenizer_config.json", "/b"): "3"}
    plan = api.plan([str(a), str(c)], model, options={"params": {"x": "5", "c.x": "6"}})
    changes = {(c["file"], c["path"]): c["after"] for c in changes_json(plan.changes)
               if "after" in c}
    assert changes == {("config.json", "/a"): 5, ("tokenizer_config.json", "/c"): 6}
    with pytest.raises(InputError, match=r"--set z\.x: no recipe named 'z' was given"):
        api.plan([str(a), str(b)], model, options={"params": {"z.x": "1"}})
    with pytest.raises(InputError, match="recipe 'a' has no parameter 'y'"):
        api.plan(str(a), model, options={"params": {"a.y": "1"}})
    result = _run(["plan", str(a), str(b), str(model), "--set", "x=1"])
    assert result.exit_code == 2 and "ambiguous" in result.output


# ---------------------------------------------------------------------------- JSON Schema

SOURCES_RECIPE = HEAD + """params:
  t: {type: string, description: d}
  pin: {type: string, default: '', description: d}
config:
  tokenizer_config.json:
    - set: /chat_template
      from: hf://org/base@refs%2Fpr%2F1/tokenizer_config.json#/chat_template
      sha256: abababababababababababababababababababababababababababababababab
    - {set: /x, from: '{t}', sha256: '{pin}'}
files:
  - {add: chat_template.jinja, from: hf://org/base/chat_template.jinja, overwrite: true}
  - {add: generation_config.json, from: '{t}', sha256: '{pin}'}
"""


def test_schema_and_loader_agree_on_from_sources():
    jsonschema = pytest.importorskip("jsonschema")
    from ruamel.yaml import YAML

    schema = json.loads((Path(__file__).resolve().parents[2] / "patcher" / "schemas" /
                         "recipe.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    plain = YAML(typ="safe", pure=True).load
    assert [e.message for e in validator.iter_errors(plain(SOURCES_RECIPE))] == []
    recipe = load_recipe(SOURCES_RECIPE)
    first = recipe.config["tokenizer_config.json"][0]
    assert (first.fetch.repo_id, first.fetch.revision, first.fetch.path, first.fetch.pointer) \
        == ("org/base", "refs/pr/1", "tokenizer_config.json", "/chat_template")
    chat = (Path(__file__).resolve().parents[2] / "recipes" / "chat-template.yaml").read_text()
    assert [e.message for e in validator.iter_errors(plain(chat))] == []
    for bad in (HEAD + "files:\n  - {add: x, from: hf://org/base/x, sha256: abc}\n",
                HEAD + "config:\n  c.json:\n    - {set: /x, value: 1, from: hf://o/b/x}\n"):
        assert list(validator.iter_errors(plain(bad))) != []
        with pytest.raises(RecipeError):
            load_recipe(bad)
    with pytest.raises(RecipeError, match="it takes no 'content:'"):       # the loader only
        load_recipe(HEAD + "files:\n  - {add: x, content: y, sha256: '" + "ab" * 32 + "'}\n")


def test_chat_template_in_place_reverts_byte_for_byte(tmp_path):
    from fs_snapshot import snapshot

    model = _tokenizer_model(tmp_path / "m", OLD)
    (tmp_path / "new.jinja").write_text(NEW)
    before = snapshot(model)
    api.apply_in_place("chat-template", model,
                       params={"template": f"file:{tmp_path / 'new.jinja'}"})
    assert _rendered(model) == NEW_RENDERED
    api.revert(model)
    assert snapshot(model) == before and _rendered(model).startswith("OLD")


def test_set_from_a_file_next_to_the_recipe_is_data_not_a_template(tmp_path):
    model = _tokenizer_model(tmp_path / "m", OLD)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "t.jinja").write_text("Hello {name} {{ x }}")
    recipe = tmp_path / "r" / "r.yaml"
    recipe.write_text(HEAD + "config:\n  tokenizer_config.json:\n"
                      "    - {set: /chat_template, from: t.jinja}\n")
    out = api.apply(str(recipe), model, out=tmp_path / "v").output
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == "Hello {name} {{ x }}"
    assert _sources(out)[0]["from"] == "t.jinja"


def test_the_model_card_names_hub_sources_but_never_local_paths():
    from patcher.hub.client.model_card import change_lines

    digest = "ab" * 32
    lines = change_lines([
        {"kind": "content_source", "target": "chat_template.jinja", "from": "hf://o/b/x",
         "resolved": "hf://o/b@" + "1" * 40 + "/x", "sha256": digest},
        {"kind": "content_source", "target": "t.json /x", "from": "file:/home/me/t.jinja",
         "resolved": "/home/me/t.jinja", "sha256": digest},
        {"kind": "content_source", "target": "a.jinja", "from": "a.jinja", "sha256": digest}])
    assert lines == [
        f"- `chat_template.jinja`: content from `hf://o/b@{'1' * 40}/x` (sha256 `{digest}`)",
        f"- `t.json /x`: content from a local file (sha256 `{digest}`)",
        f"- `a.jinja`: content from `a.jinja` beside the recipe (sha256 `{digest}`)"]


@pytest.mark.parametrize("source, needle", [
    ("hf://org/base@v1%20x/config.json", "the revision of 'hf://org/base@v1 x' 'v1 x' is not"),
    ("hf://org/base@..%2Fmain/config.json", "is not a commit id, branch or tag name"),
    ("hf://org/ba..se/config.json", "invalid repo id 'org/ba..se'")])
def test_a_hub_source_names_its_repository_and_revision_as_a_model_does(source, needle):
    """``from: hf://`` is checked by the parsing of a MODEL (``patcher.model_ref``) when the
    recipe loads, in one line naming the source, never sent to a hub as it is."""
    text = HEAD + f"config:\n  config.json:\n    - set: /x\n      from: {source}\n"
    with pytest.raises(InputError) as info:
        load_recipe(text)
    line = str(info.value)
    assert f"from: {source!r}" in line and needle in line and "\n" not in line, line
