"""The KV-cache recipes against every spelling of an FP8 KV-cache declaration, and no-op plans.

sm120-fp16-kv must leave no KV declaration in any spelling vLLM reads (examples/kv_spellings.py
builds one variant per spelling) and must keep the ``kv_cache_quant_algo`` key, as null, where
vLLM's ModelOpt configs require it. Null declares nothing: sm120-fp16-kv refuses an all-null model
and drop-kv-scales accepts one. ModelOpt's affine FP8 KV cache adds ``k_proj.k_bias`` /
``v_proj.v_bias``: drop-kv-scales and nvfp4-to-bf16 drop them, inspect lists them. An apply that
changes nothing fails (exit 1) unless allowed. The check against vLLM itself is
integration/vllm_config.py (not part of this suite: it needs vllm).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tensor_helpers import read_tensors, write_model

from patcher import api
from patcher.cli import main
from patcher.errors import GuardRefused, PlanError
from patcher.model.inspect_model import inspect_model
from patcher.model.model_dir import ModelDir

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples import kv_spellings  # noqa: E402
from examples.generate import quantize_nvfp4  # noqa: E402

KV_KEYS = ("kv_cache_scheme", "kv_cache_quant_algo")


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def kv_declarations(node, where: str = "") -> dict[str, object]:
    """Every KV key anywhere in a JSON document, by JSON pointer."""
    found = {}
    if isinstance(node, dict):
        for key, value in node.items():
            if key in KV_KEYS:
                found[f"{where}/{key}"] = value
            found.update(kv_declarations(value, f"{where}/{key}"))
    return found


def nested_quantization_objects(node, where: str = "") -> dict[str, dict]:
    """Every ModelOpt nested ``quantization`` object (the hf_quant_config shape) in a document."""
    found = {}
    if isinstance(node, dict):
        if isinstance(node.get("quantization"), dict) and "quant_algo" in node["quantization"]:
            found[f"{where}/quantization"] = node["quantization"]
        for key, value in node.items():
            found.update(nested_quantization_objects(value, f"{where}/{key}"))
    return found


def test_every_spelling_is_built_from_the_kimi_example(kimi_dir, tmp_path):
    assert kv_spellings.applicable(kimi_dir) == list(kv_spellings.SPELLINGS)
    for spelling in kv_spellings.SPELLINGS[1:]:
        variant = kv_spellings.make_variant(kimi_dir, tmp_path / spelling, spelling)
        declared = {f"{name}{ptr}": v for name in ("config.json", "hf_quant_config.json")
                    for ptr, v in kv_declarations(_json(variant / name)).items()
                    if v is not None}
        assert len(declared) == 1, (spelling, declared)
        [(where, value)] = declared.items()
        assert where.endswith(spelling.rsplit(".", 1)[-1]) and value in (
            "FP8", kv_spellings.FP8_SCHEME)
    assert _json(kimi_dir / "config.json")["quantization_config"]["kv_cache_scheme"] is not None


@pytest.mark.parametrize("spelling", kv_spellings.SPELLINGS)
def test_sm120_nulls_the_declaration_in_every_spelling(kimi_dir, tmp_path, spelling):
    variant = kv_spellings.make_variant(kimi_dir, tmp_path / "v", spelling)
    result = api.apply("sm120-fp16-kv", variant, out=tmp_path / "out")
    for name in ("config.json", "hf_quant_config.json"):
        before, after = _json(variant / name), _json(result.output / name)
        declared = {p: v for p, v in kv_declarations(after).items() if v is not None}
        assert declared == {}, f"{spelling}: {name} still declares {declared}"
        # nothing removed: the same keys, now null (vLLM's NVFP4/MXFP8 configs require
        # quantization.kv_cache_quant_algo; ModelOpt writes null itself)
        assert set(kv_declarations(after)) == set(kv_declarations(before))
        for where, inner in nested_quantization_objects(after).items():
            assert "kv_cache_quant_algo" in inner, f"{spelling}: {name}{where}"


def test_sm120_refuses_a_model_whose_declarations_are_all_null(kimi_dir, tmp_path):
    patched = api.apply("sm120-fp16-kv", kimi_dir, out=tmp_path / "once").output
    with pytest.raises(GuardRefused) as info:
        api.plan("sm120-fp16-kv", patched)
    assert info.value.exit_code == 1 and "declares no FP8 KV cache" in info.value.message


# --- drop-kv-scales, biases, inspect ---------------------------------------------------------

def _affine_kv_model(root: Path, *, kv_algo, nvfp4: bool = False) -> Path:
    """A one-layer ModelOpt export with an affine FP8 KV cache: k/v scales and k/v biases."""
    attn = "model.layers.0.self_attn."
    gen = torch.Generator().manual_seed(0)
    tensors = {
        attn + "o_proj.weight": torch.randn(32, 32, generator=gen).bfloat16(),
        attn + "k_proj.k_scale": torch.tensor(0.5), attn + "v_proj.v_scale": torch.tensor(0.25),
        attn + "k_proj.k_bias": torch.randn(8, generator=gen).bfloat16(),
        attn + "v_proj.v_bias": torch.randn(8, generator=gen).bfloat16(),
        "model.norm.weight": torch.ones(32, dtype=torch.bfloat16),
    }
    if nvfp4:
        packed, scale, scale_2 = quantize_nvfp4(torch.randn(32, 32, generator=gen))
        mlp = "model.layers.0.mlp.down_proj."
        tensors.update({mlp + "weight": packed, mlp + "weight_scale": scale,
                        mlp + "weight_scale_2": scale_2, mlp + "input_scale": torch.tensor(1.0)})
    hf_quant = {"producer": {"name": "modelopt", "version": "0.47.0"},
                "quantization": {"quant_algo": "NVFP4" if nvfp4 else "FP8",
                                 "kv_cache_quant_algo": kv_algo, "group_size": 16,
                                 "exclude_modules": ["lm_head"]}}
    return write_model(root, {"model.safetensors": tensors}, {"model_type": "llama"},
                       extra_files={"hf_quant_config.json": json.dumps(hf_quant)})


KV_TENSORS = {"model.layers.0.self_attn." + n for n in (
    "k_proj.k_scale", "v_proj.v_scale", "k_proj.k_bias", "v_proj.v_bias")}


def test_drop_kv_scales_accepts_null_and_drops_the_affine_kv_biases(tmp_path):
    model = _affine_kv_model(tmp_path / "m", kv_algo=None)
    out = api.apply("drop-kv-scales", model, out=tmp_path / "out").output
    assert set(read_tensors(model)) - set(read_tensors(out)) == KV_TENSORS
    assert not any(name.endswith(("_bias", "_scale")) for name in read_tensors(out))


@pytest.mark.parametrize("files", [
    {"hf_quant_config.json": {"quantization": {"kv_cache_quant_algo": "FP8"}}},
    {"hf_quant_config.json": {"kv_cache_quant_algo": "FP8"}},
    {"hf_quant_config.json": {"quantization": {"kv_cache_scheme": kv_spellings.FP8_SCHEME}}},
    {"config.json": {"quantization_config": {"kv_cache_scheme": kv_spellings.FP8_SCHEME}}},
    {"config.json": {"quantization_config": {"kv_cache_quant_algo": "FP8"}}},
    {"config.json": {"quantization_config": {"quantization": {"kv_cache_quant_algo": "FP8"}}}},
    {"config.json": {"text_config": {"quantization_config": {"kv_cache_quant_algo": "NVFP4"}}}},
])
def test_drop_kv_scales_refuses_any_live_declaration(files):
    from patcher.recipe.load import evaluate_guards, load_recipe, resolve_recipe

    recipe = load_recipe(resolve_recipe("drop-kv-scales"))
    [failure] = evaluate_guards(recipe, files.get)
    assert "still declares a quantized KV cache" in failure
    nulled = json.loads(json.dumps(files).replace('"FP8"', "null").replace('"NVFP4"', "null")
                        .replace(json.dumps(kv_spellings.FP8_SCHEME), "null"))
    assert evaluate_guards(recipe, nulled.get) == []


def test_nvfp4_to_bf16_drops_the_affine_kv_biases(tmp_path):
    model = _affine_kv_model(tmp_path / "m", kv_algo="FP8", nvfp4=True)
    out = api.apply("nvfp4-to-bf16", model, out=tmp_path / "out").output
    names = set(read_tensors(out))
    assert not names & KV_TENSORS and "model.layers.0.mlp.down_proj.weight" in names
    assert not (out / "hf_quant_config.json").exists()


def test_inspect_lists_scales_and_biases_as_kv_cache_tensors(tmp_path):
    report = inspect_model(ModelDir.open(_affine_kv_model(tmp_path / "m", kv_algo="FP8")))
    assert {(t["name"].rsplit(".", 2)[-2] + "." + t["name"].rsplit(".", 1)[-1], t["kind"])
            for t in report["kv_cache_tensors"]} == {
        ("k_proj.k_scale", "scale"), ("v_proj.v_scale", "scale"),
        ("k_proj.k_bias", "bias"), ("v_proj.v_bias", "bias")}
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "m")])
    assert "kv cache   4 (2 scales, 2 biases; BF16, F32), e.g. " in result.stdout


# --- silent no-ops ---------------------------------------------------------------------------

def _recipe(path: Path, ops: str) -> Path:
    path.write_text("modelpatch: 1\nname: typo\ndescription: d\nconfig:\n  config.json:\n" + ops)
    return path


def test_a_typo_in_a_drop_path_is_an_error_naming_the_recipe_line(kimi_dir, tmp_path):
    recipe = _recipe(tmp_path / "r.yaml", "    - drop: /kv_cache_schema\n")
    result = CliRunner().invoke(main, ["apply", str(recipe), str(kimi_dir), "-o",
                                       str(tmp_path / "out")])
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert result.stderr.strip() == (
        f"modelpatch: error: {recipe}:6:7: config.json: cannot drop /kv_cache_schema: it does "
        "not exist (add missing_ok: true to the operation if the path is optional)")
    with pytest.raises(PlanError):
        api.plan(recipe, kimi_dir)


def test_a_plan_that_changes_nothing_fails_unless_allowed(kimi_dir, tmp_path):
    from patcher.errors import NothingToChange

    recipe = _recipe(tmp_path / "r.yaml", "    - {drop: /kv_cache_schema, missing_ok: true}\n"
                                          "    - {set: /model_type, value: kimi_k25}\n")
    out, own = tmp_path / "out", kv_spellings.make_variant(kimi_dir, tmp_path / "own", "shipped")
    for model, argv in ((kimi_dir, ["apply", "-o", out]), (kimi_dir, ["plan"]),
                        (kimi_dir, ["apply", "--dry-run"]), (own, ["apply", "--in-place"])):
        result = CliRunner().invoke(main, [*argv[:1], str(recipe), str(model), *map(str, argv[1:])])
        assert result.exit_code == 1, argv
        assert result.stderr.strip().endswith(
            f"modelpatch: error: recipe 'typo' changes nothing in {model}: the variant would "
            "equal the base (--allow-noop accepts that)")
    assert not out.exists() and not (own / ".modelpatch").exists()
    with pytest.raises(NothingToChange):
        api.apply(recipe, kimi_dir, out=out)
    assert not out.exists()
    result = CliRunner().invoke(main, ["apply", str(recipe), str(kimi_dir), "-o", str(out),
                                       "--allow-noop", "-q"])
    assert result.exit_code == 0 and api.verify(out).ok
    assert CliRunner().invoke(main, ["plan", str(recipe), str(kimi_dir),
                                     "--allow-noop"]).exit_code == 0
    assert api.apply(recipe, kimi_dir, out=tmp_path / "lib", allow_noop=True).output.is_dir()
