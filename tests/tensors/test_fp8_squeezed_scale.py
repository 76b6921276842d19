"""FP8 block scales saved squeezed: transformers 5.x wrote the
``weight_scale_inv`` of MoE expert weights as ``[2]`` for a ``[256, 128]`` weight in 128 x 128
blocks, not ``[2, 1]``. ``fp8-block`` reads such a scale as its grid when that is unambiguous
(the grid has at most one dimension above 1) and refuses any other 1-D scale, clearly.

tests/fixtures/transformers_fp8_moe is a checkpoint transformers itself wrote:
``integration/make_transformers_fp8.py`` (its FP8 quantize-on-load needs a GPU) run once on an
NVIDIA H200 with transformers 5.17.0 and torch 2.11.0 (versions.json): a one-layer Qwen3-MoE
whose expert scales are squeezed. A hand-built layout covers the ambiguous case it cannot.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tensor_helpers import random_fp8, read_tensors, ref_fp8_block, write_model

from patcher import api
from patcher.cli import main
from patcher.tensors.quant import dequantize_fp8_block

TRANSFORMERS_FP8 = Path(__file__).parent.parent / "fixtures" / "transformers_fp8_moe"
FP8_CONFIG = {"model_type": "qwen3_moe",
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}


@pytest.mark.parametrize("weight_shape, grid, squeezed", [
    ((256, 128), (2, 1), (2,)),          # expert gate_proj / up_proj
    ((128, 256), (1, 2), (2,)),          # expert down_proj
    ((100, 90), (1, 1), ()),             # one block: a scalar
])
def test_kernel_reads_a_squeezed_scale_as_its_grid(weight_shape, grid, squeezed):
    gen = torch.Generator().manual_seed(1)
    w = random_fp8(weight_shape, gen)
    s = torch.rand(grid, generator=gen) * 1e-2
    expected = dequantize_fp8_block(w, s, torch.bfloat16)
    assert torch.equal(dequantize_fp8_block(w, s.reshape(squeezed), torch.bfloat16), expected)


def test_kernel_refuses_a_1d_scale_for_a_two_dimensional_grid():
    w = random_fp8((256, 256), torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"block scale has shape \[4\], expected \[2, 2\]"):
        dequantize_fp8_block(w, torch.ones(4), torch.bfloat16)


def _moe_model(root, gen, *, down_scale_shape=(2,)):
    """One layer of Qwen3-MoE-style experts the way transformers 5.x saved them: squeezed
    expert scales, and an attention projection whose grid is [1, 1] stored as such."""
    tensors, grids = {}, {}
    for e in range(2):
        stem = f"model.layers.0.mlp.experts.{e}."
        for proj, shape, grid in (("gate_proj", (256, 128), (2, 1)),
                                  ("up_proj", (256, 128), (2, 1)),
                                  ("down_proj", (128, 256), (1, 2))):
            scale = torch.rand(grid, generator=gen) * 1e-2 + 1e-4
            grids[stem + proj] = scale
            squeezed = down_scale_shape if proj == "down_proj" else (2,)
            tensors[stem + proj + ".weight"] = random_fp8(shape, gen)
            tensors[stem + proj + ".weight_scale_inv"] = scale.reshape(squeezed)
    tensors["model.layers.0.self_attn.o_proj.weight"] = random_fp8((128, 128), gen)
    grids["model.layers.0.self_attn.o_proj"] = torch.rand(1, 1, generator=gen)
    tensors["model.layers.0.self_attn.o_proj.weight_scale_inv"] = \
        grids["model.layers.0.self_attn.o_proj"]
    tensors["model.norm.weight"] = torch.ones(128, dtype=torch.bfloat16)
    return write_model(root, {"model.safetensors": tensors}, FP8_CONFIG), tensors, grids


def test_fp8_block_to_bf16_dequantizes_squeezed_expert_scales(tmp_path):
    model, base, grids = _moe_model(tmp_path / "m", torch.Generator().manual_seed(3))
    out = api.apply("fp8-block-to-bf16", model, out=tmp_path / "out").output
    result = read_tensors(out)
    assert not any(n.endswith("_scale_inv") for n in result)
    for stem, grid in grids.items():
        expected = ref_fp8_block(base[stem + ".weight"], grid, torch.bfloat16)
        assert torch.equal(result[stem + ".weight"], expected), stem


def test_fp8_block_to_bf16_refuses_an_ambiguous_1d_scale(tmp_path):
    """A [2, 2] grid saved as [4]: the order of its values is unknown. One line, exit 2, the
    tensor named, nothing written."""
    gen = torch.Generator().manual_seed(4)
    model = write_model(tmp_path / "m", {"model.safetensors": {
        "x.weight": random_fp8((256, 256), gen), "x.weight_scale_inv": torch.rand(4)}},
        FP8_CONFIG)
    result = CliRunner().invoke(main, ["apply", "fp8-block-to-bf16", str(model), "-o",
                                       str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "x.weight" in line, line
    assert "has shape [4], expected [2, 2]" in line, line
    assert "a 1-D scale fits only one row or one column of blocks" in line, line
    assert not (tmp_path / "out").exists()


def test_fp8_block_to_bf16_on_a_checkpoint_transformers_wrote(tmp_path):
    """Every F8_E4M3 weight (squeezed [2] expert scales, [1, 1] attention scales) becomes the
    exact product rounded once to BF16; the scales and quantization_config are gone; the
    result loads in transformers with no missing or unexpected keys."""
    model = Path(shutil.copytree(TRANSFORMERS_FP8, tmp_path / "m"))
    base = read_tensors(model)
    squeezed = [n for n, t in base.items() if n.endswith("_scale_inv") and t.dim() == 1]
    assert len(squeezed) == 12                      # 4 experts x gate, up, down: as written
    out = api.apply("fp8-block-to-bf16", model, out=tmp_path / "out").output
    result = read_tensors(out)
    for name, w in base.items():
        if name.endswith("_scale_inv"):
            continue
        if w.dtype != torch.float8_e4m3fn:
            assert torch.equal(result[name], w), name
            continue
        scale = base[name + "_scale_inv"]
        grid = (-(-w.shape[0] // 128), -(-w.shape[1] // 128))
        expected = ref_fp8_block(w, scale.reshape(grid), torch.bfloat16)
        assert torch.equal(result[name], expected), name
    assert sorted(result) == sorted(n for n in base if not n.endswith("_scale_inv"))
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    transformers = pytest.importorskip("transformers")
    _, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
