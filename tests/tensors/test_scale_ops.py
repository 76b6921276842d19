"""The tensor actions ``split``, ``scale`` (reciprocal, cast, reshape:
exact or refused) and the ``refuse`` tensor guard; the ``kv-scale-names`` library recipe on the
real ModelOpt FP8 export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from tensor_helpers import assert_bits_equal, read_tensors, write_model, write_recipe

from patcher import api
from patcher.cli import main
from patcher.errors import GuardRefused, NothingToChange, PlanError, RecipeError
from patcher.recipe.load import load_recipe

FIXTURES = Path(__file__).parent.parent / "fixtures" / "modelopt"
SCHEMA = Path(__file__).resolve().parents[2] / "patcher" / "schemas" / "recipe.schema.json"
HEAD = "modelpatch: 1\nname: t\ndescription: d\n"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _np_reciprocal(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / x.astype(np.float32)      # IEEE float32 division


def _apply(tmp_path, tensors: dict, recipe: str, name: str = "v"):
    base = tmp_path / "base"
    if not base.exists():
        write_model(base, {"model.safetensors": tensors}, index=False)
    path = write_recipe(tmp_path / f"{name}.yaml", recipe)
    return api.apply(path, base, out=tmp_path / name).output


# ------------------------------------------------------------------------------ reciprocal

def test_reciprocal_nearest_is_ieee_float32_division_and_reshapes(tmp_path):
    gen = torch.Generator().manual_seed(3)
    x = (torch.rand(4096, generator=gen, dtype=torch.float64) * 8 + 1e-3).float()
    out = _apply(tmp_path, {"a.weight_scale_2": x, "b.weight_scale_2": _f32(3.0)},
                 """
                 - select: {glob: "a.*"}
                   scale: {reciprocal: nearest}
                 - select: {glob: "b.*"}
                   scale: {reciprocal: nearest, reshape: [1]}
                 """)
    got = read_tensors(out)
    assert_bits_equal(got["a.weight_scale_2"], torch.from_numpy(_np_reciprocal(x.numpy())))
    assert_bits_equal(got["b.weight_scale_2"], torch.from_numpy(_np_reciprocal(np.array([3.0]))))


def test_reciprocal_exact_accepts_what_comes_back_and_refuses_the_rest(tmp_path):
    ok = _f32([0.25, 2.0, 3.0, 448.0 * 6])              # 1/(1/x) == x for each (checked below)
    assert np.array_equal(_np_reciprocal(_np_reciprocal(ok.numpy())), ok.numpy())
    out = _apply(tmp_path, {"s": ok}, "- select: {glob: s}\n  scale: {reciprocal: exact}\n")
    assert_bits_equal(read_tensors(out)["s"], torch.from_numpy(_np_reciprocal(ok.numpy())))

    lossy = _f32([2.8156098778708838e-05])               # a real weight_scale_2 of the fixture
    assert _np_reciprocal(_np_reciprocal(lossy.numpy()))[0] != lossy.numpy()[0]
    (tmp_path / "r").mkdir()
    write_model(tmp_path / "r" / "base", {"model.safetensors": {"x.weight_scale_2": lossy}},
                index=False)
    recipe = write_recipe(tmp_path / "r" / "exact.yaml",
                          "- select: {glob: '*.weight_scale_2'}\n  scale: {reciprocal: exact}\n")
    result = run("apply", recipe, tmp_path / "r" / "base", "-o", tmp_path / "r" / "out")
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("modelpatch: error")]
    assert len(lines) == 1 and "x.weight_scale_2" in lines[0]
    assert "reciprocal is not exact: 1 of 1 value(s)" in lines[0]
    assert not (tmp_path / "r" / "out").exists()


@pytest.mark.parametrize("value, why", [
    (0.0, "zero, inf or NaN"), (float("inf"), "zero, inf or NaN"), (float("nan"), "zero, inf"),
    (1e-39, "leaves the F32 range"), (3e38, "leaves the F32 range")])
def test_reciprocal_refuses_values_with_no_finite_normal_reciprocal(tmp_path, value, why):
    with pytest.raises(Exception, match=why) as info:
        _apply(tmp_path, {"s": _f32([1.0, value])},
               "- select: {glob: s}\n  scale: {reciprocal: nearest}\n")
    assert info.value.exit_code == 2 and "s" == info.value.tensor


def test_reciprocal_then_cast_applies_the_cast_rule_to_the_reciprocal(tmp_path):
    """The steps run in order: 1/x in x's dtype, then the exact-or-refused cast."""
    out = _apply(tmp_path, {"p": _f32([4.0, 0.5]), "q": _f32([3.0])},
                 "- select: {glob: p}\n  scale: {reciprocal: exact, cast: bf16, reshape: [2, 1]}\n")
    got = read_tensors(out)["p"]
    assert got.dtype == torch.bfloat16 and torch.equal(got.float().reshape(-1), _f32([0.25, 2.0]))
    with pytest.raises(Exception, match=r"cast to BF16 is not exact") as info:   # 1/3 in F32
        _apply(tmp_path, {}, "- select: {glob: q}\n  scale: {reciprocal: nearest, cast: bf16}\n",
               name="w")
    assert info.value.exit_code == 2 and info.value.tensor == "q"


# ------------------------------------------------------------------------------ cast, reshape

def test_cast_is_exact_or_refused(tmp_path):
    out = _apply(tmp_path, {"k": _f32([0.5, 1.5, -3.0]), "f": _f32([0.1])},
                 "- select: {glob: k}\n  scale: {cast: bf16, reshape: [3, 1]}\n")
    got = read_tensors(out)["k"]
    assert got.dtype == torch.bfloat16 and got.shape == (3, 1)
    assert torch.equal(got.float().reshape(-1), _f32([0.5, 1.5, -3.0]))
    with pytest.raises(Exception, match=r"cast to BF16 is not exact: 1 of 1") as info:
        _apply(tmp_path, {}, "- select: {glob: f}\n  scale: {cast: bf16}\n", name="w")
    assert info.value.exit_code == 2 and info.value.tensor == "f"


def test_reshape_keeps_the_bytes_and_checks_the_count(tmp_path):
    base = {"s": _f32([7.0]), "m": torch.arange(6, dtype=torch.bfloat16),
            "u": torch.zeros(2, dtype=torch.uint8)}
    out = _apply(tmp_path, base, "- select: {glob: s}\n  scale: {reshape: []}\n")
    got = read_tensors(out)["s"]
    assert got.shape == () and got.view(torch.int32) == _f32(7.0).view(torch.int32)
    with pytest.raises(PlanError, match=r"cannot reshape \[6\] to \[4\]"):
        _apply(tmp_path, {}, "- select: {glob: m}\n  scale: {reshape: [4]}\n", name="w")
    with pytest.raises(PlanError, match="scale math applies to F64, F32, F16, BF16"):
        _apply(tmp_path, {}, "- select: {glob: u}\n  scale: {reshape: [2, 1]}\n", name="x")


# ------------------------------------------------------------------------------ split, refuse

def test_split_makes_byte_identical_parts_and_removes_the_source(tmp_path):
    kv = _f32(0.0123)
    out = _apply(tmp_path, {"m.layers.0.self_attn.kv_scale": kv, "m.w": _f32([1.0])},
                 "- select: {glob: '*.kv_scale'}\n"
                 "  split: {pattern: 'kv_scale$', to: [k_scale, v_scale]}\n")
    got = read_tensors(out)
    assert sorted(got) == ["m.layers.0.self_attn.k_scale", "m.layers.0.self_attn.v_scale", "m.w"]
    for part in ("k_scale", "v_scale"):
        assert_bits_equal(got[f"m.layers.0.self_attn.{part}"], kv)
    with pytest.raises(PlanError, match="split collision: 'm.w' already exists"):
        _apply(tmp_path, {}, "- select: {glob: '*.kv_scale'}\n"
               "  split: {pattern: 'layers.*$', to: [w, x]}\n", name="c")


def test_refuse_is_a_guard_on_tensor_names(tmp_path):
    tensors = {"a.k_bias": _f32([1.0]), "a.weight": _f32([1.0])}
    with pytest.raises(GuardRefused, match=r"affine KV .*\(a\.k_bias\)"):
        _apply(tmp_path, tensors, "- select: {glob: '*.k_bias'}\n  refuse: affine KV\n"
               "- select: {glob: '*.weight'}\n  drop: true\n")
    out = _apply(tmp_path, {}, "- select: {glob: '*.v_bias'}\n  refuse: affine KV\n"
                 "- select: {glob: '*.weight'}\n  drop: true\n", name="ok")
    assert sorted(read_tensors(out)) == ["a.k_bias"]


@pytest.mark.parametrize("item, message", [
    ("split: {pattern: 'a$', to: [b]}", "at least two names"),
    ("split: {pattern: 'a$', to: [b, b]}", "same target twice"),
    ("split: {pattern: '(a', to: [b, c]}", "invalid regex"),
    ("scale: {}", "at least one of reciprocal, cast, reshape"),
    ("scale: {reciprocal: true}", "reciprocal"),
    ("scale: {reciprocal: exactly}", "did you mean 'exact'"),
    ("scale: {cast: fp8}", "cast:"),
    ("scale: {reshape: [-1]}", "reshape must be a list of sizes"),
    ("refuse: ''", "refuse"),
])
def test_bad_split_scale_refuse_items_are_recipe_errors_the_schema_also_rejects(item, message):
    jsonschema = pytest.importorskip("jsonschema")
    from ruamel.yaml import YAML

    text = HEAD + f"tensors:\n  - select: {{glob: a}}\n    {item}\n"
    with pytest.raises(RecipeError, match=message):
        load_recipe(text)
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()),
                                                format_checker=jsonschema.FormatChecker())
    assert list(validator.iter_errors(YAML(typ="safe", pure=True).load(text)))


@pytest.mark.parametrize("item", [
    "split: {pattern: 'kv_scale$', to: [k_scale, v_scale]}",
    "scale: {reciprocal: nearest, cast: F32, reshape: []}",
    "scale: {reciprocal: exact}",
    "scale: {cast: bfloat16, reshape: [1, 1]}",
    "refuse: no affine KV cache",
])
def test_split_scale_refuse_items_pass_the_loader_and_the_schema(item):
    jsonschema = pytest.importorskip("jsonschema")
    from ruamel.yaml import YAML

    text = HEAD + f"tensors:\n  - select: {{glob: a}}\n    {item}\n"
    load_recipe(text)
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    assert [e.message for e in validator.iter_errors(YAML(typ="safe", pure=True).load(text))] == []


# ------------------------------------------------------------------------------ kv-scale-names

def test_kv_scale_names_on_the_modelopt_fp8_export(tmp_path):
    base = FIXTURES / "llama-fp8"
    out = api.apply("kv-scale-names", base, out=tmp_path / "v").output
    before, after = read_tensors(base), read_tensors(out)
    moved = {n: n.replace(f".{n[-7]}_proj.", ".") for n in before
             if n.endswith(("k_proj.k_scale", "v_proj.v_scale"))}
    assert len(moved) == 4
    assert sorted(after) == sorted(moved.get(n, n) for n in before)
    for name, t in before.items():
        assert_bits_equal(after[moved.get(name, name)], t, name)
    with pytest.raises(NothingToChange):        # already in the spelling the engines read
        api.apply("kv-scale-names", out, out=tmp_path / "again")


@pytest.mark.parametrize("spelling", ["kv_scale", "qkv_proj.{k}_scale", "attn.{k}_scale"])
def test_kv_scale_names_normalises_every_other_spelling(tmp_path, spelling):
    tensors, want = {}, {}
    for layer in range(2):
        stem = f"model.layers.{layer}.self_attn."
        k, v = _f32(0.01 * (layer + 1)), _f32(0.02 * (layer + 1))
        if spelling == "kv_scale":
            tensors[stem + "kv_scale"] = k
            want.update({stem + "k_scale": k, stem + "v_scale": k})
        else:
            for which, value in (("k", k), ("v", v)):
                tensors[stem + spelling.format(k=which)] = value
                want[stem + f"{which}_scale"] = value
        tensors[stem + "o_proj.weight"] = torch.ones(2, 2, dtype=torch.bfloat16)
        want[stem + "o_proj.weight"] = tensors[stem + "o_proj.weight"]
    write_model(tmp_path / "base", {"model.safetensors": tensors}, index=False)
    got = read_tensors(api.apply("kv-scale-names", tmp_path / "base", out=tmp_path / "v").output)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert_bits_equal(got[name], t, name)


def test_kv_scale_names_refuses_two_spellings_of_one_scale(tmp_path):
    stem = "model.layers.0.self_attn."
    write_model(tmp_path / "base", {"model.safetensors": {
        stem + "k_proj.k_scale": _f32(0.5), stem + "k_scale": _f32(0.5)}}, index=False)
    result = run("apply", "kv-scale-names", tmp_path / "base", "-o", tmp_path / "v")
    assert result.exit_code == 2 and "rename collision" in result.output
    assert "model.layers.0.self_attn.k_proj.k_scale" in result.output


def _kv_model(root: Path, names: list[str], *, mla: bool) -> Path:
    """Scales under ``names`` (per layer, {k}/{v} filled in) and an MLA or GQA config."""
    tensors = {}
    for layer in range(2):
        for which in ("k", "v"):
            for name in names:
                tensors[f"model.layers.{layer}.self_attn." + name.format(k=which)] = \
                    _f32(0.01 * (layer + 1) + (which == "v") * 0.005)
    config = {"model_type": "deepseek_v3", "kv_lora_rank": 32, "q_lora_rank": 32} if mla else \
        {"model_type": "llama", "num_key_value_heads": 2}
    return write_model(root, {"model.safetensors": tensors}, config, index=False)


@pytest.mark.parametrize("spelling", ["{k}_scale", "{k}_proj.{k}_scale", "qkv_proj.{k}_scale",
                                      "attn.{k}_scale"])
@pytest.mark.parametrize("mla", [False, True])
def test_kv_scale_names_writes_a_spelling_vllm_loads(tmp_path, spelling, mla):
    """Every spelling comes out as one vLLM 0.33's maybe_remap_kv_scale_name loads into the
    attention's parameters: self_attn.k_scale on GQA models, self_attn.k_proj.k_scale on MLA
    ones, where self_attn.k_scale was dropped ("k_scale is not loaded")."""
    from vllm_kv_names import attention_scale_params, vllm_loads

    base = _kv_model(tmp_path / "base", [spelling], mla=mla)
    params = attention_scale_params(2, mla)
    try:
        out = api.apply("kv-scale-names", base, out=tmp_path / "v").output
    except NothingToChange:
        out = base                                  # already the spelling vLLM loads
    got = read_tensors(out)
    assert {vllm_loads(n, params) for n in got} == params, sorted(got)
    before = read_tensors(base)
    assert sorted(t.item() for t in got.values()) == sorted(t.item() for t in before.values())


def test_kv_scale_names_leaves_modelopts_mla_spelling_alone(tmp_path):
    """ModelOpt's DeepSeek-V3 export: k_proj.k_scale is what vLLM loads on MLA; nothing to do."""
    with pytest.raises(NothingToChange):
        api.apply("kv-scale-names", FIXTURES / "deepseek-v3-nvfp4", out=tmp_path / "v")
