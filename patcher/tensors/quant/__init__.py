"""Numeric kernels for quantized weights: FP8 (per tensor, per channel, per block) and NVFP4.

Pure functions on torch tensors. Each takes ``device`` (where the arithmetic runs) and returns
CPU tensors (the dequantizers, with ``on_device=True``, tensors on ``device``). Every
dequantizer returns, in every element and output dtype (bfloat16, float16 or float32), on every
device, the exact value of its format's formula rounded once, half to even
(``patcher.tensors.quant.rounding``; where producers' own dequantizers round differently is in
docs/numerics.md). Weights are processed in row chunks, so memory stays near the size of the
output.

A weight to quantize that holds inf or NaN raises ``NonFiniteInput`` (a ``ValueError``).
Shape problems raise ``ValueError`` with a message that names expected and actual shapes; the
caller adds the tensor name. The kernels check their tensors' shapes with the ``check_*``
functions; planning checks header metadata, without torch, in ``patcher.tensors.schemes``.

This package imports torch: only tensor transforms import it.
"""

from patcher.tensors.quant.fp8 import (
    FP8_E4M3_MAX,
    OUT_DTYPES,
    check_fp8_block_shapes,
    check_fp8_scale_shape,
    dequantize_fp8_block,
    dequantize_fp8_per_tensor,
    fp8_block_scale_shape,
    quantize_fp8_block,
    quantize_fp8_per_tensor,
)
from patcher.tensors.quant.kernel_args import NonFiniteInput
from patcher.tensors.quant.nvfp4 import (
    E2M1_MAX,
    E2M1_VALUES,
    NVFP4_GROUP_SIZE,
    check_nvfp4_shapes,
    dequantize_nvfp4_compressed_tensors,
    dequantize_nvfp4_modelopt,
    nvfp4_unpacked_shape,
    quantize_nvfp4,
    unpack_fp4,
)

__all__ = [
    "FP8_E4M3_MAX",
    "OUT_DTYPES",
    "E2M1_MAX",
    "E2M1_VALUES",
    "NVFP4_GROUP_SIZE",
    "NonFiniteInput",
    "check_fp8_block_shapes",
    "check_fp8_scale_shape",
    "check_nvfp4_shapes",
    "dequantize_fp8_block",
    "dequantize_fp8_per_tensor",
    "dequantize_nvfp4_compressed_tensors",
    "dequantize_nvfp4_modelopt",
    "fp8_block_scale_shape",
    "nvfp4_unpacked_shape",
    "quantize_fp8_block",
    "quantize_fp8_per_tensor",
    "quantize_nvfp4",
    "unpack_fp4",
]
