"""FP8 block scales saved squeezed (issue #12 part 5): transformers 5.x wrote the
``weight_scale_inv`` of MoE expert weights as ``[2]`` for a ``[256, 128]`` weight in 128 x 128
blocks, not ``[2, 1]``. ``fp8-block`` reads such a scale as its grid when that is unambiguous
(the grid has at most one dimension above 1) and refuses any other 1-D scale, clearly.

The squeezed layout here is built by hand, faithfully to the report: transformers' FP8
quantize-on-load needs a GPU (``integration/make_transformers_fp8.py`` makes a checkpoint with
it on one).
"""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from patcher import api
from patcher.cli import main
from patcher.quant import dequantize_fp8_block
from tensor_helpers import random_fp8, read_tensors, ref_fp8_block, write_model

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
