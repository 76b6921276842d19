"""ModelOpt NVFP4 <-> compressed-tensors NVFP4, on the real ModelOpt 0.47
exports in tests/fixtures/modelopt.

References, none of them modelpatch: compressed-tensors' own ModelOpt converter
(`convert_checkpoint` + `ModelOptNvfp4Converter`) for every tensor and the quantization_config;
its own `NVFP4PackedCompressor.decompress` against the exact ModelOpt dequantization
(tests/dequant_reference.py, integer rounding); numpy's float32 division for which scales a
round trip can restore; transformers for the load.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dequant_reference as ref
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tensor_helpers import assert_bits_equal, read_tensors

from patcher import api
from patcher.errors import GuardRefused

FIXTURES = Path(__file__).parent.parent / "fixtures" / "modelopt"
EXPORTS = ("llama-nvfp4", "deepseek-v3-nvfp4")
KV = (".k_scale", ".v_scale")


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _converter_output(base: Path, out: Path, with_kv: bool) -> Path:
    """compressed-tensors' own conversion of ``base`` (FP8 KV scheme as ModelOpt declares, or
    none)."""
    from compressed_tensors.entrypoints.convert.convert_checkpoint import convert_checkpoint
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter,
    )
    from compressed_tensors.quantization import QuantizationArgs

    hf = _json(base / "hf_quant_config.json")["quantization"]
    kv = QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False,
                          symmetric=True) if with_kv else None
    convert_checkpoint(base, out, ModelOptNvfp4Converter(
        ignore=hf["exclude_modules"], targets=["Linear"], kv_cache_scheme=kv),
        device="cpu", max_workers=1)
    return out


def _without_kv_scales(base: Path, out: Path) -> Path:
    """``base`` less its KV-cache scales: compressed-tensors' converter refuses MLA's
    (`self_attn.k_proj.k_scale` on an attention with no k_proj: "orphan qparams")."""
    shutil.copytree(base, out)
    kept = {n: t for n, t in read_tensors(base).items() if not n.endswith(KV)}
    (out / "model.safetensors").unlink()
    save_file(kept, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _ours_for(name: str) -> str:
    """Our name of a tensor the converter writes: KV scales on self_attn (compressed-tensors'
    layout), everything else the same."""
    for s in KV:
        proj = f".{s[1]}_proj{s}"
        if name.endswith(proj):
            return name[: -len(proj)] + s
    return name


def _quant_config(config: dict):
    from compressed_tensors.quantization import QuantizationConfig

    qc = dict(config["quantization_config"])
    qc.pop("version", None)
    return QuantizationConfig.model_validate(qc).model_dump()


@pytest.mark.parametrize("export", EXPORTS)
def test_modelopt_to_compressed_tensors_is_compressed_tensors_own_conversion(export, tmp_path):
    """Every tensor equals the converter's bit for bit (scalars as [1], KV scales on self_attn
    in float32 where the converter rounds them to bfloat16); the quantization_config parses to
    the converter's; compressed-tensors decompresses every weight to the exact ModelOpt value."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import NVFP4

    base = FIXTURES / export
    out = api.apply("modelopt-to-compressed-tensors", base, out=tmp_path / "ct").output
    mla = export.startswith("deepseek")
    source = _without_kv_scales(base, tmp_path / "no-kv") if mla else base
    theirs_dir = _converter_output(source, tmp_path / "converter", with_kv=not mla)
    ours, theirs = read_tensors(out), read_tensors(theirs_dir)
    assert sorted(n for n in ours if not (mla and n.endswith(KV))) == sorted(
        _ours_for(n) for n in theirs)
    for name, t in theirs.items():
        mine = ours[_ours_for(name)]
        if name.endswith(KV):          # theirs: bfloat16 []; ours: the float32 value, [1]
            assert (mine.dtype, mine.shape) == (torch.float32, (1,))
            assert_bits_equal(mine.reshape(()).to(torch.bfloat16), t, name)
        elif t.dim() == 0:             # global scales: theirs [], ours [1]
            assert mine.shape == (1,), name
            assert_bits_equal(mine.reshape(()), t, name)
        else:
            assert_bits_equal(mine, t, name)
    mine, converted = (_quant_config(_json(d / "config.json")) for d in (out, theirs_dir))
    if mla:         # converted without KV scales, so without a kv_cache_scheme
        assert mine.pop("kv_cache_scheme")["num_bits"] == 8
        assert converted.pop("kv_cache_scheme") is None
        assert sorted(n for n in ours if n.endswith(KV)) == [     # the spelling vLLM loads
            f"model.layers.{i}.self_attn.{k}_proj.{k}_scale" for i in (0, 1) for k in "kv"]
    assert mine == converted

    original = read_tensors(base)
    scheme = QuantizationScheme(targets=["Linear"], **NVFP4)
    weights = [n[: -len(".weight_packed")] for n in ours if n.endswith(".weight_packed")]
    assert len(weights) >= 14
    for stem in weights:
        packed = {k: ours[f"{stem}.{k}"] for k in
                  ("weight_packed", "weight_scale", "weight_global_scale")}
        got = NVFP4PackedCompressor.decompress(packed, scheme)["weight"]
        assert_bits_equal(got, _exact_modelopt(original, stem), stem)


def _exact_modelopt(tensors: dict, stem: str) -> torch.Tensor:
    """ModelOpt's W = e2m1 * weight_scale * weight_scale_2, exact, rounded once to bfloat16;
    code 8 as -0.0, the zero compressed-tensors' e2m1 table gives it (ModelOpt's gives +0.0)."""
    values = ref.e2m1_values(tensors[f"{stem}.weight"], negative_zero=True)
    scale = np.repeat(tensors[f"{stem}.weight_scale"].double().numpy(), 16, axis=-1)
    return ref.rounded(values * scale * float(tensors[f"{stem}.weight_scale_2"].double()))


def _f32_reciprocal(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / x.astype(np.float32)       # IEEE division, correctly rounded


def _no_kv_cache(tmp_path: Path) -> Path:
    """The llama NVFP4 export as ModelOpt writes it without a quantized KV cache: no KV scales,
    no kv_cache_scheme in config.json, kv_cache_quant_algo null."""
    out = _without_kv_scales(FIXTURES / "llama-nvfp4", tmp_path / "no-kv")
    cfg = _json(out / "config.json")
    del cfg["quantization_config"]["kv_cache_scheme"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    hf = _json(out / "hf_quant_config.json")
    hf["quantization"]["kv_cache_quant_algo"] = None
    (out / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))
    return out


@pytest.mark.parametrize("export", EXPORTS + ("llama-nvfp4-no-kv",))
def test_round_trip_restores_every_tensor_but_the_scales_no_reciprocal_restores(export,
                                                                                tmp_path):
    """ModelOpt -> compressed-tensors -> ModelOpt: every tensor byte-identical, except the
    scales x for which 1/(1/x) != x in float32 (numpy's division says which), each one ulp
    off; config.json back to ModelOpt's form (less `producer`); hf_quant_config.json dropped
    on the way (it described ModelOpt's tensors) and not rebuilt."""
    base = _no_kv_cache(tmp_path) if export.endswith("no-kv") else FIXTURES / export
    ct = api.apply("modelopt-to-compressed-tensors", base, out=tmp_path / "ct").output
    assert ("kv_cache_scheme" in _json(ct / "config.json")["quantization_config"]) == (
        not export.endswith("no-kv"))
    back = api.apply("compressed-tensors-to-modelopt", ct, out=tmp_path / "back").output
    before, after = read_tensors(base), read_tensors(back)
    assert sorted(after) == sorted(before)
    lost = 0
    for name, t in before.items():
        if t.dim() == 0 and t.dtype == torch.float32 and not name.endswith(KV):
            x = t.numpy().reshape(1)
            if _f32_reciprocal(_f32_reciprocal(x))[0] != x[0]:
                lost += 1
                assert after[name].shape == ()
                ulps = int(after[name].view(torch.int32)) - int(t.view(torch.int32))
                assert abs(ulps) == 1, name
                continue
        assert_bits_equal(after[name], t, name)
    assert lost >= 1            # the fixture exercises it (13 of 14 weight_scale_2 in llama)
    cfg_before, cfg_after = _json(base / "config.json"), _json(back / "config.json")
    qc = dict(cfg_before.pop("quantization_config"))
    qc.pop("producer")
    assert cfg_after.pop("quantization_config") == qc
    assert cfg_after == cfg_before
    assert (back / "generation_config.json").read_bytes() == \
        (base / "generation_config.json").read_bytes()
    assert not (ct / "hf_quant_config.json").exists()       # it described ModelOpt's tensors
    assert not (back / "hf_quant_config.json").exists()


def test_compressed_tensors_variant_loads_in_transformers(tmp_path):
    """transformers 5.25 loads the converted model compressed (NVFP4 weights, fake-quantized
    activations): nothing missing or mismatched, only the KV-cache scales unexpected (its
    attention takes `cache`, and compressed-tensors 0.20.1 registers KV scales only on an
    attention whose forward takes `past_key_value(s)`), and nothing at all without a quantized
    KV cache; and dequantized (dense bf16): every
    weight and the logits equal to_bf16's exact dequantization of the ModelOpt export."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    base = FIXTURES / "llama-nvfp4"
    ct = api.apply("modelopt-to-compressed-tensors", base, out=tmp_path / "ct").output
    dense = api.apply("to-bf16", base, out=tmp_path / "bf16").output
    model, info = AutoModelForCausalLM.from_pretrained(ct, dtype=torch.bfloat16,
                                                       output_loading_info=True)
    kv = {n for n in read_tensors(ct) if n.endswith(KV)}
    assert len(kv) == 4
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert set(info["unexpected_keys"]) == kv
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(model.eval()(ids).logits).all()
    no_kv = api.apply("modelopt-to-compressed-tensors", _no_kv_cache(tmp_path),
                      out=tmp_path / "ct-no-kv").output
    _, info = AutoModelForCausalLM.from_pretrained(no_kv, dtype=torch.bfloat16,
                                                   output_loading_info=True)
    assert not any(info.values()), info         # without KV scales: a clean load

    deq, info = AutoModelForCausalLM.from_pretrained(
        ct, dtype=torch.bfloat16, output_loading_info=True,
        quantization_config=CompressedTensorsConfig(dequantize=True))
    assert not info["missing_keys"] and not info["mismatched_keys"]
    ref_model = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.bfloat16)
    got, want = deq.state_dict(), ref_model.state_dict()
    assert sorted(got) == sorted(want)
    for name in want:       # equal values (code 8 is -0.0 there, +0.0 in to-bf16's output)
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    with torch.no_grad():
        assert torch.equal(deq.eval()(ids).logits, ref_model.eval()(ids).logits)


def _edit_config(model: Path, edit) -> None:
    cfg = _json(model / "config.json")
    edit(cfg)
    path = model / "config.json"
    path.chmod(0o644)
    path.write_text(json.dumps(cfg, indent=2))


def test_conversion_guards_refuse_models_they_do_not_fit(tmp_path):
    with pytest.raises(GuardRefused, match="not a ModelOpt NVFP4 checkpoint"):
        api.apply("modelopt-to-compressed-tensors", FIXTURES / "llama-fp8", out=tmp_path / "a")
    with pytest.raises(GuardRefused, match=r"affine FP8 KV cache .*k_bias"):
        api.apply("modelopt-to-compressed-tensors", FIXTURES / "llama-nvfp4-affine-kv",
                  out=tmp_path / "b")
    groups32 = tmp_path / "groups32"
    shutil.copytree(FIXTURES / "llama-nvfp4", groups32)
    hf = _json(groups32 / "hf_quant_config.json")
    hf["quantization"]["group_size"] = 32
    (groups32 / "hf_quant_config.json").write_text(json.dumps(hf))
    with pytest.raises(GuardRefused, match="NVFP4 groups of 16 only"):
        api.apply("modelopt-to-compressed-tensors", groups32, out=tmp_path / "g")
    with pytest.raises(GuardRefused, match="not a compressed-tensors checkpoint"):
        api.apply("compressed-tensors-to-modelopt", FIXTURES / "llama-nvfp4", out=tmp_path / "c")
    ct = api.apply("modelopt-to-compressed-tensors", FIXTURES / "llama-nvfp4",
                   out=tmp_path / "ct").output
    copy = tmp_path / "ct-attn-head"
    shutil.copytree(ct, copy, ignore=shutil.ignore_patterns(".modelpatch*"))
    _edit_config(copy, lambda c: c["quantization_config"]["kv_cache_scheme"].update(
        strategy="attn_head"))
    with pytest.raises(GuardRefused, match="neither FP8 per tensor nor unquantized"):
        api.apply("compressed-tensors-to-modelopt", copy, out=tmp_path / "d")
    _edit_config(copy, lambda c: c["quantization_config"].update(format="mixed-precision"))
    with pytest.raises(GuardRefused, match="not nvfp4-pack-quantized"):
        api.apply("compressed-tensors-to-modelopt", copy, out=tmp_path / "e")


def test_compressed_tensors_to_modelopt_reads_compressed_tensors_own_output(tmp_path):
    """The reverse recipe on a checkpoint modelpatch did not write: compressed-tensors'
    converter output (scalar [] global scales, config_group_0, version, its KV scales under
    ModelOpt's names in bfloat16). Back in ModelOpt's layout, every tensor equals the original
    export except the scales no reciprocal restores (one ulp) and the KV scales, which the
    converter rounded to bfloat16."""
    base = FIXTURES / "llama-nvfp4"
    theirs = _converter_output(base, tmp_path / "converter", with_kv=True)
    back = api.apply("compressed-tensors-to-modelopt", theirs, out=tmp_path / "back").output
    before, after = read_tensors(base), read_tensors(back)
    assert sorted(after) == sorted(before)
    for name, t in before.items():
        if name.endswith(KV):
            assert_bits_equal(after[name], t.to(torch.bfloat16), name)
        elif t.dim() == 0 and t.dtype == torch.float32 and _f32_reciprocal(
                _f32_reciprocal(t.numpy().reshape(1)))[0] != t.item():
            assert abs(int(after[name].view(torch.int32)) - int(t.view(torch.int32))) == 1
        else:
            assert_bits_equal(after[name], t, name)
    qc = dict(_json(base / "config.json")["quantization_config"])
    qc.pop("producer")
    assert _json(back / "config.json")["quantization_config"] == qc


def test_wildcard_excludes_are_translated_and_transformers_keeps_those_modules_bf16(tmp_path):
    """ModelOpt's ``exclude_modules`` are fnmatch patterns; copied into compressed-tensors'
    ``ignore`` (exact names or re:) ``lm_head*`` matched nothing, so transformers gave the BF16
    lm_head the NVFP4 scheme: lm_head.weight_packed missing, logits from an uninitialized head."""
    from compressed_tensors.utils.match import match_name
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    shutil.copytree(FIXTURES / "llama-nvfp4", base)
    for file in ("hf_quant_config.json", "config.json"):
        path = base / file
        doc = _json(path)
        quant = doc["quantization"] if file == "hf_quant_config.json" else \
            doc["quantization_config"]
        quant["exclude_modules" if file == "hf_quant_config.json" else "ignore"] = \
            ["lm_head*", "model.embed_tokens"]
        path.chmod(0o644)
        path.write_text(json.dumps(doc, indent=2))
    ct = api.apply("modelopt-to-compressed-tensors", base, out=tmp_path / "ct").output
    ignore = _json(ct / "config.json")["quantization_config"]["ignore"]
    assert ignore == ["re:lm_head.*$", "model.embed_tokens"]
    assert any(match_name("lm_head", entry) for entry in ignore)
    model, info = AutoModelForCausalLM.from_pretrained(ct, dtype=torch.bfloat16,
                                                       output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    assert not any(k.startswith("lm_head") for k in info["unexpected_keys"]), info
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(model.eval()(ids).logits).all()


def test_mla_conversion_keeps_the_kv_scale_spelling_vllm_loads(tmp_path):
    """DeepSeek-V3 (MLA): vLLM 0.33 loads only ModelOpt's self_attn.k_proj.k_scale into the MLA
    attention; the conversion keeps it as ModelOpt wrote it where a Llama's moves to
    self_attn.k_scale [1]."""
    from vllm_kv_names import attention_scale_params, vllm_loads

    for export, mla in (("deepseek-v3-nvfp4", True), ("llama-nvfp4", False)):
        ct = api.apply("modelopt-to-compressed-tensors", FIXTURES / export,
                       out=tmp_path / export).output
        tensors = read_tensors(ct)
        kv = {n for n in tensors if n.endswith(KV)}
        assert len(kv) == 4 and all(tensors[n].shape == (() if mla else (1,)) for n in kv)
        assert all(("_proj." in n) is mla for n in kv), kv
        assert {vllm_loads(n, attention_scale_params(2, mla)) for n in kv} == \
            attention_scale_params(2, mla)
