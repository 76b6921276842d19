"""Tensor transforms through the whole pipeline (plan, streamed shard rewrite, index, manifest),
applied with ``patcher.api`` and read back with safetensors.

* Dequantization equals the docs/architecture.md §1 formulas computed exactly and rounded once
  by the independent reference (tests/exact_reference.py), bit for bit, in bf16, fp16 and fp32:
  ModelOpt NVFP4 (the Kimi example), DeepSeek FP8 block (the DeepSeek example, partial edge
  blocks), FP8 per tensor and per channel (ModelOpt F32 scales).
* Data packed by compressed-tensors' own compressors dequantizes to exactly what
  compressed-tensors' own decompression returns.
* Companions in another shard than their weight are found and removed there; shards left empty
  are dropped; the index is regenerated; untouched shards are hardlinked; the base never changes.
* quantize -> dequantize stays within FP8 e4m3's rounding bound; a tiny transformers
  DeepseekV3ForCausalLM survives an FP8-block round trip with close logits.
* rename (collisions refused), drop, cast; the manifest's change log names every tensor touched
  with its dtype and shape before and after.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from tensor_helpers import (
    INDEX,
    OUT_DTYPES,
    assert_bits_equal,
    ct_fp8,
    nbytes,
    random_fp8,
    read_tensors,
    ref_fp8_block,
    ref_fp8_tensor,
    ref_nvfp4_modelopt,
    shard_files,
    shard_metadata,
    snapshot,
    tensor_shards,
    write_model,
    write_recipe,
)

from patcher import api
from patcher.cli import main
from patcher.errors import PlanError
from patcher.integrity.change_log import TENSOR_KINDS, grouped
from patcher.integrity.manifest import read_manifest
from patcher.plan.changes import changes_json

KV_SUFFIXES = ("k_proj.k_scale", "v_proj.v_scale", "self_attn.k_scale", "self_attn.v_scale")


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def check_output_model(out: Path, base: Path | None = None) -> dict[str, torch.Tensor]:
    """What every variant must satisfy: index == shards, total_size right, format pt, strict
    inspect and verify pass. Returns the output tensors."""
    tensors = read_tensors(out)
    if (out / INDEX).exists():
        index = json.loads((out / INDEX).read_text())
        assert index["weight_map"] == tensor_shards(out)
        assert index["metadata"]["total_size"] == sum(nbytes(t) for t in tensors.values())
        assert list(index["weight_map"]) == sorted(index["weight_map"])
    for shard in shard_files(out):
        assert shard_metadata(shard).get("format") == "pt", shard
    inspected = cli("inspect", out, "--json")
    assert inspected.exit_code == 0, inspected.output
    assert api.verify(out).ok
    return tensors


def cross_shard_companions(model: Path, suffix: str) -> list[str]:
    """Weights whose companion ``<stem><suffix>`` sits in another shard than the weight."""
    where = tensor_shards(model)
    out = []
    for name, shard in where.items():
        if name.endswith(".weight"):
            companion = name[: -len("weight")] + suffix
            if companion in where and where[companion] != shard:
                out.append(name)
    return out


# --- ModelOpt NVFP4 (Kimi example) -------------------------------------------------------------

@pytest.mark.parametrize("to", ["bf16", "fp16", "fp32"])
def test_nvfp4_modelopt_dequantized_bit_exact(kimi_dir, tmp_path, to):
    """The built-in recipe (bf16) and a custom one (fp16, fp32): every ModelOpt NVFP4 weight
    equals the docs/architecture.md §1 formula in float32, rounded once; scales found across
    shards."""
    assert cross_shard_companions(kimi_dir, "weight_scale"), "fixture lost its cross-shard case"
    before = snapshot(kimi_dir)
    if to == "bf16":
        recipe = "nvfp4-to-bf16"
    else:
        recipe = write_recipe(tmp_path / "r.yaml", f"""
            - select: {{glob: "*.weight", dtype: [U8]}}
              dequantize: {{scheme: nvfp4-modelopt, to: {to}}}
            """)
    out = api.apply(recipe, kimi_dir, out=tmp_path / "out").output
    base = read_tensors(kimi_dir)
    result = check_output_model(out)
    dtype = OUT_DTYPES[to]
    packed = [n for n, t in base.items() if t.dtype == torch.uint8 and n.endswith(".weight")]
    assert len(packed) == 48
    for name in packed:
        stem = name[: -len("weight")]
        expected = ref_nvfp4_modelopt(base[name], base[stem + "weight_scale"],
                                      base[stem + "weight_scale_2"], dtype)
        assert_bits_equal(result[name], expected, name)
        for gone in ("weight_scale", "weight_scale_2", "input_scale"):
            assert stem + gone not in result
    for name, tensor in result.items():          # everything else is byte-identical
        if name not in packed:
            assert_bits_equal(tensor, base[name], name)
    if to == "bf16":
        assert not [n for n in result if n.endswith(KV_SUFFIXES)]
        config = json.loads((out / "config.json").read_text())
        assert "quantization_config" not in config
        assert "quantization_config" not in config["text_config"]
        assert not (out / "hf_quant_config.json").exists()
    assert snapshot(kimi_dir) == before


# --- DeepSeek FP8 block ------------------------------------------------------------------------

@pytest.mark.parametrize("to", ["bf16", "fp16", "fp32"])
def test_fp8_block_dequantized_bit_exact(deepseek_fp8_dir, tmp_path, to):
    """fp8-block-to-bf16 (and custom fp16/fp32): W = fp8 * scale_inv per 128x128 block, partial
    edge blocks included (the example's dimensions are not multiples of 128)."""
    assert cross_shard_companions(deepseek_fp8_dir, "weight_scale_inv")
    before = snapshot(deepseek_fp8_dir)
    if to == "bf16":
        recipe = "fp8-block-to-bf16"
    else:
        recipe = write_recipe(tmp_path / "r.yaml", f"""
            - select: {{glob: "*.weight", dtype: [F8_E4M3]}}
              dequantize: {{scheme: fp8-block, to: {to}}}
            """)
    out = api.apply(recipe, deepseek_fp8_dir, out=tmp_path / "out").output
    base = read_tensors(deepseek_fp8_dir)
    result = check_output_model(out)
    fp8 = [n for n, t in base.items() if t.dtype == torch.float8_e4m3fn]
    assert fp8 and any(base[n].shape[0] % 128 and base[n].shape[1] % 128 for n in fp8)
    for name in fp8:
        expected = ref_fp8_block(base[name], base[name + "_scale_inv"], OUT_DTYPES[to])
        assert_bits_equal(result[name], expected, name)
        assert name + "_scale_inv" not in result
    assert set(result) == {n for n in base if not n.endswith("_scale_inv")}
    if to == "bf16":
        assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert snapshot(deepseek_fp8_dir) == before


# --- FP8 per tensor / per channel -------------------------------------------------------------

def fp8_tensor_model(root: Path, gen) -> Path:
    """ModelOpt FP8: F32 scalar scale (+ input_scale), per-channel [out] scale (FP8_PC_PT); the
    compressed-tensors layout: BF16 scale [1] and per channel [out, 1]. Some scales sit in
    another shard than their weight."""
    w = {n: random_fp8((96, 80), gen) for n in "abcd"}
    return write_model(root, {
        "model-00001-of-00002.safetensors": {
            "m.a.weight": w["a"], "m.a.weight_scale": torch.tensor(0.0123),
            "m.a.input_scale": torch.tensor(0.5),
            "m.b.weight": w["b"],
            "m.c.weight": w["c"], "m.c.weight_scale": torch.tensor([0.0371], dtype=torch.bfloat16),
            "m.norm.weight": torch.ones(80, dtype=torch.bfloat16),
        },
        "model-00002-of-00002.safetensors": {
            "m.b.weight_scale": torch.rand(96, generator=gen) * 0.01 + 1e-4,
            "m.d.weight": w["d"],
            "m.d.weight_scale": (torch.rand(96, 1, generator=gen) * 0.01).to(torch.bfloat16),
        },
    })


@pytest.mark.parametrize("to", ["bf16", "fp16", "fp32"])
def test_fp8_per_tensor_and_channel_dequantized_bit_exact(tmp_path, to):
    """F32 scales (ModelOpt) and BF16 scales (compressed-tensors): the exact product rounded
    once. compressed-tensors multiplies in the scale's dtype, fp8.to(bf16) * scale: in bf16 that
    is the same (the product of an e4m3 and a bf16 value is exact in float32); for fp16 and fp32
    its bf16 product is rounded twice or too early, and modelpatch does not copy that."""
    model = fp8_tensor_model(tmp_path / "m", torch.Generator().manual_seed(5))
    recipe = write_recipe(tmp_path / "r.yaml", f"""
        - select: {{glob: "*.weight", dtype: [F8_E4M3]}}
          dequantize: {{scheme: fp8-tensor, to: {to}}}
        """)
    out = api.apply(recipe, model, out=tmp_path / "out").output
    base, result = read_tensors(model), check_output_model(out)
    dtype = OUT_DTYPES[to]
    for stem in ("m.a.", "m.b."):
        expected = ref_fp8_tensor(base[stem + "weight"], base[stem + "weight_scale"], dtype)
        assert_bits_equal(result[stem + "weight"], expected, stem)
    for stem in ("m.c.", "m.d."):
        w, s = base[stem + "weight"], base[stem + "weight_scale"]
        assert_bits_equal(result[stem + "weight"], ref_fp8_tensor(w, s, dtype), stem)
        if to == "bf16":
            as_ct = w.to(torch.bfloat16) * (s.reshape(-1, 1) if s.numel() > 1 else s)
            assert_bits_equal(result[stem + "weight"], as_ct, stem)
    assert sorted(result) == ["m.a.weight", "m.b.weight", "m.c.weight", "m.d.weight",
                              "m.norm.weight"]


# --- compressed-tensors, packed by compressed-tensors -----------------------------------------

def _ct_nvfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import NVFP4
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = QuantizationScheme(targets=["Linear"], **NVFP4)
    gs = generate_gparam(w.amin(), w.amax())
    groups = w.float().unflatten(-1, (-1, 16))
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights,
                                 global_scale=gs)
    packed = NVFP4PackedCompressor.compress(
        {"weight": w, "weight_scale": scale, "weight_global_scale": gs}, scheme)
    theirs = NVFP4PackedCompressor.decompress(dict(packed), scheme)["weight"]
    return packed, theirs



def test_compressed_tensors_packed_data_equals_its_own_decompression(tmp_path):
    """NVFP4 (weight_packed / weight_scale / weight_global_scale, input_global_scale dropped)
    and FP8 per tensor, per channel and per 128x128 block, each compressed by compressed-tensors
    and dequantized by modelpatch with scheme auto: equal to compressed-tensors' decompression,
    bit for bit, in bf16 (what it decompresses to). For FP8 that holds always (its bf16 product
    is rounded once); for NVFP4 only where its three roundings happen to land on the correctly
    rounded value, which on this data is every element (test_producer_numerics.py counts the
    others)."""
    pytest.importorskip("compressed_tensors")
    gen = torch.Generator().manual_seed(11)

    def weight(rows, cols):
        w = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen)
        return w.to(torch.bfloat16)

    shards: dict[str, dict[str, torch.Tensor]] = {"model-00001-of-00002.safetensors": {},
                                                  "model-00002-of-00002.safetensors": {}}
    expected = {}
    for i, shape in enumerate([(192, 256), (300, 160)]):
        packed, theirs = _ct_nvfp4(weight(*shape))
        stem = f"model.layers.{i}.mlp.experts.0.down_proj."
        shards["model-00001-of-00002.safetensors"][stem + "weight_packed"] = packed["weight_packed"]
        # the scales in the other shard
        shards["model-00002-of-00002.safetensors"].update({
            stem + "weight_scale": packed["weight_scale"],
            stem + "weight_global_scale": packed["weight_global_scale"],
            stem + "input_global_scale": torch.tensor([1234.0])})
        expected[stem + "weight"] = theirs
    for preset, shape in [("FP8", (200, 144)), ("FP8_DYNAMIC", (96, 64)),
                          ("FP8_BLOCK", (300, 200))]:
        packed, theirs = ct_fp8(preset, weight(*shape))
        stem = f"model.layers.0.self_attn.{preset.lower()}_proj."
        shards["model-00001-of-00002.safetensors"][stem + "weight"] = packed["weight"]
        shards["model-00002-of-00002.safetensors"][stem + "weight_scale"] = packed["weight_scale"]
        if preset == "FP8":
            shards["model-00001-of-00002.safetensors"][stem + "input_scale"] = \
                torch.tensor([0.02], dtype=torch.bfloat16)
        expected[stem + "weight"] = theirs
    model = write_model(tmp_path / "ct", shards)
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {regex: '\\.(weight|weight_packed)$', dtype: [U8, F8_E4M3]}
          dequantize: {scheme: auto, to: bf16}
        """)
    out = api.apply(recipe, model, out=tmp_path / "out").output
    result = check_output_model(out)
    assert sorted(result) == sorted(expected)
    for name, theirs in expected.items():
        assert theirs.dtype == torch.bfloat16
        assert_bits_equal(result[name], theirs, name)
    changes = read_manifest(out).changes
    schemes = {c["how"] for c in changes
               if c["kind"] == "tensor_group" and c["change"] == "tensor_converted"}
    assert sorted(schemes) == ["dequantize:fp8-block", "dequantize:fp8-tensor",
                                             "dequantize:nvfp4-compressed-tensors"]


# --- companions across shards, index, links, empty shards -------------------------------------

def test_cross_shard_companions_removed_index_regenerated_untouched_shards_linked(tmp_path):
    gen = torch.Generator().manual_seed(3)
    w1, w2 = random_fp8((200, 130), gen), random_fp8((64, 256), gen)
    s1, s2 = torch.rand(2, 2, generator=gen) * 0.01, torch.rand(1, 2, generator=gen) * 0.01
    model = write_model(tmp_path / "m", {
        "model-00001-of-00004.safetensors": {"l.0.q.weight": w1, "l.0.norm.weight":
                                             torch.ones(130, dtype=torch.bfloat16)},
        "model-00002-of-00004.safetensors": {"l.0.q.weight_scale_inv": s1},   # only a scale
        "model-00003-of-00004.safetensors": {"l.1.k.weight_scale_inv": s2, "l.1.k.weight": w2,
                                             "l.1.bias": torch.zeros(3)},
        "model-00004-of-00004.safetensors": {"embed.weight": torch.randn(50, 8, generator=gen)},
    }, config={"model_type": "x", "quantization_config": {"quant_method": "fp8",
                                                          "weight_block_size": [128, 128]}})
    before = snapshot(model)
    the_plan = api.plan("fp8-block-to-bf16", model)
    actions = {f.path: f.action.value for f in the_plan.files}
    assert actions["model-00001-of-00004.safetensors"] == "rewrite-shard"
    assert actions["model-00002-of-00004.safetensors"] == "drop"
    assert actions["model-00003-of-00004.safetensors"] == "rewrite-shard"
    assert actions["model-00004-of-00004.safetensors"] == "link"
    assert actions[INDEX] == "write-json"
    out = api.apply("fp8-block-to-bf16", model, out=tmp_path / "out").output
    result = check_output_model(out)
    assert not (out / "model-00002-of-00004.safetensors").exists()
    assert tensor_shards(out) == {"l.0.q.weight": "model-00001-of-00004.safetensors",
                                  "l.0.norm.weight": "model-00001-of-00004.safetensors",
                                  "l.1.k.weight": "model-00003-of-00004.safetensors",
                                  "l.1.bias": "model-00003-of-00004.safetensors",
                                  "embed.weight": "model-00004-of-00004.safetensors"}
    assert_bits_equal(result["l.0.q.weight"], ref_fp8_block(w1, s1, torch.bfloat16))
    assert_bits_equal(result["l.1.k.weight"], ref_fp8_block(w2, s2, torch.bfloat16))
    linked = out / "model-00004-of-00004.safetensors"
    assert linked.stat().st_ino == (model / linked.name).stat().st_ino
    for name in ("model-00001-of-00004.safetensors", "model-00003-of-00004.safetensors"):
        assert (out / name).stat().st_ino != (model / name).stat().st_ino
        assert (out / name).stat().st_mode & 0o777 == 0o444
    assert snapshot(model) == before
    # the plan says what each rewritten shard costs
    summary = {f.path: f.shard_task.summary() for f in the_plan.files if f.shard_task}
    assert summary["model-00003-of-00004.safetensors"]["bytes_computed"] == 64 * 256 * 2
    assert summary["model-00003-of-00004.safetensors"]["bytes_copied"] == 12


def test_single_file_model_without_index(tmp_path):
    gen = torch.Generator().manual_seed(4)
    w = random_fp8((130, 129), gen)
    s = torch.rand(2, 2, generator=gen)
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "a.weight": w, "a.weight_scale_inv": s, "b": torch.arange(5.0)}}, index=False)
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "*.weight"}
          dequantize: {scheme: fp8-block, to: fp32}
        """)
    out = api.apply(recipe, model, out=tmp_path / "out").output
    assert not (out / INDEX).exists()
    result = check_output_model(out)
    assert sorted(result) == ["a.weight", "b"]
    assert_bits_equal(result["a.weight"], ref_fp8_block(w, s, torch.float32))


# --- quantize, then dequantize ----------------------------------------------------------------

def _e4m3_bound(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round to nearest e4m3 of w / scale: 3 mantissa bits, so a normal value is off by at most
    2^-4 of itself; a subnormal (spacing 2^-9) by at most 2^-10; times the scale. A tiny slack
    covers the float32 rounding of the division and of the product."""
    return torch.maximum(w.abs() * 2.0 ** -4, scale * 2.0 ** -10) * (1 + 2 ** -10)


def test_quantize_then_dequantize_within_fp8_bound(tmp_path):
    gen = torch.Generator().manual_seed(9)
    a = torch.randn(300, 200, generator=gen) * torch.rand(300, 1, generator=gen)
    a[5, 7] = 40.0                                               # an outlier sets one block
    b = (torch.randn(96, 64, generator=gen) * 0.02).to(torch.bfloat16)
    c = torch.randn(64, 48, generator=gen).to(torch.float16)
    model = write_model(tmp_path / "m", {
        "model-00001-of-00002.safetensors": {"x.a.weight": a, "x.norm.weight": torch.ones(8)},
        "model-00002-of-00002.safetensors": {"x.b.weight": b, "x.c.weight": c}})
    quantize = write_recipe(tmp_path / "q.yaml", """
        - select: {glob: "x.a.weight"}
          quantize: {scheme: fp8-block, layout: deepseek}
        - select: {glob: "x.b.weight"}
          quantize: {scheme: fp8-tensor, layout: modelopt}
        - select: {glob: "x.c.weight"}
          quantize: {scheme: fp8-tensor, layout: compressed-tensors}
        """, name="q")
    plan = api.plan(quantize, model)
    assert any("quantized" in w and "declares no quantization" in w for w in plan.warnings)
    mid = api.apply(quantize, model, out=tmp_path / "fp8").output
    q = check_output_model(mid)
    layout = {n: (str(t.dtype), tuple(t.shape)) for n, t in q.items()}
    assert layout == {
        "x.a.weight": ("torch.float8_e4m3fn", (300, 200)),
        "x.a.weight_scale_inv": ("torch.float32", (3, 2)),
        "x.b.weight": ("torch.float8_e4m3fn", (96, 64)),
        "x.b.weight_scale": ("torch.float32", ()),
        "x.c.weight": ("torch.float8_e4m3fn", (64, 48)),
        "x.c.weight_scale": ("torch.float32", (1,)),
        "x.norm.weight": ("torch.float32", (8,)),
    }
    # the scales are amax / 448, per block and per tensor
    blocks = torch.nn.functional.pad(a.abs(), (0, 56, 0, 84)).reshape(3, 128, 2, 128)
    assert torch.equal(q["x.a.weight_scale_inv"], blocks.amax(dim=(1, 3)) / 448)
    assert torch.equal(q["x.b.weight_scale"], b.float().abs().amax() / 448)
    dequantize = write_recipe(tmp_path / "d.yaml", """
        - select: {glob: "*.weight", dtype: [F8_E4M3]}
          dequantize: {scheme: auto, to: fp32}
        """, name="d")
    back = check_output_model(api.apply(dequantize, mid, out=tmp_path / "back").output)
    assert sorted(back) == ["x.a.weight", "x.b.weight", "x.c.weight", "x.norm.weight"]
    scale_a = q["x.a.weight_scale_inv"].repeat_interleave(128, 0).repeat_interleave(128, 1)
    for name, original, scale in [("x.a.weight", a, scale_a[:300, :200]),
                                  ("x.b.weight", b.float(), q["x.b.weight_scale"]),
                                  ("x.c.weight", c.float(), q["x.c.weight_scale"])]:
        err = (back[name] - original).abs()
        assert bool((err <= _e4m3_bound(original, scale)).all()), name
        assert float(err.max()) > 0                      # it did go through FP8


def test_tiny_deepseek_v3_fp8_block_round_trip_keeps_logits(tiny_bf16_dir, tmp_path):
    """A transformers DeepseekV3ForCausalLM (bf16) -> modelpatch FP8 block -> modelpatch bf16 ->
    from_pretrained. Only the Linear weights of the decoder layers are quantized (attention
    projections, dense MLP, experts, shared experts), not embeddings, norms, the router or
    lm_head.

    Tolerance: the relative L2 error of the logits must stay below 0.08 and their cosine
    similarity above 0.995. Why: e4m3 keeps 3 mantissa bits, so each weight moves by at most
    2^-4 (6.25%) of itself and by about 2.5% RMS (uniform rounding error over a binade,
    relative to the value); each layer's output error is then about that RMS, and three layers
    of random, independently rounded weights add in quadrature to about 4-5% (measured: 3.6%,
    cosine 0.9993).
    The bf16 round-trip itself adds at most 2^-9 per weight. A broken dequantization (a wrong
    block, a divide instead of a multiply, a transposed scale) gives errors of order 1.
    """
    from transformers import DeepseekV3ForCausalLM

    linear = (r"^model\.layers\.\d+\.(self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj"
              r"|o_proj)|mlp\.(experts\.\d+\.|shared_experts\.)?(gate_proj|up_proj|down_proj))"
              r"\.weight$")
    quantize = write_recipe(tmp_path / "q.yaml", f"""
        - select: {{regex: '{linear}', dtype: [BF16]}}
          quantize: {{scheme: fp8-block, layout: deepseek}}
        """, name="to-fp8", extra="""
        config:
          config.json:
            - set: /quantization_config
              value: {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
                      weight_block_size: [128, 128]}
        """)
    fp8_dir = api.apply(quantize, tiny_bf16_dir, out=tmp_path / "fp8").output
    fp8 = read_tensors(fp8_dir)
    quantized = [n for n, t in fp8.items() if t.dtype == torch.float8_e4m3fn]
    assert len(quantized) == 3 + 5 * 3 + 2 * (4 * 3 + 3)
    assert all(n + "_scale_inv" in fp8 for n in quantized)
    for kept in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert fp8[kept].dtype == torch.bfloat16
    assert api.plan("fp8-block-to-bf16", fp8_dir).warnings == ()
    back_dir = api.apply("fp8-block-to-bf16", fp8_dir, out=tmp_path / "bf16").output
    assert "quantization_config" not in json.loads((back_dir / "config.json").read_text())
    original = read_tensors(tiny_bf16_dir)
    back = check_output_model(back_dir)
    assert sorted(back) == sorted(original)
    assert all(back[n].dtype == torch.bfloat16 for n in back if n != "lm_head.weight")

    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    logits = []
    for directory in (tiny_bf16_dir, back_dir):
        model = DeepseekV3ForCausalLM.from_pretrained(directory, dtype=torch.float32)
        model.eval()
        with torch.no_grad():
            logits.append(model(ids).logits.float())
    ref, got = logits
    rel = float((got - ref).norm() / ref.norm())
    cos = float(torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0))
    print(f"logits: relative L2 error {rel:.4f}, cosine {cos:.6f}")
    assert 0 < rel < 0.08, rel
    assert cos > 0.995, cos


# --- rename, drop, cast and the change log ----------------------------------------------------

def simple_model(root: Path) -> Path:
    gen = torch.Generator().manual_seed(2)
    return write_model(root, {
        "model-00001-of-00002.safetensors": {
            "language_model.model.layers.0.w.weight": torch.randn(8, 8, generator=gen).bfloat16(),
            "language_model.model.layers.0.self_attn.k_proj.k_scale": torch.tensor(0.5),
            "vision_tower.p.weight": torch.randn(4, 4, generator=gen).bfloat16(),
        },
        "model-00002-of-00002.safetensors": {
            "language_model.model.layers.1.w.weight": torch.randn(8, 8, generator=gen).bfloat16(),
            "language_model.lm_head.weight": torch.randn(16, 8, generator=gen).bfloat16(),
            "language_model.model.norm.weight": torch.randn(8, generator=gen),
        }})


def test_rename_drop_cast_and_change_log(tmp_path):
    model = simple_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {regex: '^language_model\\.model\\.'}
          rename: {to: 'model.'}
        - select: {glob: "language_model.lm_head.weight"}
          rename: {pattern: '^language_model\\.', to: ''}
        - select: {glob: "*.k_scale"}
          drop: true
        - select: {glob: "model.layers.*.weight", dtype: [BF16]}
          cast: fp16
        - select: {glob: "model.norm.weight"}
          cast: bf16
        - select: {glob: "vision_tower.*"}
          cast: fp32
        """)
    out = api.apply(recipe, model, out=tmp_path / "out").output
    base, result = read_tensors(model), check_output_model(out)
    assert sorted(result) == ["lm_head.weight", "model.layers.0.w.weight",
                              "model.layers.1.w.weight", "model.norm.weight",
                              "vision_tower.p.weight"]
    assert_bits_equal(result["lm_head.weight"], base["language_model.lm_head.weight"])
    for i in (0, 1):
        src = base[f"language_model.model.layers.{i}.w.weight"]
        assert_bits_equal(result[f"model.layers.{i}.w.weight"], src.to(torch.float16))
    assert_bits_equal(result["model.norm.weight"],
                      base["language_model.model.norm.weight"].to(torch.bfloat16))
    assert_bits_equal(result["vision_tower.p.weight"], base["vision_tower.p.weight"].float())
    # renamed tensors stay in their shard
    assert tensor_shards(out)["lm_head.weight"] == "model-00002-of-00002.safetensors"
    assert_change_log_covers(model, out, recipe)


def assert_change_log_covers(base_dir: Path, out: Path, recipe) -> list[dict]:
    """Every tensor that disappeared, appeared or changed dtype/shape/bytes has an entry in the
    plan's change log stating its dtype and shape before and after, and the manifest records
    that log per rule (each group's count and names digest from those entries)."""
    logged = changes_json(api.plan(recipe, base_dir).changes)
    assert read_manifest(out).changes == grouped(logged)
    groups = [c for c in read_manifest(out).changes if c["kind"] == "tensor_group"]
    assert sum(g["count"] for g in groups) == sum(c["kind"] in TENSOR_KINDS for c in logged)
    changes = [c for c in logged if c["kind"].startswith("tensor_")]
    before = {}
    for shard in shard_files(base_dir):
        with safe_open(shard, "pt") as f:
            for n in f.keys():
                s = f.get_slice(n)
                before[n] = (s.get_dtype(), list(s.get_shape()))
    after = {}
    for shard in shard_files(out):
        with safe_open(shard, "pt") as f:
            for n in f.keys():
                s = f.get_slice(n)
                after[n] = (s.get_dtype(), list(s.get_shape()))
    logged_before: dict[str, tuple] = {}
    logged_after: dict[str, tuple] = {}
    for c in changes:
        if c["before"] is not None:
            logged_before[c["tensor"]] = (c["before"]["dtype"], c["before"]["shape"])
        if c["after"] is not None:
            logged_after[c.get("to", c["tensor"])] = (c["after"]["dtype"], c["after"]["shape"])
    gone = set(before) - set(after)
    new = set(after) - set(before)
    changed = {n for n in set(before) & set(after) if before[n] != after[n]}
    for name in gone | changed:
        assert logged_before.get(name) == before[name], name
    for name in new | changed:
        assert logged_after.get(name) == after[name], name
    return changes


def test_change_log_of_nvfp4_to_bf16_lists_every_tensor(kimi_dir, tmp_path):
    out = api.apply("nvfp4-to-bf16", kimi_dir, out=tmp_path / "out").output
    changes = assert_change_log_covers(kimi_dir, out, "nvfp4-to-bf16")
    companions = [c for c in changes if c["kind"] == "tensor_dropped" and c.get("companion_of")]
    assert len(companions) == 48 * 3              # weight_scale, weight_scale_2, input_scale
    converted = [c for c in changes if c["kind"] == "tensor_converted"]
    assert len(converted) == 48
    assert converted[0]["before"]["dtype"] == "U8" and converted[0]["after"]["dtype"] == "BF16"
    assert converted[0]["after"]["shape"][1] == 2 * converted[0]["before"]["shape"][1]
    for c in changes:
        assert "nvfp4-to-bf16.yaml:" in c["recipe_line"]


def test_change_log_of_quantize_lists_added_scales(tmp_path):
    model = simple_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "*.w.weight"}
          quantize: {scheme: fp8-block, layout: deepseek}
        """)
    out = api.apply(recipe, model, out=tmp_path / "out").output
    changes = assert_change_log_covers(model, out, recipe)
    added = [c for c in changes if c["kind"] == "tensor_added"]
    assert sorted(c["tensor"] for c in added) == [
        "language_model.model.layers.0.w.weight_scale_inv",
        "language_model.model.layers.1.w.weight_scale_inv"]
    assert added[0]["before"] is None and added[0]["after"] == {"dtype": "F32", "shape": [1, 1]}


def test_rename_collisions_are_refused(tmp_path):
    model = simple_model(tmp_path / "m")
    with_existing = write_recipe(tmp_path / "a.yaml", """
        - select: {glob: "language_model.model.layers.0.w.weight"}
          rename: {pattern: 'layers\\.0', to: 'layers.1'}
        """)
    with pytest.raises(PlanError, match="rename collision") as info:
        api.plan(with_existing, model)
    assert info.value.tensor == "language_model.model.layers.0.w.weight"
    two_into_one = write_recipe(tmp_path / "b.yaml", """
        - select: {regex: 'layers\\.\\d+\\.w\\.weight$'}
          rename: {pattern: 'layers\\.\\d+', to: 'layers.9'}
        """)
    with pytest.raises(PlanError, match="both become"):
        api.plan(two_into_one, model)
    swap = write_recipe(tmp_path / "c.yaml", """
        - select: {regex: 'layers\\.[01]\\.w\\.weight$'}
          rename: {pattern: 'layers\\.(\\d)', to: 'layers.X\\1'}
        """)
    assert api.plan(swap, model).changed                # a rename into free names is fine
    empty = write_recipe(tmp_path / "d.yaml", """
        - select: {glob: "vision_tower.p.weight"}
          rename: {pattern: '.*', to: ''}
        """)
    with pytest.raises(PlanError, match="empty"):
        api.plan(empty, model)


def test_dequantize_output_name_collision_is_refused(tmp_path):
    """compressed-tensors NVFP4 writes ``weight_packed``; its output ``weight`` must not overwrite
    a tensor that already has that name."""
    gen = torch.Generator().manual_seed(1)
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "a.weight_packed": torch.randint(0, 256, (4, 8), dtype=torch.uint8, generator=gen),
        "a.weight_scale": torch.ones(4, 1).to(torch.float8_e4m3fn),
        "a.weight_global_scale": torch.tensor([1.0]),
        "a.weight": torch.zeros(4, 16)}}, index=False)
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "*.weight_packed"}
          dequantize: {scheme: nvfp4-compressed-tensors}
        """)
    with pytest.raises(PlanError, match="already exists") as info:
        api.plan(recipe, model)
    assert info.value.tensor == "a.weight_packed"


def test_plan_lists_every_tensor_with_dtype_shape_and_bytes(deepseek_fp8_dir):
    data = api.plan("fp8-block-to-bf16", deepseek_fp8_dir).to_json()
    rewritten = [f for f in data["files"] if f["action"] == "rewrite-shard"]
    assert rewritten
    for f in rewritten:
        t = f["tensors"]
        assert t["bytes_copied"] + t["bytes_computed"] + 8 <= f["size_after"]
        for line in t["changed"]:
            assert "F8_E4M3[" in line and "BF16[" in line
    converted = [c for c in data["changes"] if c["kind"] == "tensor_converted"]
    assert len(converted) == sum(len(f["tensors"]["changed"]) for f in rewritten)


def test_quantization_warnings_when_config_and_tensors_disagree(kimi_dir, tmp_path):
    assert api.plan("nvfp4-to-bf16", kimi_dir).warnings == ()
    all_but_config = write_recipe(tmp_path / "a.yaml", """
        - select: {glob: "*.weight", dtype: [U8]}
          dequantize: {scheme: nvfp4-modelopt}
        """)
    warnings = api.plan(all_but_config, kimi_dir).warnings
    assert any("still declares NVFP4 quantization but no tensor is quantized" in w
               for w in warnings), warnings
    some = write_recipe(tmp_path / "b.yaml", """
        - select: {glob: "*.layers.1.mlp.experts.0.*.weight", dtype: [U8]}
          dequantize: {scheme: nvfp4-modelopt}
        """)
    warnings = api.plan(some, kimi_dir).warnings
    assert any("3 tensors were dequantized while the config still declares NVFP4" in w
               for w in warnings), warnings
