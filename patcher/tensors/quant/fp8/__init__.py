"""FP8 (e4m3) weight kernels: dequantize and quantize, per tensor, per channel and per block.

Formats (confirmed against the producers' code; see docs/architecture.md §1):

* ModelOpt FP8 (``quant_algo: FP8``): ``weight`` float8_e4m3fn and ``weight_scale`` float32
  (a scalar; ``FP8_PC_PT`` writes one scale per output row). ModelOpt exports
  ``weight_scale = amax / 448`` and ``weight = (w / weight_scale).to(float8_e4m3fn)``, so
  dequantization is a **multiply**: ``W = fp8 * weight_scale``.
* compressed-tensors ``float-quantized`` (schemes ``FP8``, ``FP8_DYNAMIC``, ``FP8_BLOCK``):
  ``weight`` float8_e4m3fn and ``weight_scale`` in the model dtype (usually bfloat16), shaped
  ``[1]`` (tensor), ``[out, 1]`` (channel) or ``[ceil(M/bm), ceil(N/bn)]`` (block). Also a
  multiply; compressed-tensors' ``_dequantize`` computes it in the scale's dtype
  (``x_q.to(scale.dtype) * scale``).
* DeepSeek-V3 block FP8: ``weight`` float8_e4m3fn and ``weight_scale_inv`` float32
  ``[ceil(M/128), ceil(N/128)]``; ``W[i, j] = fp8[i, j] * weight_scale_inv[i // 128, j // 128]``
  (a multiply despite the name), computed in float32 and stored in bfloat16.

Every dequantizer computes the exact product in float64 and rounds it once, half to even, to the
output dtype (``patcher.tensors.quant.rounding``). That equals compressed-tensors' decompression
whenever the output dtype is the scale's dtype, and DeepSeek's whenever the output is float32;
docs/numerics.md says where the producers' own results differ.

Large weights are processed in row chunks, so the extra memory is the output tensor plus a few
chunk-sized temporaries, never whole-tensor float32 copies (see
``patcher.tensors.quant.kernel_args``).

Modules: ``shapes`` (shape checks on header metadata), ``dequantize`` (with the float8 e4m3
codec) and ``quantize``.
"""

from ..kernel_args import OUT_DTYPES
from .dequantize import FP8_E4M3_MAX, dequantize_fp8_block, dequantize_fp8_per_tensor
from .quantize import quantize_fp8_block, quantize_fp8_per_tensor
from .shapes import check_fp8_block_shapes, check_fp8_scale_shape, fp8_block_scale_shape

__all__ = [
    "FP8_E4M3_MAX",
    "OUT_DTYPES",
    "fp8_block_scale_shape",
    "check_fp8_block_shapes",
    "check_fp8_scale_shape",
    "dequantize_fp8_per_tensor",
    "dequantize_fp8_block",
    "quantize_fp8_per_tensor",
    "quantize_fp8_block",
]
