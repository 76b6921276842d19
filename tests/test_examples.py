"""The example generator: determinism, shards and index, real tensor formats, HF cache layout."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from examples import generate

E2M1 = torch.tensor(generate.E2M1_VALUES + tuple(-v for v in generate.E2M1_VALUES))


def _file_digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _weight_map(model: Path) -> dict[str, str]:
    return _json(model / "model.safetensors.index.json")["weight_map"]


def _headers(model: Path) -> dict[str, tuple[str, list[int]]]:
    """{tensor name: (safetensors dtype, shape)} across every shard."""
    out = {}
    for shard in sorted(set(_weight_map(model).values())):
        with safe_open(model / shard, "pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                out[name] = (piece.get_dtype(), piece.get_shape())
    return out


def _tensor(model: Path, name: str) -> torch.Tensor:
    with safe_open(model / _weight_map(model)[name], "pt") as f:
        return f.get_tensor(name)


def _dequant_nvfp4(packed: torch.Tensor, scale: torch.Tensor,
                   scale_2: torch.Tensor) -> torch.Tensor:
    """docs/architecture.md §1: W = LUT[code] * weight_scale[r, c // 16] * weight_scale_2, even
    element low."""
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
    return E2M1[codes.long()] * scale.float().repeat_interleave(16, dim=1) * scale_2


def _dequant_fp8(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    rows, cols = weight.shape
    full = scale_inv.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    return weight.float() * full[:rows, :cols]


# --------------------------------------------------------------------------- generation


def test_generation_is_byte_identical(examples_dir: Path, tmp_path: Path) -> None:
    again = generate.make_all(tmp_path)
    assert sorted(again) == sorted(generate.BUILDERS)
    for name, path in again.items():
        assert _file_digests(path) == _file_digests(examples_dir / name), name


def test_main_builds_only_the_named_examples(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert generate.main([str(tmp_path), "--only", generate.DEEPSEEK_FP8]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / generate.DEEPSEEK_FP8)]
    assert [p.name for p in tmp_path.iterdir()] == [generate.DEEPSEEK_FP8]


def test_refuses_to_write_into_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        generate.make_deepseek_fp8(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("fixture, shards", [
    ("kimi_dir", 4), ("deepseek_fp8_dir", 3), ("tiny_bf16_dir", 3)])
def test_shards_and_index_agree(fixture: str, shards: int, request: pytest.FixtureRequest) -> None:
    model: Path = request.getfixturevalue(fixture)
    index = _json(model / "model.safetensors.index.json")
    files = sorted(p.name for p in model.glob("*.safetensors"))
    assert files == [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    total = 0
    for shard in files:
        with safe_open(model / shard, "pt") as f:
            assert f.metadata() == {"format": "pt"}
            listed = [k for k, v in index["weight_map"].items() if v == shard]
            assert sorted(f.keys()) == sorted(listed)
            for name in f.keys():
                tensor = f.get_tensor(name)
                total += tensor.numel() * tensor.element_size()
    assert index["metadata"]["total_size"] == total


@pytest.mark.parametrize("fixture, suffix", [
    ("kimi_dir", ".weight_scale"), ("deepseek_fp8_dir", ".weight_scale_inv")])
def test_some_scales_sit_in_another_shard_than_their_weight(
        fixture: str, suffix: str, request: pytest.FixtureRequest) -> None:
    weight_map = _weight_map(request.getfixturevalue(fixture))
    crossing = [n for n in weight_map if n.endswith(suffix)
                and weight_map[n] != weight_map[n.removesuffix(suffix) + ".weight"]]
    assert crossing


# --------------------------------------------------------------------------- kimi-k25-nvfp4


def test_kimi_configs_carry_the_fp8_kv_cache_keys(kimi_dir: Path) -> None:
    config = _json(kimi_dir / "config.json")
    hf_quant = _json(kimi_dir / "hf_quant_config.json")
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert config["model_type"] == "kimi_k25"
    assert config["text_config"]["model_type"] == "deepseek_v3"
    assert config["vision_config"]["vt_hidden_size"] == 64
    quant = config["quantization_config"]
    assert (quant["quant_method"], quant["quant_algo"]) == ("modelopt", "NVFP4")
    assert quant["kv_cache_scheme"] == {"dynamic": False, "num_bits": 8, "type": "float"}
    group = quant["config_groups"]["group_0"]
    assert group["weights"]["group_size"] == group["input_activations"]["group_size"] == 16
    assert hf_quant["producer"]["name"] == "modelopt"
    assert hf_quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert hf_quant["quantization"]["exclude_modules"] == quant["ignore"]
    vocab = config["text_config"]["vocab_size"]
    assert all(0 <= config[k] < vocab for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                               "media_placeholder_token_id"))


@pytest.mark.parametrize("fixture, config_class", [
    ("kimi_dir", "Kimi_K25Config"), ("deepseek_fp8_dir", "DeepseekV3Config")])
def test_transformers_reads_the_configs(fixture: str, config_class: str,
                                        request: pytest.FixtureRequest) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(request.getfixturevalue(fixture))
    assert type(config).__name__ == config_class
    assert config.get_text_config().model_type == "deepseek_v3"
    assert config.quantization_config


def test_kimi_tensor_formats(kimi_dir: Path) -> None:
    text = _json(kimi_dir / "config.json")["text_config"]
    headers = _headers(kimi_dir)
    prefixes = ("language_model.model.", "language_model.lm_head.", "vision_tower.",
                "mm_projector.")
    assert all(name.startswith(prefixes) for name in headers)
    experts = [n for n in headers if ".mlp.experts." in n and n.endswith(".weight")]
    moe_layers = text["num_hidden_layers"] - text["first_k_dense_replace"]
    assert len(experts) == moe_layers * text["n_routed_experts"] * 3
    for name in experts:
        dtype, (rows, packed_cols) = headers[name]
        stem = name.removesuffix("weight")
        assert dtype == "U8"
        assert headers[stem + "weight_scale"] == ("F8_E4M3", [rows, packed_cols * 2 // 16])
        assert headers[stem + "weight_scale_2"] == ("F32", [])
        assert headers[stem + "input_scale"] == ("F32", [])
    assert sum(".mlp.experts." in n for n in headers) == 4 * len(experts)
    for name, (dtype, _) in headers.items():
        if ".mlp.experts." not in name:  # routed experts are checked above
            f32 = name.endswith((".k_scale", ".v_scale", ".e_score_correction_bias"))
            assert dtype == ("F32" if f32 else "BF16"), name
    assert headers["language_model.model.layers.1.self_attn.k_proj.k_scale"] == ("F32", [])
    assert headers["language_model.model.layers.1.mlp.shared_experts.up_proj.weight"][0] == "BF16"


def test_kimi_nvfp4_experts_dequantize_to_sensible_weights(kimi_dir: Path) -> None:
    stem = "language_model.model.layers.2.mlp.experts.5.down_proj."
    weight = _dequant_nvfp4(*(_tensor(kimi_dir, stem + suffix)
                              for suffix in ("weight", "weight_scale", "weight_scale_2")))
    text = _json(kimi_dir / "config.json")["text_config"]
    assert weight.shape == (text["hidden_size"], text["moe_intermediate_size"])
    assert torch.isfinite(weight).all()
    assert abs(weight.mean().item()) < 0.002
    assert 0.017 < weight.std().item() < 0.023  # generated with std 0.02


def test_quantize_nvfp4_packs_the_even_element_in_the_low_nibble() -> None:
    values = torch.tensor(generate.E2M1_VALUES)
    row = torch.cat([values, -values.flip(0)])  # every block reaches 6, so the scales are exact
    weight = torch.stack([row, -row]).repeat(1, 2)
    packed, scale, scale_2 = generate.quantize_nvfp4(weight)
    assert (packed.dtype, scale.dtype, scale_2.shape) == (torch.uint8, torch.float8_e4m3fn, ())
    assert packed[0, 0].item() == 0x10  # codes 0 (0.0) then 1 (0.5)
    assert packed[1, 0].item() == 0x90  # codes 0 (-0.0 has no sign bit set) then 9 (-0.5)
    assert torch.allclose(_dequant_nvfp4(packed, scale, scale_2), weight, rtol=1e-6, atol=0)


def test_quantize_nvfp4_error_is_that_of_4_bit_floats() -> None:
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    packed, scale, scale_2 = generate.quantize_nvfp4(weight)
    error = (_dequant_nvfp4(packed, scale, scale_2) - weight).norm() / weight.norm()
    assert error < 0.12


# --------------------------------------------------------------------------- deepseek-v3-fp8


def test_deepseek_fp8_config(deepseek_fp8_dir: Path) -> None:
    config = _json(deepseek_fp8_dir / "config.json")
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert config["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3",
                                             "quant_method": "fp8", "weight_block_size": [128, 128]}


def test_deepseek_fp8_tensor_formats(deepseek_fp8_dir: Path) -> None:
    headers = _headers(deepseek_fp8_dir)
    config = _json(deepseek_fp8_dir / "config.json")
    assert all(n.startswith(("model.", "lm_head.")) for n in headers)
    assert f"model.layers.{config['num_hidden_layers']}.eh_proj.weight" in headers  # MTP layer
    scaled = [n.removesuffix("_scale_inv") for n in headers if n.endswith("_scale_inv")]
    assert any(".mlp.experts." in n for n in scaled) and any(".self_attn." in n for n in scaled)
    partial = 0
    for name in scaled:
        dtype, (rows, cols) = headers[name]
        assert dtype == "F8_E4M3"
        blocks = [math.ceil(rows / 128), math.ceil(cols / 128)]
        assert headers[name + "_scale_inv"] == ("F32", blocks)
        partial += rows % 128 != 0 or cols % 128 != 0
    assert partial > 0  # edge blocks are partial
    for name, (dtype, _) in headers.items():
        if name.endswith(".e_score_correction_bias") or name.endswith("_scale_inv"):
            assert dtype == "F32", name
        elif name not in scaled:
            assert dtype == "BF16", name


def test_deepseek_fp8_blocks_use_the_full_e4m3_range(deepseek_fp8_dir: Path) -> None:
    name = "model.layers.1.self_attn.kv_b_proj.weight"
    weight = _tensor(deepseek_fp8_dir, name)
    scale_inv = _tensor(deepseek_fp8_dir, name + "_scale_inv")
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            block = weight[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float()
            assert block.abs().max().item() == 448.0  # scale_inv = amax / 448
    dequantized = _dequant_fp8(weight, scale_inv)
    assert 0.018 < dequantized.std().item() < 0.022  # generated with std 0.02


# --------------------------------------------------------------------------- tiny bf16


def test_tiny_bf16_reloads_in_transformers(tiny_bf16_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_bf16_dir)
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, model.config.vocab_size)
    assert torch.isfinite(logits).all()


# --------------------------------------------------------------------------- hub cache


def test_hf_cache_snapshot_scans_clean(kimi_dir: Path, tmp_path: Path) -> None:
    from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download

    snapshot = generate.make_hf_cache_snapshot(kimi_dir, tmp_path, "nvidia/Kimi-K2.5-NVFP4")
    info = scan_cache_dir(tmp_path)
    assert info.warnings == []
    (repo,) = info.repos
    (revision,) = repo.revisions
    assert (repo.repo_id, repo.repo_type) == ("nvidia/Kimi-K2.5-NVFP4", "model")
    assert (revision.commit_hash, revision.refs) == (snapshot.name, frozenset({"main"}))
    assert revision.nb_files == len(_file_digests(kimi_dir))
    assert snapshot == tmp_path / "models--nvidia--Kimi-K2.5-NVFP4" / "snapshots" / snapshot.name
    assert hf_hub_download("nvidia/Kimi-K2.5-NVFP4", "docs/deploy_guidance.md", cache_dir=tmp_path,
                           local_files_only=True) == str(snapshot / "docs" / "deploy_guidance.md")
    assert snapshot_download("nvidia/Kimi-K2.5-NVFP4", cache_dir=tmp_path,
                             local_files_only=True) == str(snapshot)


def test_hf_cache_links_and_etags_follow_the_hub(kimi_dir: Path, tmp_path: Path) -> None:
    from huggingface_hub.utils.sha import git_hash

    snapshot = generate.make_hf_cache_snapshot(kimi_dir, tmp_path, "nvidia/Kimi-K2.5-NVFP4")
    for relpath in _file_digests(kimi_dir):
        link, data = snapshot / relpath, (kimi_dir / relpath).read_bytes()
        target = os.readlink(link)
        depth = relpath.count("/") + 2
        assert target.startswith("../" * depth + "blobs/"), relpath
        lfs = relpath.endswith((".safetensors", ".model"))
        expected = hashlib.sha256(data).hexdigest() if lfs else git_hash(data)
        assert Path(target).name == expected, relpath
        assert link.read_bytes() == data
    assert (snapshot.parents[1] / "refs" / "main").read_text() == snapshot.name


def test_hf_cache_commit_is_stable_and_can_be_given(kimi_dir: Path, tmp_path: Path) -> None:
    first = generate.make_hf_cache_snapshot(kimi_dir, tmp_path / "a")
    second = generate.make_hf_cache_snapshot(kimi_dir, tmp_path / "b")
    assert first.name == second.name
    assert len(first.name) == 40
    given = generate.make_hf_cache_snapshot(kimi_dir, tmp_path / "c", commit="ab" * 20)
    assert given.name == "ab" * 20
    with pytest.raises(ValueError, match="40 lowercase hex"):
        generate.make_hf_cache_snapshot(kimi_dir, tmp_path / "d", commit="main")
