"""Config operations on JSON documents, and style-preserving JSON files.

``apply_config_ops`` must be pure, apply every friendly op and RFC 6902 op (through jsonpatch),
honour ``in:`` scopes and ``missing_ok``, and fail with PlanErrors that name the file, the JSON
pointer and the recipe line. ``load_json_document``/``dump_json_document`` must give the bytes of
an unmodified file back exactly, for the files transformers and huggingface tools write.
"""

from __future__ import annotations

import copy
import json
import pickle
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.config.jsonfile import (
    JsonFloat,
    JsonStyle,
    dump_json_document,
    load_json_document,
    parse_json,
)
from patcher.errors import PlanError
from patcher.plan.changes import ConfigEdit
from patcher.recipe.config_ops import JsonEdit, apply_config_ops, unified_diff
from patcher.recipe.load import load_recipe, resolve_recipe

HEAD = "modelpatch: 1\nname: t\ndescription: d\nconfig:\n  config.json:\n"


def ops(yaml_ops: str):
    """The config.json ops of a recipe whose op list is ``yaml_ops`` (ops start on line 6)."""
    body = textwrap.indent(textwrap.dedent(yaml_ops), "    ")
    return load_recipe(HEAD + body, source_name="recipe.yaml").config["config.json"]


def apply(doc, yaml_ops: str):
    return apply_config_ops(doc, ops(yaml_ops), file="config.json")


def plan_error(doc, yaml_ops: str) -> str:
    with pytest.raises(PlanError) as info:
        apply(doc, yaml_ops)
    assert info.value.exit_code == 2
    return str(info.value)


KIMI = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "quantization_config": {
        "config_groups": {"group_0": {"targets": ["Linear"]}},
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
        "quant_method": "modelopt",
    },
    "text_config": {
        "model_type": "deepseek_v3",
        "quantization_config": {"kv_cache_scheme": {"num_bits": 8, "type": "float"}},
        "rms_norm_eps": 1e-06,
    },
    "vision_config": {"model_type": "moonvit"},
}


# ------------------------------------------------------------------------------ friendly ops

def test_drop_in_scopes_records_each_removal():
    before = copy.deepcopy(KIMI)
    new, changes = apply(KIMI, """\
        - drop: /quantization_config/kv_cache_scheme
          in: [/, /text_config, /vision_config, /missing_scope]
        """)
    assert KIMI == before  # pure: the input is untouched
    assert "kv_cache_scheme" not in new["quantization_config"]
    assert "kv_cache_scheme" not in new["text_config"]["quantization_config"]
    assert [ConfigEdit.of(c).to_json() for c in changes] == [
        {"file": "config.json", "kind": "removed",
         "path": "/quantization_config/kv_cache_scheme",
         "before": {"dynamic": False, "num_bits": 8, "type": "float"}, "after": None,
         "existed": True, "recipe_line": "recipe.yaml:6:7"},
        {"file": "config.json", "kind": "removed",
         "path": "/text_config/quantization_config/kv_cache_scheme",
         "before": {"num_bits": 8, "type": "float"}, "after": None, "existed": True,
         "recipe_line": "recipe.yaml:6:7"},
    ]


def test_drop_of_a_missing_path_is_an_error_naming_the_line_unless_missing_ok():
    assert plan_error(KIMI, "- drop: /nope\n") == (
        "recipe.yaml:6:7: config.json: cannot drop /nope: it does not exist (add missing_ok: "
        "true to the operation if the path is optional)")
    assert plan_error(KIMI, "- {set: /a, value: 1}\n- drop: /text_config/nope\n").startswith(
        "recipe.yaml:7:7: config.json: cannot drop /text_config/nope: it does not exist")
    new, changes = apply(KIMI, "- {drop: /nope, missing_ok: true}\n"
                               "- {drop: /a/b/c, missing_ok: true}\n")
    assert new == KIMI and changes == []


def test_scopes_missing_scope_vs_missing_key():
    # A key found in some scope is dropped there; scopes lacking it, or missing, are skipped.
    new, changes = apply(KIMI, "- drop: /rms_norm_eps\n  in: [/text_config, /, /absent]\n")
    assert "rms_norm_eps" not in new["text_config"] and len(changes) == 1
    # Found in no existing scope: an error naming the scopes, unless missing_ok.
    assert plan_error(KIMI, "- drop: /nope\n  in: [/text_config, /, /absent]\n") == (
        "recipe.yaml:6:7: config.json: cannot drop /nope: it exists in none of the scopes "
        "/text_config, / (add missing_ok: true to the operation if the path is optional)")
    assert apply(KIMI, "- {drop: /nope, in: [/text_config, /], missing_ok: true}\n") == (KIMI, [])


def test_drop_when_no_scope_exists():
    assert plan_error(KIMI, "- {drop: /x, in: [/a, /b]}\n") == (
        "recipe.yaml:6:7: config.json: none of the scopes /a, /b exists, so drop /x has nothing "
        "to apply to")
    assert apply(KIMI, "- {drop: /x, in: [/a, /b], missing_ok: true}\n") == (KIMI, [])


def test_rfc6902_ops_with_missing_ok_skip_scopes_without_their_path():
    doc = {"q": {"kv": "FP8", "k": 1}, "t": {"q": {}}, "h": {"x": 1}}
    new, changes = apply(doc, "- {op: replace, path: /q/kv, value: null, in: [/, /t], "
                              "missing_ok: true}\n"
                              "- {op: remove, path: /nope, missing_ok: true}\n"
                              "- {op: move, from: /h/x, path: /h/y, in: [/, /t],"
                              " missing_ok: true}\n"
                              "- {op: replace, path: /q/k, value: 1, missing_ok: true}\n")
    assert new == {"q": {"kv": None, "k": 1}, "t": {"q": {}}, "h": {"y": 1}}
    assert [(c.kind, c.path, c.before, c.after) for c in changes] == [
        ("set", "/q/kv", "FP8", None), ("renamed", "/h/y", 1, 1)]
    # without missing_ok, RFC 6902 semantics: every scope must have the path
    assert plan_error(doc, "- {op: replace, path: /q/kv, value: null, in: [/, /t]}\n") == (
        "recipe.yaml:6:7: config.json: replace /t/q/kv: /t/q/kv does not exist (/t/q is an "
        "object without 'kv')")


def test_scope_that_is_not_a_container_is_skipped():
    doc = {"text_config": None, "x": 1}
    new, changes = apply(doc, "- {drop: /x, in: [/text_config, /]}\n")
    assert new == {"text_config": None} and len(changes) == 1


def test_set_creates_parents_and_replaces():
    new, changes = apply({"a": 1}, """\
        - set: /foo/bar/baz
          value: {x: [1, 2]}
        - set: /a
          value: 2
        - set: /a
          value: 2
        - set: /b
          value: null
        """)
    assert new == {"a": 2, "foo": {"bar": {"baz": {"x": [1, 2]}}}, "b": None}
    assert [(c.kind, c.path, c.before, c.after, c.existed, c.recipe_line) for c in changes] == [
        ("set", "/foo/bar/baz", None, {"x": [1, 2]}, False, "recipe.yaml:6:7"),
        ("set", "/a", 1, 2, True, "recipe.yaml:8:7"),
        # the second set /a is a no-op and records nothing
        ("set", "/b", None, None, False, "recipe.yaml:12:7"),
    ]


def test_set_value_is_copied_not_shared():
    recipe_ops = ops("- set: /a\n  value: {x: [1]}\n- set: /a/x/0\n  value: 9\n")
    new, _ = apply_config_ops({}, recipe_ops, file="config.json")
    assert new == {"a": {"x": [9]}}
    assert recipe_ops[0].value == {"x": [1]}  # the recipe's value was not modified


def test_set_in_arrays_and_scopes():
    new, changes = apply({"l": [1, 2], "t": {}}, """\
        - {set: /l/0, value: 5}
        - {set: /l/-, value: 3}
        - {set: /q/r, value: 1, in: [/t, /absent]}
        """)
    assert new == {"l": [5, 2, 3], "t": {"q": {"r": 1}}}
    assert [(c.path, c.existed) for c in changes] == [("/l/0", True), ("/l/-", False),
                                                      ("/t/q/r", False)]


def test_set_errors():
    assert plan_error({"model_type": "x"}, "- {set: /model_type/sub, value: 1}\n") == (
        "recipe.yaml:6:7: config.json: cannot set /model_type/sub: /model_type is a string, not "
        "an object")
    assert plan_error({"l": [1]}, "- {set: /l/5, value: 1}\n").startswith(
        "recipe.yaml:6:7: config.json: add /l/5: ")
    assert plan_error({}, "- {set: /x, value: 1, in: /text_config}\n") == (
        "recipe.yaml:6:7: config.json: none of the scopes /text_config exists, so set /x has "
        "nothing to apply to")


def test_rename_keeps_the_key_position():
    doc = {"a": 1, "old_key": {"x": 1}, "z": 2}
    new, changes = apply(doc, "- rename: /old_key\n  to: /new_key\n")
    assert list(new) == ["a", "new_key", "z"] and new["new_key"] == {"x": 1}
    assert changes == [JsonEdit("config.json", "/new_key", "renamed", {"x": 1}, {"x": 1},
                              "recipe.yaml:6:7", from_path="/old_key")]


def test_rename_across_objects_and_scopes():
    doc = {"t": {"a": {"k": 1}, "b": {}}, "a": {"k": 2}, "b": {}}
    new, changes = apply(doc, "- {rename: /a/k, to: /b/k, in: [/, /t]}\n")
    assert new == {"t": {"a": {}, "b": {"k": 1}}, "a": {}, "b": {"k": 2}}
    assert [(c.from_path, c.path) for c in changes] == [("/a/k", "/b/k"), ("/t/a/k", "/t/b/k")]


def test_rename_errors_and_missing_ok():
    doc = {"a": 1, "b": 2}
    assert plan_error(doc, "- {rename: /x, to: /y}\n") == (
        "recipe.yaml:6:7: config.json: cannot rename /x: it does not exist (add missing_ok: true "
        "to the operation if the path is optional)")
    assert apply(doc, "- {rename: /x, to: /y, missing_ok: true}\n") == (doc, [])
    assert plan_error(doc, "- {rename: /a, to: /b}\n") == (
        "recipe.yaml:6:7: config.json: cannot rename /a to /b: /b already exists (drop it "
        "first)")
    assert plan_error(doc, "- {rename: /a, to: /c/d}\n") == (
        "recipe.yaml:6:7: config.json: cannot rename /a to /c/d: /c is not an object")


def test_architectures_and_model_type():
    new, changes = apply(KIMI, "- architectures: [DeepseekV3ForCausalLM]\n"
                               "- model_type: deepseek_v3\n"
                               "- {model_type: deepseek_v3, in: /text_config}\n")
    assert new["architectures"] == ["DeepseekV3ForCausalLM"]
    assert new["model_type"] == "deepseek_v3"
    assert [(c.path, c.before, c.after) for c in changes] == [
        ("/architectures", ["KimiK25ForConditionalGeneration"], ["DeepseekV3ForCausalLM"]),
        ("/model_type", "kimi_k25", "deepseek_v3"),
    ]  # text_config already had deepseek_v3: no change


# ------------------------------------------------------------------------------- RFC 6902

def test_every_rfc6902_op():
    doc = {"a": {"b": 1}, "l": [1, 2], "s": "x"}
    new, changes = apply(doc, """\
        - {op: test, path: /a/b, value: 1}
        - {op: add, path: /a/c, value: [true]}
        - {op: add, path: /l/1, value: 9}
        - {op: add, path: /l/-, value: 3}
        - {op: replace, path: /s, value: y}
        - {op: copy, from: /a, path: /a2}
        - {op: move, from: /a2/c, path: /moved}
        - {op: remove, path: /l/0}
        - {op: test, path: /l, value: [9, 2, 3]}
        """)
    assert new == {"a": {"b": 1, "c": [True]}, "l": [9, 2, 3], "s": "y", "a2": {"b": 1},
                   "moved": [True]}
    assert [(c.kind, c.path, c.from_path, c.before, c.after, c.existed) for c in changes] == [
        ("test", "/a/b", None, 1, 1, True),
        ("set", "/a/c", None, None, [True], False),
        ("set", "/l/1", None, None, 9, False),   # add into an array inserts
        ("set", "/l/-", None, None, 3, False),
        ("set", "/s", None, "x", "y", True),
        ("copied", "/a2", "/a", {"b": 1, "c": [True]}, {"b": 1, "c": [True]}, False),
        ("renamed", "/moved", "/a2/c", [True], [True], False),
        ("removed", "/l/0", None, 1, None, True),
        ("test", "/l", None, [9, 2, 3], [9, 2, 3], True),
    ]
    assert [c.recipe_line for c in changes] == [f"recipe.yaml:{line}:7" for line in range(6, 15)]
    json.dumps([ConfigEdit.of(c).to_json() for c in changes])  # serializable


def test_rfc6902_ops_in_scopes():
    doc = {"text_config": {"a": 1}, "a": 1}
    new, changes = apply(doc, "- {op: replace, path: /a, value: 2, in: [/, /text_config]}\n"
                              "- {op: move, from: /a, path: /b, in: /text_config}\n")
    assert new == {"text_config": {"b": 2}, "a": 2}
    assert [c.path for c in changes] == ["/a", "/text_config/a", "/text_config/b"]


def test_replace_root():
    new, changes = apply({"a": 1}, "- {op: replace, path: '', value: {b: 2}}\n")
    assert new == {"b": 2} and changes[0].before == {"a": 1}


def test_failing_test_op():
    assert plan_error(KIMI, "- {op: test, path: /model_type, value: deepseek_v3}\n") == (
        'recipe.yaml:6:7: config.json: test /model_type failed: it is "kimi_k25", the recipe '
        'expects "deepseek_v3"')
    assert plan_error(KIMI, "- {op: test, path: /nope, value: 1}\n") == (
        "recipe.yaml:6:7: config.json: test /nope failed: it does not exist, the recipe "
        "expects 1")
    # JSON equality: true is not 1
    assert plan_error({"f": 1}, "- {op: test, path: /f, value: true}\n") == (
        "recipe.yaml:6:7: config.json: test /f failed: it is 1, the recipe expects true")
    # 1 and 1.0 are the same JSON number
    assert apply({"f": 1}, "- {op: test, path: /f, value: 1.0}\n")[1][0].kind == "test"


@pytest.mark.parametrize("op, message", [
    ("{op: remove, path: /a/x/y}",
     "remove /a/x/y: /a/x/y does not exist (/a is an object without 'x')"),
    ("{op: replace, path: /nope, value: 1}",
     "replace /nope: /nope does not exist (the document is an object without 'nope')"),
    ("{op: add, path: /q/r/s, value: 1}",
     "add /q/r/s: /q/r does not exist (the document is an object without 'q')"),
    ("{op: move, from: /q, path: /r}",
     "move /r: /q does not exist (the document is an object without 'q')"),
    ("{op: copy, from: /a, path: /z/y}",
     "copy /z/y: /z does not exist (the document is an object without 'z')"),
    ("{op: add, path: /l/7, value: 1}", "add /l/7: can't insert outside of list"),
    ("{op: remove, path: /l/5}", "remove /l/5: /l/5 does not exist (/l is an array without "
                                 "'5')"),
])
def test_rfc6902_errors_name_file_pointer_and_line(op, message):
    doc = {"a": {"b": 1}, "l": [1]}
    assert plan_error(doc, f"- {{drop: /unrelated, missing_ok: true}}\n- {op}\n") == (
        f"recipe.yaml:7:7: config.json: {message}")


def test_ops_see_earlier_ops():
    new, _ = apply({}, "- {set: /a/b, value: 1}\n- {rename: /a/b, to: /a/c}\n"
                       "- {op: test, path: /a/c, value: 1}\n- drop: /a\n")
    assert new == {}


def test_changes_are_detached_from_the_document():
    new, changes = apply({}, "- {set: /a, value: {b: 1}}\n- {set: /a/b, value: 2}\n")
    assert changes[0].after == {"b": 1} and new == {"a": {"b": 2}}


def test_change_is_picklable():
    _, changes = apply(KIMI, "- drop: /quantization_config\n")
    assert pickle.loads(pickle.dumps(changes)) == changes


# -------------------------------------------------------------------- the built-in recipe

def test_sm120_recipe_on_kimi_files():
    recipe = load_recipe(resolve_recipe("sm120-fp16-kv"))
    new, changes = apply_config_ops(KIMI, recipe.config["config.json"], file="config.json")
    assert [c.path for c in changes] == ["/quantization_config/kv_cache_scheme",
                                        "/text_config/quantization_config/kv_cache_scheme"]
    assert new["quantization_config"]["quant_method"] == "modelopt"
    assert new["quantization_config"]["kv_cache_scheme"] is None
    assert new["text_config"]["quantization_config"]["kv_cache_scheme"] is None
    nested = {"producer": {"name": "modelopt"},
              "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}
    flat = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    hf_ops = recipe.config["hf_quant_config.json"]
    new, changes = apply_config_ops(nested, hf_ops, file="hf_quant_config.json")
    # vLLM's ModelOpt NVFP4/MXFP8 configs require the key: it stays, as null
    assert new == {"producer": {"name": "modelopt"},
                   "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None}}
    assert [(c.file, c.path, c.before, c.after) for c in changes] == [
        ("hf_quant_config.json", "/quantization/kv_cache_quant_algo", "FP8", None)]
    new, changes = apply_config_ops(flat, hf_ops, file="hf_quant_config.json")
    assert new == {"quant_algo": "FP8", "kv_cache_quant_algo": None}
    assert [c.path for c in changes] == ["/kv_cache_quant_algo"]


def test_sm120_recipe_changes_only_the_patched_lines():
    raw = (json.dumps(KIMI, indent=2, sort_keys=True) + "\n").encode()
    document = load_json_document(raw, "config.json")
    recipe = load_recipe(resolve_recipe("sm120-fp16-kv"))
    new, _ = apply_config_ops(document.value, recipe.config["config.json"], file="config.json")
    after = dump_json_document(new, document.style)
    assert after == (json.dumps(new, indent=2, sort_keys=True) + "\n").encode()
    diff = unified_diff(raw, after, "config.json")
    changed = [ln for ln in diff.splitlines()[2:] if ln[:1] in "+-"]
    assert changed == [
        '-    "kv_cache_scheme": {', '-      "dynamic": false,', '-      "num_bits": 8,',
        '-      "type": "float"', '-    },', '+    "kv_cache_scheme": null,',
        '-      "kv_cache_scheme": {', '-        "num_bits": 8,', '-        "type": "float"',
        '-      }', '+      "kv_cache_scheme": null',
    ]
    assert b'"rms_norm_eps": 1e-06' in after


# --------------------------------------------------------------------- JSON style round trip

@pytest.fixture(scope="module")
def transformers_files(tmp_path_factory):
    """config.json, generation_config.json, tokenizer_config.json and tokenizer.json as
    transformers writes them."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    out = tmp_path_factory.mktemp("hf")
    config = transformers.DeepseekV3Config(
        vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, rms_norm_eps=1e-06, rope_theta=10000.0,
        quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                             "weight_block_size": [128, 128]})
    config.save_pretrained(out)
    transformers.GenerationConfig(bos_token_id=0, eos_token_id=1, do_sample=True, temperature=0.6,
                                  top_p=0.95).save_pretrained(out)
    vocab = {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "é": 2, "漢字": 3, "a": 4}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="a"))
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<｜begin▁of▁sentence｜>",
        eos_token="<｜end▁of▁sentence｜>", model_max_length=131072)
    tok.save_pretrained(out)
    return {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".json"}


@pytest.mark.parametrize("name", ["config.json", "generation_config.json",
                                  "tokenizer_config.json", "tokenizer.json"])
def test_transformers_files_round_trip(transformers_files, name):
    data = transformers_files[name]
    document = load_json_document(data, name)
    assert document.exact and document.note is None
    assert dump_json_document(document.value, document.style) == data
    assert document.value == parse_json(data, name)


def test_transformers_styles(transformers_files):
    config = load_json_document(transformers_files["config.json"], "config.json").style
    assert (config.indent, config.sort_keys, config.trailing, config.ensure_ascii) == (
        "  ", True, "\n", True)
    tok = load_json_document(transformers_files["tokenizer_config.json"], "t").style
    assert tok.ensure_ascii is False  # written with ensure_ascii=False
    assert "｜".encode() in transformers_files["tokenizer_config.json"]


def test_patched_transformers_config_changes_only_patched_keys(transformers_files):
    data = transformers_files["config.json"]
    document = load_json_document(data, "config.json")
    new, _ = apply(document.value, "- drop: /quantization_config/fmt\n"
                                   "- {set: /quantization_config/kv_cache_scheme, "
                                   "value: {num_bits: 8}}\n")
    after = dump_json_document(new, document.style)
    diff = unified_diff(data, after, "config.json")
    changed = [ln for ln in diff.splitlines()[2:] if ln[:1] in "+-"]
    assert changed == ['-    "fmt": "e4m3",', '+    "kv_cache_scheme": {',
                       '+      "num_bits": 8', '+    },']  # inserted in sorted position


STYLE_SAMPLE = {
    "architectures": ["DeepseekV3ForCausalLM"], "rms_norm_eps": 1e-06, "eps2": 0.00001,
    "one": 1.0, "big": 123456789012345678901234567890, "neg": -0.0, "e": 1E+30,
    "name": "Kimi ü 漢字 \u2028 \"q\" \\ /", "empty_obj": {}, "empty_list": [],
    "nested": {"z": [1, [2, {"y": None, "x": True, "w": False}]]}, "emoji": "🤗",
}


@pytest.mark.parametrize("kwargs", [
    dict(indent=2), dict(indent=2, sort_keys=True), dict(indent=4), dict(indent="\t"),
    dict(indent=0), dict(), dict(separators=(",", ":")), dict(indent=2, ensure_ascii=False),
    dict(indent=2, separators=(", ", ": ")), dict(indent=1, separators=(",", ":")),
    dict(separators=(",", ":"), ensure_ascii=False),
])
@pytest.mark.parametrize("trailer", ["", "\n", "\n\n"])
def test_json_dumps_styles_round_trip(kwargs, trailer):
    data = (json.dumps(STYLE_SAMPLE, **kwargs) + trailer).encode()
    document = load_json_document(data, "x.json")
    assert document.exact, document.note
    assert dump_json_document(document.value, document.style) == data
    assert document.style.trailing == trailer


def test_number_literals_are_preserved():
    data = (b'{"a": 1e-06, "b": 0.00001, "c": 1.0, "d": 1E5, "e": -0, '
            b'"f": 12345678901234567890123, "g": 1.50, "h": NaN, "i": -Infinity, "j": 2.5e-3}')
    document = load_json_document(data, "x.json")
    assert document.exact and dump_json_document(document.value, document.style) == data
    value = document.value
    assert value["a"] == 1e-06 and isinstance(value["a"], JsonFloat)
    assert value["a"].literal == "1e-06"
    assert value["g"] == 1.5 and value["f"] == 12345678901234567890123
    assert copy.deepcopy(value)["b"].literal == "0.00001"
    assert pickle.loads(pickle.dumps(value))["e"].literal == "-0"
    # a changed value is written as Python's json writes it
    value["a"] = 2e-06
    assert b'"a": 2e-06' in dump_json_document(value, document.style)


def test_crlf_bom_and_leading_whitespace_round_trip():
    for data in [b'{\r\n  "a": [\r\n    1\r\n  ]\r\n}\r\n',
                 b'\xef\xbb\xbf{\n  "a": 1\n}\n',
                 b'  \n{"a": 1}\n']:
        document = load_json_document(data, "x.json")
        assert document.exact, data
        assert dump_json_document(document.value, document.style) == data
    crlf = load_json_document(b'{\r\n  "a": 1\r\n}\r\n', "x.json")
    crlf.value["b"] = [2]
    assert dump_json_document(crlf.value, crlf.style) == (
        b'{\r\n  "a": 1,\r\n  "b": [\r\n    2\r\n  ]\r\n}\r\n')


@pytest.mark.parametrize("data, line", [
    (b'{"a" : 1}', 1),                              # space before the colon
    (b'{"a": "\\/"}', 1),                           # an escape Python does not write
    (b'{\n  "a": 1,\n    "b": 2\n}\n', 3),           # inconsistent indentation
    (b'{\n  "a": [1, 2]\n}\n', 2),                  # one-line arrays in an indented file
    (b'{"a": "\\u00e9", "b": "\xc3\xa9"}', 1),       # both escaped and raw non-ASCII
])
def test_unreproducible_styles_are_flagged(data, line):
    document = load_json_document(data, "x.json")
    assert not document.exact and not document.style.exact
    assert document.note == (f"its formatting cannot be reproduced exactly (first difference on "
                             f"line {line}); a rewrite will reformat it")
    # what it writes is still the same JSON
    assert json.loads(dump_json_document(document.value, document.style)) == json.loads(data)


def test_invalid_json_documents():
    from patcher.errors import ModelDirError

    for data, message in [(b'{"a": 1, "a": 2}', "x.json: invalid JSON: duplicate key 'a'"),
                          (b'{"a": }', "x.json: invalid JSON at line 1 column 7: Expecting value"),
                          (b'\xff{}', "x.json: not valid UTF-8 at byte 0")]:
        with pytest.raises(ModelDirError) as info:
            load_json_document(data, "x.json")
        assert str(info.value) == message


def test_dump_json_document_defaults_and_errors():
    assert dump_json_document({"b": [1, 2.5], "a": "é"}, JsonStyle()) == (
        b'{\n  "b": [\n    1,\n    2.5\n  ],\n  "a": "\\u00e9"\n}\n')
    with pytest.raises(TypeError):
        dump_json_document({1: 2}, JsonStyle())
    with pytest.raises(TypeError):
        dump_json_document({"a": object()}, JsonStyle())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)
json_styles = st.sampled_from([
    dict(indent=2), dict(indent=2, sort_keys=True), dict(indent=4), dict(indent="\t"),
    dict(), dict(separators=(",", ":")), dict(indent=2, ensure_ascii=False),
    dict(indent=2, sort_keys=True, ensure_ascii=False)])


@settings(max_examples=150, deadline=None)
@given(value=json_values, style=json_styles, newline=st.booleans())
def test_round_trip_property(value, style, newline):
    data = (json.dumps(value, **style) + ("\n" if newline else "")).encode()
    document = load_json_document(data, "x.json")
    assert dump_json_document(document.value, document.style) == data


# ----------------------------------------------------------------------------- unified diff

def test_unified_diff():
    before = b'{\n  "a": 1,\n  "b": 2\n}\n'
    after = b'{\n  "a": 1\n}\n'
    assert unified_diff(before, after, "config.json") == (
        '--- a/config.json\n+++ b/config.json\n@@ -1,4 +1,3 @@\n {\n-  "a": 1,\n-  "b": 2\n'
        '+  "a": 1\n }\n')
    assert unified_diff(before, before, "config.json") == ""
    assert unified_diff(None, b"x\n", "new.txt") == (
        "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+x\n")
    assert unified_diff(b"x\n", None, "gone.txt") == (
        "--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
    assert unified_diff(b'{"a": 1}', b'{"a": 2}', "c.json") == (
        '--- a/c.json\n+++ b/c.json\n@@ -1 +1 @@\n-{"a": 1}\n\\ No newline at end of file\n'
        '+{"a": 2}\n\\ No newline at end of file\n')


# ----------------------------------------------------------------------------- JSON pointers

def test_json_pointer_rules():
    from patcher.config.json_pointer import MISSING, json_equal, pointer_error, resolve

    doc = {"a/b": {"m~n": 1}, "l": [10, 20], "": 3}
    assert resolve(doc, "/a~1b/m~0n") == 1
    assert resolve(doc, "/l/1") == 20 and resolve(doc, "/l/0") == 10
    assert resolve(doc, "/l/01") is MISSING and resolve(doc, "/l/-") is MISSING
    assert resolve(doc, "/l/2") is MISSING and resolve(doc, "/l/x") is MISSING
    assert resolve(doc, "/") == 3 and resolve(doc, "") is doc
    assert resolve(doc, "/a~1b/m~0n/deeper") is MISSING
    assert pointer_error("/a~1b/m~0n") is None and pointer_error("") is None
    assert pointer_error("/a~") and pointer_error("a") and pointer_error(1)
    assert json_equal(1, 1.0) and json_equal({"a": [1]}, {"a": [1.0]})
    assert not json_equal(True, 1) and not json_equal(None, False) and not json_equal(0, False)
    assert not json_equal([1, 2], [2, 1]) and json_equal({"a": 1, "b": 2}, {"b": 2, "a": 1})


def test_escaped_pointers_in_ops():
    new, changes = apply({"auto_map": {"a/b": 1, "c~d": 2}},
                         "- drop: /auto_map/a~1b\n- {rename: /auto_map/c~0d, to: /auto_map/e}\n")
    assert new == {"auto_map": {"e": 2}}
    assert [c.path for c in changes] == ["/auto_map/a~1b", "/auto_map/e"]
