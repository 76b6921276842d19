"""Guards of the tensor transforms: the text plan lists every touched tensor, fp8-block
dequantization takes its block size from the recipe or the config, the dequantize warning reads
the ignore/exclude lists, and casts/quantizations refuse to damage values silently."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tensor_helpers import (
    assert_bits_equal,
    listing,
    random_fp8,
    read_tensors,
    ref_nvfp4_modelopt,
    snapshot,
    write_model,
    write_recipe,
)

from patcher import api
from patcher.cli import main
from patcher.cli.render import render_tensor_changes
from patcher.errors import PlanError
from patcher.plan.changes import TensorConverted
from patcher.plan.quant_consistency import module_skipped, quantization_warnings
from patcher.tensors.quant import NonFiniteInput, quantize_fp8_block, quantize_fp8_per_tensor


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# --- 1. the text plan lists every touched tensor --------------------------------------------

def test_text_plan_lists_dropped_companions_with_layouts(deepseek_fp8_dir):
    text = run("plan", "fp8-block-to-bf16", deepseek_fp8_dir).stdout
    assert "tensors: 96 touched (48 converted, 48 dropped)" in text
    assert ("~ model.layers.0.mlp.down_proj.weight  F8_E4M3[320, 704] -> BF16[320, 704]  "
            "(dequantize:fp8-block)\n        - weight_scale_inv  F32[3, 6]\n") in text
    assert "... and 16 more (--json lists them all)" in text      # capped per shard
    data = api.plan("fp8-block-to-bf16", deepseek_fp8_dir).to_json()
    dropped = [c for c in data["changes"] if c["kind"] == "tensor_dropped"]
    assert len(dropped) == 48 and all(c["shard"].endswith(".safetensors") for c in dropped)


def test_text_plan_lists_explicit_drops(kimi_dir, tmp_path):
    variant = tmp_path / "k1"
    assert run("apply", "sm120-fp16-kv", kimi_dir, "-o", variant, "-q").exit_code == 0
    text = run("plan", "drop-kv-scales", variant).stdout
    assert "tensors: 6 touched (6 dropped)" in text
    assert "- language_model.model.layers.0.self_attn.k_proj.k_scale  F32[]  (drop)" in text


def test_text_plan_shows_renames_as_renames(tmp_path):
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "language_model.a.weight": torch.zeros(2, 3), "b.weight": torch.zeros(4)}})
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {regex: '^language_model\\.'}
          rename: {to: ''}
        """)
    text = run("plan", recipe, model).stdout
    assert "> language_model.a.weight -> a.weight  F32[2, 3]" in text
    assert "copy language_model" not in text
    task = api.plan(recipe, model).to_json()["files"]
    changed = [f for f in task if f["action"] == "rewrite-shard"][0]["tensors"]["changed"]
    assert changed == ["rename language_model.a.weight -> a.weight F32[2, 3]"]


def test_render_tensor_changes_groups_by_shard_and_caps():
    changes = [{"kind": "tensor_dropped", "tensor": f"t{i}", "shard": "s1.safetensors",
                "before": {"dtype": "F32", "shape": [1]}, "after": None} for i in range(25)]
    changes.append({"kind": "tensor_added", "tensor": "w.weight_scale_inv", "shard": "s2",
                    "companion_of": "w.weight", "reason": "quantize:fp8-block", "before": None,
                    "after": {"dtype": "F32", "shape": [1, 1]}})
    changes.append({"kind": "file_dropped", "file": "x"})
    lines = render_tensor_changes(changes)
    assert lines[0] == "tensors: 26 touched (25 dropped, 1 added)"
    assert "    ... and 5 more (--json lists them all)" in lines
    assert "    + w.weight_scale_inv  F32[1, 1]  (quantize:fp8-block of w.weight)" in lines
    assert render_tensor_changes([{"kind": "file_dropped", "file": "x"}]) == []


# --- 2. fp8-block block size ----------------------------------------------------------------

def _fp8_64_model(root: Path, config: dict | None = None) -> Path:
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(100, 70, generator=gen)
    q, scale = quantize_fp8_block(weight, (64, 64))             # scale [2, 2]
    return write_model(root, {"model.safetensors": {"l.weight": q, "l.weight_scale_inv": scale}},
                       config)


DEQUANT = """
    - select: {{glob: "*.weight", dtype: [F8_E4M3]}}
      dequantize: {{scheme: {scheme}, to: fp32{block}}}
    """


def _expected(model: Path) -> torch.Tensor:
    t = read_tensors(model)
    s = t["l.weight_scale_inv"].repeat_interleave(64, 0)[:100].repeat_interleave(64, 1)[:, :70]
    return t["l.weight"].float() * s


@pytest.mark.parametrize("scheme", ["fp8-block", "auto"])
def test_dequantize_block_from_the_recipe(tmp_path, scheme):
    model = _fp8_64_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r.yaml",
                          DEQUANT.format(scheme=scheme, block=", block: [64, 64]"))
    out = api.apply(recipe, model, out=tmp_path / "out").output
    got = read_tensors(out)
    assert set(got) == {"l.weight"}
    assert torch.equal(got["l.weight"], _expected(model))


@pytest.mark.parametrize("where", ["top", "text_config"])
def test_dequantize_block_from_the_config(tmp_path, where):
    qc = {"quant_method": "fp8", "weight_block_size": [64, 64]}
    config = ({"quantization_config": qc} if where == "top"
              else {"text_config": {"quantization_config": qc}})
    model = _fp8_64_model(tmp_path / "m", config)
    recipe = write_recipe(tmp_path / "r.yaml", DEQUANT.format(scheme="fp8-block", block=""))
    out = api.apply(recipe, model, out=tmp_path / "out").output
    assert torch.equal(read_tensors(out)["l.weight"], _expected(model))


def test_quantize_64_then_dequantize_round_trips(tmp_path):
    gen = torch.Generator().manual_seed(4)
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "l.weight": torch.randn(100, 70, generator=gen)}})
    quant = write_recipe(tmp_path / "q.yaml", """
        - select: {glob: "l.weight"}
          quantize: {scheme: fp8-block, layout: deepseek, block: [64, 64]}
        """)
    q = api.apply(quant, model, out=tmp_path / "q").output
    back = write_recipe(tmp_path / "d.yaml", DEQUANT.format(scheme="fp8-block",
                                                            block=", block: [64, 64]"))
    out = api.apply(back, q, out=tmp_path / "d").output
    original = read_tensors(model)["l.weight"]
    err = (read_tensors(out)["l.weight"] - original).abs().max()
    assert err <= original.abs().max() / 448 * 16       # within the e4m3 step at the block amax


def test_wrong_block_scale_names_expected_shape_and_the_block_option(tmp_path):
    model = _fp8_64_model(tmp_path / "m")                # 64x64 scales, no config: 128 assumed
    recipe = write_recipe(tmp_path / "r.yaml", DEQUANT.format(scheme="fp8-block", block=""))
    with pytest.raises(PlanError) as info:
        api.plan(recipe, model)
    msg = str(info.value)
    assert "has shape [2, 2], expected [1, 1] for 128x128 blocks (the default)" in msg
    assert "block: [BM, BN]" in msg and info.value.tensor == "l.weight"


def test_malformed_config_block_is_refused(tmp_path):
    model = _fp8_64_model(tmp_path / "m", {"quantization_config": {"weight_block_size": [64]}})
    recipe = write_recipe(tmp_path / "r.yaml", DEQUANT.format(scheme="fp8-block", block=""))
    with pytest.raises(PlanError, match="weight_block_size is \\[64\\], expected two positive"):
        api.plan(recipe, model)


# --- 3. dequantize warnings read the ignore/exclude lists -----------------------------------

def test_no_warning_when_the_recipe_excludes_the_dequantized_modules(kimi_dir, tmp_path):
    extra = """
        config:
          config.json:
            - op: add
              path: /quantization_config/ignore/-
              value: 'language_model.model.layers.1.mlp.experts.0*'
          hf_quant_config.json:
            - op: add
              path: /quantization/exclude_modules/-
              value: 'language_model.model.layers.1.mlp.experts.0.*'
        """
    tensors = """
        - select: {glob: "*.layers.1.mlp.experts.0.*.weight", dtype: [U8]}
          dequantize: {scheme: nvfp4-modelopt}
        """
    recipe = write_recipe(tmp_path / "r.yaml", tensors, extra=extra)
    assert api.plan(recipe, kimi_dir).warnings == ()
    only_one = write_recipe(tmp_path / "s.yaml", tensors,
                            extra=extra.split("          hf_quant_config")[0])
    warnings = api.plan(only_one, kimi_dir).warnings      # hf_quant_config.json still covers them
    assert any("3 tensors were dequantized while the config still declares NVFP4" in w
               for w in warnings), warnings


def test_module_skipped_patterns():
    assert module_skipped("model.layers.0.mlp.down_proj", ["model.layers.0.*"])
    assert module_skipped("lm_head", ["lm_head"])
    assert module_skipped("model.layers.3.mlp.gate", ["re:.*mlp\\.gate$"])
    assert not module_skipped("model.layers.3.mlp.gate_proj", ["re:.*mlp\\.gate$", "lm_head"])
    assert not module_skipped("model.layers.1.x", ["re:(", "model.layers.0.*"])


def test_compressed_tensors_ignore_regex_silences_the_warning():
    config = {"quantization_config": {"quant_method": "compressed-tensors",
                                      "ignore": ["lm_head", "re:.*layers\\.0\\..*"]}}
    converted = TensorConverted("model.layers.0.q.weight_packed",
                                "dequantize:nvfp4-compressed-tensors", "s.safetensors", {}, {},
                                "r:1:1", to="model.layers.0.q.weight")
    changes = [converted]
    dtypes = {"model.layers.1.q.weight_packed": "U8", "model.layers.1.q.weight_scale": "F8_E4M3"}
    assert quantization_warnings(config, None, dtypes, changes) == []
    changes[0] = replace(converted, tensor="model.layers.2.q.weight", to="model.layers.2.q.weight")
    assert "1 tensors were dequantized" in quantization_warnings(config, None, dtypes, changes)[0]


# --- 4. no silent numeric damage ------------------------------------------------------------

def _failing_apply(tmp_path, model: Path, recipe: Path) -> str:
    before = snapshot(model)
    parent = [p for p in listing(tmp_path) if not p.startswith("digest-cache")]
    out = tmp_path / "out"
    result = run("apply", recipe, model, "-o", out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelpatch: error: "), result.stderr
    left = [p for p in listing(tmp_path) if not p.startswith("digest-cache")]
    assert not out.exists() and left == parent and snapshot(model) == before   # no staging
    return lines[0]


def test_cast_that_overflows_fp16_is_refused(tmp_path):
    big = torch.tensor([1.0, 7e4, -1e6, float("nan"), 3.0])
    model = write_model(tmp_path / "m", {"model.safetensors": {"a.weight": big}})
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "a.weight"}
          cast: fp16
        """)
    line = _failing_apply(tmp_path, model, recipe)
    assert "tensor 'a.weight'" in line and "2 finite value(s) become inf" in line, line
    assert "max |x| = 1e+06" in line and "cast to BF16 or F32 instead" in line, line


def test_cast_keeps_nan_and_inf_of_the_source(tmp_path):
    src = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 65504.0])
    model = write_model(tmp_path / "m", {"model.safetensors": {"a.weight": src}})
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "a.weight"}
          cast: fp16
        """)
    out = api.apply(recipe, model, out=tmp_path / "out").output
    got = read_tensors(out)["a.weight"]
    assert torch.equal(got.view(torch.int16), src.half().view(torch.int16))


def test_dequantize_to_fp16_that_overflows_is_refused(tmp_path):
    gen = torch.Generator().manual_seed(5)
    weight = random_fp8((8, 8), gen)
    weight[0, 0] = 448.0
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "l.weight": weight, "l.weight_scale": torch.tensor(1000.0)}})
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "l.weight"}
          dequantize: {scheme: fp8-tensor, to: fp16}
        """)
    line = _failing_apply(tmp_path, model, recipe)
    assert "tensor 'l.weight'" in line and "dequantize to F16 would overflow" in line, line


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
@pytest.mark.parametrize("scheme", ["fp8-tensor", "fp8-block"])
def test_quantize_refuses_non_finite_weights(tmp_path, bad, scheme):
    w = torch.randn(130, 20, generator=torch.Generator().manual_seed(6))
    w[129, 3] = bad
    model = write_model(tmp_path / "m", {"model.safetensors": {"l.weight": w}})
    layout = "modelopt" if scheme == "fp8-tensor" else "deepseek"
    recipe = write_recipe(tmp_path / "r.yaml", f"""
        - select: {{glob: "l.weight"}}
          quantize: {{scheme: {scheme}, layout: {layout}}}
        """)
    line = _failing_apply(tmp_path, model, recipe)
    assert "tensor 'l.weight'" in line and "1 of 2600 are inf or NaN" in line, line


def _nvfp4_model(root: Path, scale_2: float) -> tuple[Path, dict[str, torch.Tensor]]:
    """A ModelOpt NVFP4 model of one Linear (the layout of docs/architecture.md section 1)."""
    gen = torch.Generator().manual_seed(11)
    tensors = {"l.weight": torch.randint(0, 256, (4, 16), dtype=torch.uint8, generator=gen),
               "l.weight_scale": torch.rand(4, 2, generator=gen).add(0.5).to(torch.float8_e4m3fn),
               "l.weight_scale_2": torch.tensor(scale_2),
               "l.input_scale": torch.tensor(1.0)}
    model = write_model(root, {"model.safetensors": tensors}, extra_files={
        "hf_quant_config.json": json.dumps({"quantization": {"quant_algo": "NVFP4"}})})
    return model, tensors


def test_nvfp4_dequantize_with_a_finite_scale_matches_the_reference(tmp_path):
    model, src = _nvfp4_model(tmp_path / "m", 0.25)
    out = api.apply("nvfp4-to-bf16", model, out=tmp_path / "out").output
    want = ref_nvfp4_modelopt(src["l.weight"], src["l.weight_scale"], src["l.weight_scale_2"],
                              torch.bfloat16)
    assert_bits_equal(read_tensors(out)["l.weight"], want, "l.weight")


@pytest.mark.parametrize("bad", [float("inf"), float("-inf")])
def test_nvfp4_dequantize_with_an_infinite_global_scale_is_refused(tmp_path, bad):
    model, _ = _nvfp4_model(tmp_path / "m", bad)
    line = _failing_apply(tmp_path, model, "nvfp4-to-bf16")
    assert "tensor 'l.weight'" in line and "'l.weight_scale_2' holds inf or NaN" in line, line


def test_quantize_kernels_raise_non_finite_input():
    w = torch.ones(4, 4)
    w[1, 1] = float("nan")
    with pytest.raises(NonFiniteInput, match="1 of 16"):
        quantize_fp8_per_tensor(w)
    with pytest.raises(NonFiniteInput):
        quantize_fp8_block(w, (2, 2))
    assert json.dumps(quantize_fp8_block(torch.ones(4, 4), (2, 2))[1].tolist())
