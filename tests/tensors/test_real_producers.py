"""The built-in recipes on real NVIDIA ModelOpt 0.47 exports (tests/fixtures/modelopt, made by
integration/make_modelopt_exports.py with ModelOpt's own mtq.quantize + export_hf_checkpoint).

* ``to-bf16`` gives, on each export, weights equal to an independent float64 reference rounded
  once to bfloat16 (tests/dequant_reference.py), every quantization-only tensor gone (scales,
  input_scale, KV scales, affine-KV biases), no quantization declaration left, and a model that
  transformers loads with no missing or unexpected keys and whose logits equal those of the
  reference weights.
* ``nvfp4-to-bf16`` agrees with ``to-bf16`` on the NVFP4 exports.
* ``sm120-fp16-kv`` then ``drop-kv-scales`` leave no FP8 KV declaration and no KV tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dequant_reference as ref
import pytest
import torch
from safetensors.torch import save_file
from tensor_helpers import assert_bits_equal, read_tensors

from patcher import api

FIXTURES = Path(__file__).parent.parent / "fixtures" / "modelopt"
EXPORTS = ("llama-fp8", "llama-nvfp4", "llama-nvfp4-affine-kv", "deepseek-v3-nvfp4")
NVFP4_EXPORTS = EXPORTS[1:]
QUANT_ONLY = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale", "k_bias",
              "v_bias")


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _reference(base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The bf16 model the export stands for, from the float64 reference: every quantized weight
    dequantized, every quantization-only tensor left out, everything else as stored."""
    out = {}
    for name, t in base.items():
        if name.rsplit(".", 1)[-1] in QUANT_ONLY:
            continue
        stem = name[: -len(".weight")]
        if t.dtype == torch.float8_e4m3fn:
            values = ref.fp8(t, base[f"{stem}.weight_scale"])
        elif t.dtype == torch.uint8:
            values = ref.nvfp4_modelopt(t, base[f"{stem}.weight_scale"],
                                        base[f"{stem}.weight_scale_2"])
        else:
            out[name] = t
            continue
        out[name] = ref.rounded(values)
    return out


def _load(directory: Path):
    """transformers' model of ``directory`` (bf16), asserting a clean load."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16,
                                                       output_loading_info=True)
    problems = {k: sorted(v) for k, v in info.items() if v}
    assert not problems, problems
    assert getattr(model.config, "quantization_config", None) is None
    return model.eval()


def _logits(model) -> torch.Tensor:
    ids = torch.randint(0, model.config.vocab_size, (2, 12),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("export", EXPORTS)
def test_to_bf16_on_modelopt_export_is_exact_and_loads_cleanly(export, tmp_path):
    base_dir = FIXTURES / export
    out = api.apply("to-bf16", base_dir, out=tmp_path / "bf16").output
    assert not (out / "hf_quant_config.json").exists()
    assert "quantization_config" not in json.loads((out / "config.json").read_text())

    base, got = read_tensors(base_dir), read_tensors(out)
    expected = _reference(base)
    assert sorted(got) == sorted(expected)
    quantized = [n for n, t in base.items()
                 if n.endswith(".weight") and t.dtype in (torch.float8_e4m3fn, torch.uint8)]
    assert len(quantized) >= 14
    for name in quantized:
        assert_bits_equal(got[name], expected[name], name)

    model = _load(out)
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    shutil.copy(out / "config.json", ref_dir / "config.json")
    save_file({k: v.contiguous() for k, v in expected.items()}, ref_dir / "model.safetensors",
              metadata={"format": "pt"})
    assert torch.equal(_logits(model), _logits(_load(ref_dir)))


@pytest.mark.parametrize("export", NVFP4_EXPORTS)
def test_nvfp4_to_bf16_on_modelopt_export_equals_to_bf16(export, tmp_path):
    ours = read_tensors(api.apply("to-bf16", FIXTURES / export, out=tmp_path / "a").output)
    out = api.apply("nvfp4-to-bf16", FIXTURES / export, out=tmp_path / "b").output
    theirs = read_tensors(out)
    assert sorted(theirs) == sorted(ours)
    for name, t in ours.items():
        assert_bits_equal(theirs[name], t, name)
    _load(out)


def _declares_fp8_kv(directory: Path) -> list[str]:
    """Every spelling of an FP8 KV-cache declaration still set (not null) in ``directory``."""
    found = []
    config = json.loads((directory / "config.json").read_text())
    for where, scope in (("", config), ("text_config.", config.get("text_config") or {})):
        qc = scope.get("quantization_config") or {}
        for key in ("kv_cache_scheme", "kv_cache_quant_algo"):
            if qc.get(key) is not None:
                found.append(f"config.json {where}quantization_config.{key}")
    hf_quant = directory / "hf_quant_config.json"
    if hf_quant.exists():
        doc = json.loads(hf_quant.read_text())
        for where, scope in (("quantization.", doc.get("quantization") or {}), ("", doc)):
            if scope.get("kv_cache_quant_algo") is not None:
                found.append(f"hf_quant_config.json {where}kv_cache_quant_algo")
    return found


@pytest.mark.parametrize("export", EXPORTS)
def test_sm120_fp16_kv_then_drop_kv_scales_on_modelopt_export(export, tmp_path):
    base_dir = FIXTURES / export
    assert _declares_fp8_kv(base_dir)
    fp16_kv = api.apply("sm120-fp16-kv", base_dir, out=tmp_path / "kv").output
    assert _declares_fp8_kv(fp16_kv) == []
    assert read_tensors(fp16_kv).keys() == read_tensors(base_dir).keys()
    out = api.apply("drop-kv-scales", fp16_kv, out=tmp_path / "dropped").output
    left = [n for n in read_tensors(out) if n.endswith(("k_scale", "v_scale", "k_bias", "v_bias"))]
    assert left == []
