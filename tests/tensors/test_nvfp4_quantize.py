"""NVFP4 weight quantization as a recipe op (``quantize: {scheme: nvfp4-compressed-tensors}``) and
the built-in ``nvfp4a16`` recipe, checked against the world:

* a tiny transformers Llama saved by ``save_pretrained`` (BF16), quantized by modelpatch and, from
  the same weights, by compressed-tensors 0.20.1 itself (the NVFP4A16 preset applied with
  ``apply_quantization_config``, its ``generate_gparam`` / ``calculate_qparams`` for the scales,
  packed by ``ModelCompressor.compress_model``, the config written by ``update_config``): every
  tensor equal bit for bit, the quantization_config equal key for key (``version`` aside);
* the variant loads in transformers, compressed and dequantized by compressed-tensors, with no
  missing, unexpected or mismatched keys, and its dequantization equals modelpatch's own
  ``to-bf16`` of it;
* bad input (a width not a multiple of 16, an integer weight, ModelOpt's W4A4 layout) is refused
  in one line naming the tensor or the recipe line; ``apply`` then ``verify`` through the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tensor_helpers import assert_bits_equal, listing, read_tensors, write_model, write_recipe

from patcher import api
from patcher.cli import main


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.q_proj.weight[3, 16:32] = 0          # an all-zero group (scale eps)
        layer.mlp.down_proj.weight[5, 7] = 1.5               # an outlier sets the global scale
        layer.mlp.up_proj.weight[9] = 0                      # an all-zero row
        layer.self_attn.k_proj.weight[1, 2] = 0.75           # k's magnitude sets q/k/v's scale
        model.model.layers[1].mlp.up_proj.weight[0, 0] = -0.5    # and up's sets gate/up's
    return model


#: the members of one vLLM fused layer, which llm-compressor gives one global scale
#: (update_fused_layer_weight_global_scales: the min of their weight_global_scale, that is the
#: scale of the largest magnitude): q/k/v of an attention module, gate/up of an MLP.
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _compressed_tensors_nvfp4a16(model, out: Path) -> Path:
    """``model`` quantized and saved by compressed-tensors with its NVFP4A16 preset."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
        quant_scheme,
    )
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = QuantizationScheme(targets=["Linear"], **quant_scheme.NVFP4A16)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=["lm_head"]))
    global_scales = {}
    for name, module in model.named_modules():
        if getattr(getattr(module, "quantization_scheme", None), "weights", None) is not None:
            w = module.weight.data.float()
            global_scales[name] = generate_gparam(w.amin(), w.amax())
    for parent in {n.rpartition(".")[0] for n in global_scales}:
        for members in _FUSED:
            names = [f"{parent}.{m}" for m in members]
            if all(n in global_scales for n in names):
                shared = torch.min(torch.cat([global_scales[n].reshape(1) for n in names]))
                global_scales.update((n, shared) for n in names)
    for name, module in model.named_modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None:
            continue
        w = module.weight.data.float()
        gs = global_scales[name]
        groups = w.unflatten(-1, (-1, args.group_size))
        scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=gs)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        module.weight_global_scale.data.copy_(gs.reshape(module.weight_global_scale.shape))
        assert not hasattr(module, "input_global_scale")     # weights only
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """The BF16 base (save_pretrained), modelpatch's nvfp4a16 variant, compressed-tensors' own."""
    root = tmp_path_factory.mktemp("nvfp4a16")
    model = _tiny_llama()
    model.save_pretrained(root / "base")
    theirs = _compressed_tensors_nvfp4a16(model, root / "theirs")
    ours = api.apply("nvfp4a16", root / "base", out=root / "ours").output
    return root / "base", ours, theirs


def _quantization_config(model: Path) -> dict:
    return json.loads((model / "config.json").read_text())["quantization_config"]


def test_tensors_equal_compressed_tensors_compressor_bit_for_bit(dirs):
    base, ours, theirs = dirs
    got, want = read_tensors(ours), read_tensors(theirs)
    assert sorted(got) == sorted(want)
    packed = [n for n in want if n.endswith(".weight_packed")]
    assert len(packed) == 2 * 7                       # q k v o gate up down, two layers
    assert not any(n.endswith(("input_global_scale", "input_scale")) for n in got)
    for name in sorted(want):
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        assert_bits_equal(got[name], want[name], name)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert_bits_equal(got[name], read_tensors(base)[name], name)
    assert got["model.layers.0.mlp.down_proj.weight_packed"].shape == (64, 80)
    assert got["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.float8_e4m3fn
    assert got["model.layers.0.mlp.down_proj.weight_global_scale"].shape == (1,)


def test_fused_layers_share_the_global_scale_of_their_largest_weight(dirs):
    """vLLM loads q/k/v into one qkv_proj and gate/up into one gate_up_proj with one global
    scale (the largest): each member's blocks are computed against the group's scale, 6 * 448
    over the group's largest magnitude, as llm-compressor writes it."""
    base, ours, _theirs = dirs
    got, weights = read_tensors(ours), read_tensors(base)
    for layer in (0, 1):
        for parent, members in (("self_attn", _FUSED[0]), ("mlp", _FUSED[1])):
            stems = [f"model.layers.{layer}.{parent}.{m}" for m in members]
            amax = max(float(weights[f"{s}.weight"].float().abs().max()) for s in stems)
            want = torch.tensor([6 * 448 / amax], dtype=torch.float64).float()
            for stem in stems:
                assert_bits_equal(got[f"{stem}.weight_global_scale"], want, stem)
    assert float(got["model.layers.0.self_attn.q_proj.weight_global_scale"]) == 6 * 448 / 0.75


def test_quantization_config_equals_compressed_tensors(dirs):
    _base, ours, theirs = dirs
    want = _quantization_config(theirs)
    want.pop("version")                       # compressed-tensors' own version; not ours to claim
    assert _quantization_config(ours) == want
    group = want["config_groups"]["group_0"]
    assert group["input_activations"] is None and want["format"] == "nvfp4-pack-quantized"
    assert want["ignore"] == ["lm_head"]


def test_variant_loads_in_transformers_and_decompresses_as_compressed_tensors_own(dirs, tmp_path):
    """transformers loads the variant compressed and, with ``dequantize=True``, decompressed by
    compressed-tensors: nothing missing, unexpected or mismatched, and every weight equal to
    compressed-tensors' decompression of its own checkpoint. modelpatch's ``to-bf16`` of the
    variant rounds the exact value once, where compressed-tensors rounds three times
    (docs/numerics.md): at most one BF16 ulp apart, and on most elements equal."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    base, ours, theirs = dirs
    model, info = AutoModelForCausalLM.from_pretrained(ours, dtype=torch.bfloat16,
                                                       output_loading_info=True)
    assert not any(info.values()), info
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(model.eval()(ids).logits).all()

    def decompressed(directory):
        deq, info = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.bfloat16, output_loading_info=True,
            quantization_config=CompressedTensorsConfig(dequantize=True))
        assert not any(info.values()), info
        return deq.state_dict()

    got, want = decompressed(ours), decompressed(theirs)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name

    dense = api.apply("to-bf16", ours, out=tmp_path / "bf16").output
    exact = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.bfloat16).state_dict()
    assert sorted(exact) == sorted(want)
    differ = total = 0
    for name in want:
        a, b = exact[name].view(torch.int16).int(), want[name].view(torch.int16).int()
        ulps = (a - b).abs()
        ulps = torch.where((a == 0) | (b == 0) | (a == -32768) | (b == -32768), 0, ulps)  # +-0
        assert int(ulps.max()) <= 1, name
        differ, total = differ + int((ulps > 0).sum()), total + a.numel()
    assert differ < total // 50, (differ, total)        # 1.0% with the fused scales

    original = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).state_dict()
    w, q = (t["model.layers.1.mlp.up_proj.weight"].float() for t in (original, exact))
    # it went through FP4: e2m1 keeps 1 mantissa bit, so a weight moves by up to 1/4 of its
    # binade (about 10% relative L2 for normal weights, measured); a wrong scale or nibble
    # order gives errors of order 1
    rel = float((q - w).norm() / w.norm())
    assert 0.01 < rel < 0.2, rel


def test_apply_and_verify_through_the_cli(dirs, tmp_path):
    base, ours, _theirs = dirs
    out = tmp_path / "cli"
    result = run("apply", "nvfp4a16", base, "-o", out)
    assert result.exit_code == 0, result.output
    assert run("verify", out).exit_code == 0
    assert _quantization_config(out) == _quantization_config(ours)
    for name, tensor in read_tensors(ours).items():
        assert_bits_equal(read_tensors(out)[name], tensor, name)


def test_nvfp4a16_refuses_a_quantized_model_and_unknown_weights(dirs, tmp_path):
    from patcher.errors import GuardRefused

    _base, ours, _theirs = dirs
    with pytest.raises(GuardRefused, match="declares a quantization already"):
        api.plan("nvfp4a16", ours)
    router = write_model(tmp_path / "moe", {"model.safetensors": {
        "model.layers.0.mlp.gate.weight": torch.randn(8, 64).bfloat16(),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64).bfloat16()}})
    with pytest.raises(GuardRefused, match=r"MoE routers.*model\.layers\.0\.mlp\.gate\.weight"):
        api.plan("nvfp4a16", router)


def test_nvfp4a16_refuses_a_gpt2_style_model(tmp_path):
    """GPT-2 keeps its projections as Conv1D weights stored [in, out] (transformers
    ``pytorch_utils.Conv1D``): NVFP4's groups of 16 would run along the output dimension."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from patcher.errors import GuardRefused

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                       n_positions=16))
    model.to(torch.bfloat16).save_pretrained(tmp_path / "gpt2")
    assert tuple(model.transformer.h[0].mlp.c_fc.weight.shape) == (32, 128)   # [in, out]
    with pytest.raises(GuardRefused, match="Conv1D"):
        api.plan("nvfp4a16", tmp_path / "gpt2")


# --- bad input: one line naming the tensor, exit 2, nothing written ---------------------------

QUANTIZE = """
    - select: {glob: "x.*.weight"}
      quantize: {scheme: nvfp4-compressed-tensors, layout: compressed-tensors}
    """


@pytest.mark.parametrize("tensor, code, says", [
    (torch.zeros(32, 40, dtype=torch.bfloat16), 1,
     "the recipe refuses this model: it cannot be quantized to nvfp4-compressed-tensors: has 40 "
     "columns, not a multiple of 16"),
    (torch.zeros(32, 32, dtype=torch.int32), 2,
     "only 2-D BF16, F16, F32 or F64 weights can be quantized (this is I32 [32, 32])"),
], ids=["width-40", "int32"])
def test_bad_weight_is_one_line_naming_it(tmp_path, tensor, code, says):
    """A width NVFP4 cannot group: the model does not fit the recipe (exit 1, as a guard, so a
    built-in recipe refuses it instead of blaming its own line); an integer weight: the
    selection is wrong (exit 2). Either way one line naming the tensor and the recipe line."""
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "x.a.weight": torch.zeros(32, 32, dtype=torch.bfloat16), "x.b.weight": tensor}})
    recipe = write_recipe(tmp_path / "r.yaml", QUANTIZE)
    before = listing(tmp_path)
    result = run("apply", recipe, model, "-o", tmp_path / "out")
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "r.yaml:" in lines[0] and "x.b.weight" in lines[0] and says in lines[0], lines[0]
    assert listing(tmp_path) == before


def test_modelopt_nvfp4_is_refused_in_one_line(tmp_path):
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "x.a.weight": torch.zeros(32, 32, dtype=torch.bfloat16)}})
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "x.*.weight"}
          quantize: {scheme: nvfp4-modelopt, layout: modelopt}
        """)
    result = run("apply", recipe, model, "-o", tmp_path / "out")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "r.yaml:" in lines[0] and "ModelOpt NVFP4 is W4A4" in lines[0], lines[0]
    assert "nvfp4-compressed-tensors" in lines[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_f16_and_f32_weights_quantize_as_their_float32_values(tmp_path, dtype):
    """The kernel computes in float32: an F16/F32 weight gives the bytes its BF16 twin gives
    (the values here, k/64 for |k| <= 128, are exact in all three), scales and codes alike."""
    gen = torch.Generator().manual_seed(3)
    w = (torch.randint(-128, 129, (48, 64), generator=gen) / 64).bfloat16()
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "x.a.weight": w, "x.b.weight": w.to(dtype)}})
    recipe = write_recipe(tmp_path / "r.yaml", QUANTIZE)
    # the op writes tensors only; a recipe without a quantization_config is warned about
    assert any("2 tensors are quantized" in w and "declares no quantization" in w
               for w in api.plan(recipe, model).warnings)
    got = read_tensors(api.apply(recipe, model, out=tmp_path / "out").output)
    for suffix in ("weight_packed", "weight_scale", "weight_global_scale"):
        assert_bits_equal(got[f"x.b.{suffix}"], got[f"x.a.{suffix}"], suffix)


def test_compressed_tensors_to_modelopt_refuses_weights_only_nvfp4a16(dirs):
    """ModelOpt's NVFP4 has an input scale per Linear; an NVFP4A16 checkpoint (compressed-
    tensors' own and modelpatch's) has none to convert: a guard refusal, not a pattern error."""
    from patcher.errors import GuardRefused

    _base, ours, theirs = dirs
    for model in (ours, theirs):
        with pytest.raises(GuardRefused, match="no input_global_scale.*NVFP4A16"):
            api.plan("compressed-tensors-to-modelopt", model)
