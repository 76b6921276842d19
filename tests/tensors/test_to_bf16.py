"""The built-in ``to-bf16`` recipe on checkpoints written by the producers' own code:

* compressed-tensors FP8 per tensor (preset FP8: static ``input_scale``), per channel
  (FP8_DYNAMIC: ``weight_scale`` [out, 1]) and NVFP4 (``weight_packed`` / ``weight_global_scale``
  / ``input_global_scale``): a transformers ``save_pretrained`` Llama quantized with
  compressed-tensors' ``apply_quantization_config``, its ``calculate_qparams``, compressed by
  ``ModelCompressor.compress_model`` and saved with ``update_config``;
* gpt-oss MXFP4 (``*_blocks`` / ``*_scales``): a transformers ``save_pretrained`` GptOss with its
  experts in the layout transformers' and vLLM's gpt-oss loaders read (no gpt-oss quantizer runs
  on a CPU: OpenAI shipped the weights quantized; transformers' quantizer needs triton kernels);
* DeepSeek FP8 block: a transformers DeepseekV3 quantized by modelpatch's ``fp8-block`` (DeepSeek's
  and transformers' FP8 quantizers need a GPU).

ModelOpt FP8/NVFP4 run on real ModelOpt exports in test_real_producers.py.

Each output: weights equal to an independent float64 reference rounded once (tests/
dequant_reference.py); no scale, activation scale or KV tensor left; no quantization declaration;
transformers loads it with no missing or unexpected keys; its logits match those of the
producer's own dequantization as transformers loads it (compressed-tensors' decompression,
transformers' MXFP4 dequantization).
"""

from __future__ import annotations

import json
from pathlib import Path

import dequant_reference as ref
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file
from tensor_helpers import assert_bits_equal, read_tensors, write_recipe

from patcher import api
from patcher.cli import main


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                         max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(config).to(torch.bfloat16)


def _compressed_tensors_llama(preset: str, out: Path) -> Path:
    """A tiny Llama quantized and saved by compressed-tensors with one of its preset schemes."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
        quant_scheme,
    )
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    model = _tiny_llama()
    scheme = QuantizationScheme(targets=["Linear"], **getattr(quant_scheme, preset))
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=["lm_head"]))
    for module in model.modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None:
            continue
        w, gs = module.weight.data.float(), None
        if args.strategy == "tensor":
            lo, hi = w.amin(), w.amax()
        elif args.strategy == "channel":
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        elif args.strategy == "block":
            bh, bw = args.block_structure
            padded = torch.nn.functional.pad(w, (0, -w.shape[1] % bw, 0, -w.shape[0] % bh))
            blocks = padded.reshape(padded.shape[0] // bh, bh, padded.shape[1] // bw, bw)
            lo, hi = blocks.amin((1, 3)), blocks.amax((1, 3))
        else:                                   # tensor_group (NVFP4): per 16, and global
            gs = generate_gparam(w.amin(), w.amax())
            groups = w.unflatten(-1, (-1, args.group_size))
            lo, hi = groups.amin(-1), groups.amax(-1)
        scale, _ = calculate_qparams(lo, hi, args, global_scale=gs)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if gs is not None:
            module.weight_global_scale.data.copy_(gs.reshape(module.weight_global_scale.shape))
        for name, value in (("input_scale", 0.02), ("input_global_scale", 672.0)):
            if hasattr(module, name):
                getattr(module, name).data.fill_(value)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    return out


def _load(directory: Path, **kwargs):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16,
                                                       output_loading_info=True, **kwargs)
    return model.eval(), {k: sorted(v) for k, v in info.items() if v}


def _load_clean(directory: Path):
    model, problems = _load(directory)
    assert not problems, problems
    assert getattr(model.config, "quantization_config", None) is None
    return model


def _logits(model) -> torch.Tensor:
    ids = torch.randint(0, model.config.vocab_size, (2, 12),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits.float()


def _to_bf16(base: Path, tmp_path: Path) -> Path:
    out = api.apply("to-bf16", base, out=tmp_path / "bf16").output
    assert not (out / "hf_quant_config.json").exists()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    return out


def _check_exact(got: dict, expected: dict[str, np.ndarray | torch.Tensor]) -> None:
    for name, values in expected.items():
        want = values if isinstance(values, torch.Tensor) else ref.rounded(values)
        assert_bits_equal(got[name], want, name)


@pytest.mark.parametrize("preset", ["FP8", "FP8_DYNAMIC", "FP8_BLOCK"])
def test_compressed_tensors_fp8_to_bf16(preset, tmp_path):
    """FP8: per-tensor scale [1] and a static input_scale; FP8_DYNAMIC: per-channel [out, 1];
    FP8_BLOCK: one scale per 128x128 block (one partial block in this tiny model)."""
    base = _compressed_tensors_llama(preset, tmp_path / "ct")
    stored = read_tensors(base)
    weights = [n for n, t in stored.items() if t.dtype == torch.float8_e4m3fn]
    assert len(weights) == 14
    scale_shape = {"FP8": lambda rows: [1], "FP8_DYNAMIC": lambda rows: [rows, 1],
                   "FP8_BLOCK": lambda rows: [1, 1]}[preset]
    for name in weights:
        assert list(stored[name[:-6] + "weight_scale"].shape) == scale_shape(stored[name].shape[0])
    assert any(n.endswith(".input_scale") for n in stored) == (preset == "FP8")

    out = _to_bf16(base, tmp_path)
    got = read_tensors(out)
    reference = ref.fp8_block if preset == "FP8_BLOCK" else ref.fp8
    _check_exact(got, {n: reference(stored[n], stored[n[:-6] + "weight_scale"])
                       for n in weights})
    assert not [n for n in got if "scale" in n]
    ours = _logits(_load_clean(out))
    theirs_model, _ = _load(base, quantization_config=_decompressing())
    theirs = _logits(theirs_model)
    # compressed-tensors multiplies in the scale's dtype (bfloat16), so each product is rounded
    # once, like ours: the weights, and so the logits, are the same.
    assert torch.equal(ours, theirs)


def _decompressing():
    from transformers.utils.quantization_config import CompressedTensorsConfig

    return CompressedTensorsConfig(run_compressed=False)


def test_compressed_tensors_nvfp4_to_bf16(tmp_path):
    base = _compressed_tensors_llama("NVFP4", tmp_path / "ct")
    stored = read_tensors(base)
    packed = [n for n in stored if n.endswith(".weight_packed")]
    assert len(packed) == 14 and any(n.endswith(".input_global_scale") for n in stored)

    out = _to_bf16(base, tmp_path)
    got = read_tensors(out)
    expected = {}
    for name in packed:
        stem = name[: -len(".weight_packed")]
        expected[f"{stem}.weight"] = ref.nvfp4_compressed_tensors(
            stored[name], stored[f"{stem}.weight_scale"], stored[f"{stem}.weight_global_scale"])
    _check_exact(got, expected)
    assert not [n for n in got if "scale" in n or "packed" in n]
    ours = _logits(_load_clean(out))
    theirs_model, _ = _load(base, quantization_config=_decompressing())
    theirs = _logits(theirs_model)
    # compressed-tensors rounds the group scale divided by the global scale to bfloat16 before
    # multiplying, so a weight may differ from the correctly rounded one by a bf16 ulp (2^-8
    # relative); through two layers the logits stay within a few percent of their scale.
    assert float((ours - theirs).abs().max()) <= 0.05 * float(theirs.abs().max())


# --- gpt-oss MXFP4 ---------------------------------------------------------------------------

def _gpt_oss_mxfp4(out: Path) -> Path:
    """A tiny GptOss saved by transformers, its experts replaced by MXFP4 blocks and scales as
    the gpt-oss checkpoints ship them, and the checkpoints' quantization_config."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    config = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                          num_local_experts=4, num_experts_per_tok=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, vocab_size=128,
                          max_position_embeddings=64, sliding_window=16,
                          layer_types=["sliding_attention", "full_attention"])
    GptOssForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tensors = read_tensors(out)
    gen = torch.Generator().manual_seed(1)
    for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
        experts, k, rows = tensors.pop(name).shape
        tensors[f"{name}_blocks"] = torch.randint(0, 256, (experts, rows, k // 32, 16),
                                                  dtype=torch.uint8, generator=gen)
        tensors[f"{name}_scales"] = torch.randint(118, 127, (experts, rows, k // 32),
                                                  dtype=torch.uint8, generator=gen)
    for shard in out.glob("*.safetensors"):
        shard.unlink()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    doc = json.loads((out / "config.json").read_text())
    doc["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    (out / "config.json").write_text(json.dumps(doc, indent=2))
    return out


def test_gpt_oss_mxfp4_to_bf16(tmp_path):
    from transformers import Mxfp4Config

    base = _gpt_oss_mxfp4(tmp_path / "gpt-oss")
    stored = read_tensors(base)
    blocks = [n for n in stored if n.endswith("_blocks")]
    assert len(blocks) == 4

    out = _to_bf16(base, tmp_path)
    got = read_tensors(out)
    _check_exact(got, {n[: -len("_blocks")]: ref.mxfp4_gpt_oss(
        stored[n], stored[n[: -len("_blocks")] + "_scales"]) for n in blocks})
    assert not [n for n in got if n.endswith(("_blocks", "_scales"))]
    ours = _load_clean(out)
    theirs, problems = _load(base, quantization_config=Mxfp4Config(dequantize=True))
    assert not problems, problems
    # transformers' own MXFP4 dequantization (ldexp in bfloat16) is exact too: same weights.
    for name, t in ours.state_dict().items():
        assert_bits_equal(t, theirs.state_dict()[name], name)
    assert torch.equal(_logits(ours), _logits(theirs))


# --- DeepSeek FP8 block ----------------------------------------------------------------------

def test_deepseek_fp8_block_to_bf16(tiny_bf16_dir, tmp_path):
    recipe = write_recipe(tmp_path / "q.yaml", r"""
        - select: {regex: '^model\.layers\.\d+\.(self_attn|mlp)\..*proj.*\.weight$', dtype: [BF16]}
          quantize: {scheme: fp8-block, layout: deepseek}
        """, name="to-fp8", extra="""
        config:
          config.json:
            - set: /quantization_config
              value: {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
                      weight_block_size: [128, 128]}
        """)
    base = api.apply(recipe, tiny_bf16_dir, out=tmp_path / "fp8").output
    stored = read_tensors(base)
    weights = [n for n, t in stored.items() if t.dtype == torch.float8_e4m3fn]
    assert len(weights) > 20

    out = _to_bf16(base, tmp_path)
    got = read_tensors(out)
    _check_exact(got, {n: ref.fp8_block(stored[n], stored[n + "_scale_inv"]) for n in weights})
    assert sorted(got) == sorted(read_tensors(tiny_bf16_dir))
    _load_clean(out)


# --- refusals --------------------------------------------------------------------------------

def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_to_bf16_refuses_unquantized_and_awq_models(tiny_bf16_dir, tmp_path):
    result = _cli("plan", "to-bf16", tiny_bf16_dir)
    assert result.exit_code == 1 and "declares no quantization" in result.output
    awq = _compressed_tensors_llama("FP8_DYNAMIC", tmp_path / "awq")
    (awq / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "NVFP4_AWQ", "kv_cache_quant_algo": None}}))
    result = _cli("plan", "to-bf16", awq)
    assert result.exit_code == 1 and "pre_quant_scale" in result.output


def test_to_bf16_names_a_weight_no_format_fits(tmp_path):
    base = _gpt_oss_mxfp4(tmp_path / "gpt-oss")
    tensors = read_tensors(base)
    name = "model.layers.0.mlp.experts.down_proj_scales"
    tensors[name] = tensors[name][:, :, :1].contiguous()
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    result = _cli("plan", "to-bf16", base)
    assert result.exit_code == 2, result.output
    assert "model.layers.0.mlp.experts.down_proj_blocks" in result.output
    assert "E8M0 block scale" in result.output and "expected" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mxfp4_kernel_exact_for_every_byte_and_scale(dtype, device):
    """Every byte (two e2m1 codes) under every finite E8M0 scale, against the float64 reference:
    255 x 512 values per dtype, subnormal, overflowing (inf) and signed-zero results included.
    Scale byte 255 is NaN (OCP MX v1.0)."""
    from patcher.tensors.quant.mxfp4 import dequantize_mxfp4_gpt_oss

    blocks = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16).repeat(1, 255, 1, 1)
    scales = torch.arange(255, dtype=torch.uint8).reshape(1, 255, 1).repeat(1, 1, 16)
    got = dequantize_mxfp4_gpt_oss(blocks, scales, dtype, device=device)
    assert got.shape == (1, 512, 255)
    assert_bits_equal(got, ref.rounded(ref.mxfp4_gpt_oss(blocks, scales), dtype))
    assert bool(torch.isinf(got).any()) and bool((got == 0).any())
    nan = dequantize_mxfp4_gpt_oss(blocks[:, :1], torch.full((1, 1, 16), 255, dtype=torch.uint8),
                                   device=device)
    assert bool(torch.isnan(nan).all())


def test_mxfp4_blocks_count_as_quantized_for_the_consistency_warning(tmp_path):
    """Removing gpt-oss' quantization_config while its experts stay MXFP4 is warned about."""
    base = _gpt_oss_mxfp4(tmp_path / "gpt-oss")
    recipe = write_recipe(tmp_path / "drop.yaml", """
        - select: {glob: "*.router.bias"}
          cast: fp32
        """, extra="""
        config:
          config.json:
            - drop: /quantization_config
        """)
    (warning,) = api.plan(recipe, base).warnings
    assert "4 tensors are quantized" in warning and "_blocks" in warning


def test_mxfp4_blocks_of_another_layout_are_named_with_the_expected_shape():
    from patcher.errors import CompanionError
    from patcher.tensors.schemes import find_scheme

    class T:
        def __init__(self, dtype, shape):
            self.dtype, self.shape = dtype, shape

    view = {"m.experts.down_proj_blocks": T("U8", (4, 64, 32)),
            "m.experts.down_proj_scales": T("U8", (4, 64))}
    with pytest.raises(CompanionError, match=r"mxfp4-gpt-oss: has shape \[4, 64, 32\], "
                                             r"expected \[experts, rows, blocks, 16\]"):
        find_scheme("m.experts.down_proj_blocks", view)
    view["m.experts.down_proj_blocks"] = T("U8", (4, 64, 2, 16))
    with pytest.raises(CompanionError, match=r"missing E8M0 block scale|has shape \[4, 64\]"):
        find_scheme("m.experts.down_proj_blocks", view)


def test_to_bf16_equals_nvfp4_to_bf16_on_the_multimodal_kimi_layout(kimi_dir, tmp_path):
    """The Kimi-K2.5-NVFP4 look-alike (4 shards, text_config, vision tower, MoE, FP8 KV):
    to-bf16 gives the same tensors as the dedicated recipe, and declares nothing anywhere."""
    out = _to_bf16(kimi_dir, tmp_path)
    ours = read_tensors(out)
    theirs = read_tensors(api.apply("nvfp4-to-bf16", kimi_dir, out=tmp_path / "n").output)
    assert sorted(ours) == sorted(theirs)
    for name, t in ours.items():
        assert_bits_equal(t, theirs[name], name)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config["text_config"]
    assert not [n for n in ours if n.endswith(("_scale", "_scale_2", "k_bias", "v_bias"))]
