"""modelpatch equals each producer's own dequantizer wherever that is correctly rounded.

modelpatch rounds the exact value once (test_exact_rounding.py). The producers' dequantizers
round in between, so they are not always correctly rounded; docs/numerics.md says where and why.
Here, per producer and output dtype: every element where the producer's result equals the
correctly rounded value (tests/exact_reference.py) is bit-identical in modelpatch's output; and
where the producer's own arithmetic is provably a single rounding (compressed-tensors FP8 into
the scale's dtype, ModelOpt FP8 into float32) that is every element.

* compressed-tensors: its own compressors and decompressors (installed), not a copy.
* ModelOpt: not installed in CI; its formulas are written out below from its source, quoted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from exact_reference import round_exact_product, round_exact_quotient
from tensor_helpers import ct_fp8
from test_exact_rounding import (
    E2M1,
    E4M3_BYTES,
    _all_nvfp4_pairs,
    _decode_e4m3,
    bf16_amaxes,
    modelopt_scale_2,
)

from patcher.tensors.quant import (
    dequantize_fp8_block,
    dequantize_fp8_per_tensor,
    dequantize_nvfp4_compressed_tensors,
    dequantize_nvfp4_modelopt,
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _fmt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def agree_where_correct(ours: torch.Tensor, theirs: torch.Tensor, exact: np.ndarray) -> int:
    """Assert ``ours`` is the correctly rounded ``exact`` everywhere and equals ``theirs``
    wherever ``theirs`` is correctly rounded; return how many elements of ``theirs`` are not."""
    ours64, theirs64 = ours.double().numpy(), theirs.double().numpy().reshape(ours.shape)
    exact = exact.reshape(ours.shape)
    assert np.array_equal(ours64, exact)
    correct = theirs64 == exact
    assert np.array_equal(ours64[correct], theirs64[correct])
    return int((~correct).sum())


# --- compressed-tensors ----------------------------------------------------------------------

ct = pytest.importorskip("compressed_tensors")



def _fp8_exact(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    w = weight.double()
    s = scale.double()
    if s.numel() > 1 and s.shape[0] != w.shape[0]:           # block scales
        s = s.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
    elif s.numel() > 1:
        s = s.reshape(-1, 1)
    return round_exact_product((w * s).numpy(), _fmt(dtype))


@pytest.mark.parametrize("preset", ["FP8", "FP8_DYNAMIC", "FP8_BLOCK"])
@pytest.mark.parametrize("model_dtype", [torch.bfloat16, torch.float16])
def test_ct_fp8_decompression_equal_in_the_scale_dtype(preset, model_dtype):
    """compressed-tensors multiplies ``fp8.to(scale.dtype) * scale``: an e4m3 times a bf16/fp16
    value is exact in float32, so torch rounds it once. Bit-identical in every element."""
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(160, 200, generator=gen) * torch.rand(160, 1, generator=gen))
    c, theirs = ct_fp8(preset, w.to(model_dtype))
    assert theirs.dtype == model_dtype == c["weight_scale"].dtype
    deq = dequantize_fp8_block if preset == "FP8_BLOCK" else dequantize_fp8_per_tensor
    ours = deq(c["weight"], c["weight_scale"], model_dtype)
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))
    for dtype in DTYPES:       # other outputs: theirs is its rounded product, cast
        agree_where_correct(deq(c["weight"], c["weight_scale"], dtype), theirs.to(dtype),
                            _fp8_exact(c["weight"], c["weight_scale"], dtype))


def _ct_nvfp4(w: torch.Tensor):
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
    return NVFP4PackedCompressor, scheme, packed


def _nvfp4_exact_quotient(packed, scale, gs, dtype) -> np.ndarray:
    p = packed.numpy()
    codes = np.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1)
    pair = E2M1[codes] * np.repeat(scale.double().numpy(), 16, axis=1)
    return round_exact_quotient(pair, np.full(pair.shape, float(gs.reshape(()))), _fmt(dtype))


def test_ct_nvfp4_decompression_equal_where_correctly_rounded():
    """``NVFP4PackedCompressor.decompress`` (bfloat16) and ``dequantize`` fed float16 / float32
    codes: scale / global_scale in float32, times the code in float32, cast. Three roundings."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    gen = torch.Generator().manual_seed(4)
    w = (torch.randn(128, 512, generator=gen) * torch.rand(128, 1, generator=gen))
    compressor, scheme, c = _ct_nvfp4(w.to(torch.bfloat16))
    packed, scale, gs = c["weight_packed"], c["weight_scale"], c["weight_global_scale"]
    for dtype in DTYPES:
        if dtype == torch.bfloat16:
            theirs = compressor.decompress(dict(c), scheme)["weight"]
        else:
            x_q = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=dtype)
            theirs = dequantize(x_q=x_q, scale=scale.to(dtype), args=scheme.weights,
                                global_scale=gs, dtype=dtype)
        ours = dequantize_nvfp4_compressed_tensors(packed, scale, gs, dtype)
        agree_where_correct(ours, theirs, _nvfp4_exact_quotient(packed, scale, gs, dtype))


# --- ModelOpt (formulas from its source) -----------------------------------------------------

def modelopt_nvfp4_dequantize(codes: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor,
                              dtype: torch.dtype) -> torch.Tensor:
    """``NVFP4QTensor.dequantize`` (fast=False), NVIDIA/Model-Optimizer
    modelopt/torch/quantization/qtensor/nvfp4_tensor.py at 211c6b3413c5
    (https://github.com/NVIDIA/Model-Optimizer/blob/211c6b3413c52b2fd7a671eda3ce8b2139a4fedd/
    modelopt/torch/quantization/qtensor/nvfp4_tensor.py)::

        q_per_block_scale = kwarg["scale"].to(torch.float32)
        per_block_scale = q_per_block_scale * per_block_quant_scale
        deq_data = _unpack_tensor(self._quantized_data)    # e2m1_values[...] (float32 table)
        deq_data = deq_data.view(..., -1, block_size) * per_block_scale.unsqueeze(-1)
        return deq_data.reshape(self.metadata["shape"]).to(dtype)
    """
    per_block_scale = scale.to(torch.float32) * scale_2
    values = torch.from_numpy(E2M1.astype(np.float32))[codes.long()]
    deq = values.view(*codes.shape[:-1], -1, 16) * per_block_scale.unsqueeze(-1)
    return deq.reshape(codes.shape).to(dtype)


def modelopt_fp8_dequantize(q: torch.Tensor, scale: torch.Tensor,
                            dtype: torch.dtype) -> torch.Tensor:
    """``FP8QTensor.dequantize``, NVIDIA/Model-Optimizer
    modelopt/torch/quantization/qtensor/fp8_tensor.py at 8305e0ef3aaa
    (https://github.com/NVIDIA/Model-Optimizer/blob/8305e0ef3aaa69d782ec411d090dec43183a2656/
    modelopt/torch/quantization/qtensor/fp8_tensor.py)::

        return (quantized_data.to(dtype) * scales.to(dtype))[slices]

    The scale is rounded to ``dtype`` first."""
    return q.to(dtype) * scale.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_modelopt_nvfp4_equal_where_correctly_rounded(dtype):
    """All 16 codes x all finite e4m3 group scales x ``amax / 2688`` per-tensor scales, amax
    every odd bfloat16 significand in [1, 2) (all five that trip ModelOpt into bfloat16)."""
    packed, scale, pair = _all_nvfp4_pairs()
    codes = torch.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
    not_correct = 0
    for s2 in modelopt_scale_2(bf16_amaxes([0]))[1::2]:
        s2_t = torch.tensor(s2, dtype=torch.float32)
        theirs = modelopt_nvfp4_dequantize(codes, scale, s2_t, dtype)
        ours = dequantize_nvfp4_modelopt(packed, scale, s2_t, dtype)
        not_correct += agree_where_correct(
            ours, theirs, round_exact_product(pair * np.float64(s2), _fmt(dtype)))
    if dtype != torch.float16:
        assert not_correct > 0          # ModelOpt's own result is not always correctly rounded


@pytest.mark.parametrize("dtype", DTYPES)
def test_modelopt_fp8_equal_where_correctly_rounded(dtype):
    """Every finite e4m3 byte x ``amax / 448`` scales; into float32 that is every element."""
    q = torch.from_numpy(E4M3_BYTES).view(torch.float8_e4m3fn)
    not_correct = 0
    for amax in bf16_amaxes([0, 5]):
        s = torch.tensor(amax, dtype=torch.float32) / 448.0
        exact = round_exact_product(_decode_e4m3(E4M3_BYTES) * float(s), _fmt(dtype))
        not_correct += agree_where_correct(dequantize_fp8_per_tensor(q, s, dtype),
                                           modelopt_fp8_dequantize(q, s, dtype), exact)
    assert (not_correct == 0) == (dtype == torch.float32)
