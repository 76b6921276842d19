"""NVFP4 weight kernels: e2m1 packing, dequantization and quantization.

Formats (confirmed against the producers' code; see docs/architecture.md §1):

* Packing (both producers): two e2m1 codes per byte, the even element in the LOW nibble
  (ModelOpt: ``packed = (q[..., 1::2] << 4) | q[..., 0::2]``; compressed-tensors:
  ``indices[:, 0] | (indices[:, 1] << 4)``). Codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
  bit 3 is the sign.
* ModelOpt NVFP4: ``weight`` uint8 ``[out, in/2]``, ``weight_scale`` float8_e4m3fn
  ``[out, in/16]``, ``weight_scale_2`` float32 scalar (``amax / (6 * 448)``).
  ``W = LUT[code] * float(weight_scale[r, c // 16]) * weight_scale_2``.
* compressed-tensors ``nvfp4-pack-quantized``: ``weight_packed`` uint8 ``[out, in/2]``,
  ``weight_scale`` float8_e4m3fn ``[out, in/16]``, ``weight_global_scale`` float32 ``[1]``
  (``6 * 448 / amax``: the reciprocal of ModelOpt's ``weight_scale_2``).
  ``W = LUT * weight_scale / weight_global_scale``, evaluated exactly the way
  compressed-tensors evaluates it (see :func:`dequantize_nvfp4_compressed_tensors`).

Large weights are processed in row chunks (see ``patcher.tensors.quant.kernel_args``).

Modules: ``e2m1`` (the 4-bit codec and its packing), ``shapes`` (shape checks on header
metadata), ``dequantize`` and ``quantize``.
"""

from .dequantize import dequantize_nvfp4_compressed_tensors, dequantize_nvfp4_modelopt
from .e2m1 import E2M1_MAX, E2M1_VALUES, unpack_fp4
from .quantize import quantize_nvfp4
from .shapes import NVFP4_GROUP_SIZE, check_nvfp4_shapes, nvfp4_unpacked_shape

__all__ = [
    "NVFP4_GROUP_SIZE",
    "E2M1_VALUES",
    "E2M1_MAX",
    "nvfp4_unpacked_shape",
    "check_nvfp4_shapes",
    "unpack_fp4",
    "dequantize_nvfp4_modelopt",
    "dequantize_nvfp4_compressed_tensors",
    "quantize_nvfp4",
]
