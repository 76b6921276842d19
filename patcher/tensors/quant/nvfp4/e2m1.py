"""The 4-bit e2m1 codec of NVFP4: code values, packing two codes per byte, decoding packed bytes
to values and rounding float32 values to codes.

Packing (both producers): two e2m1 codes per byte, the even element in the LOW nibble. Codes
0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and bit 3 is the sign.
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernel_args import torch_device
from .shapes import nvfp4_unpacked_shape

#: Largest e2m1 magnitude.
E2M1_MAX = 6.0

#: Value of each 4-bit e2m1 code (bit 3 = sign). Code 8 is +0.0, as in ModelOpt's
#: ``e2m1_values`` table.
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                            0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float32)

#: ``E2M1_VALUES`` as compressed-tensors decodes them: ``kE2M1[abs] * where(sign, -1.0, 1.0)``,
#: so code 8 is -0.0 there.
E2M1_VALUES_CT = E2M1_VALUES.clone()
E2M1_VALUES_CT[8] = -0.0

# The two tables in float64, the dtype the dequantizers compute in (module constants: the
# decoding caches a byte table per table object).
E2M1_VALUES_F64 = E2M1_VALUES.to(torch.float64)
E2M1_VALUES_CT_F64 = E2M1_VALUES_CT.to(torch.float64)


def unpack_fp4(packed_u8: torch.Tensor, *, device: str = "cpu") -> torch.Tensor:
    """Split each byte into two 4-bit e2m1 codes, the even element from the LOW nibble.

    Args:
        packed_u8: uint8 tensor ``[..., n/2]``.
        device: where the arithmetic runs. The result is on the CPU.

    Returns:
        uint8 codes ``[..., n]`` in 0..15 (bit 3 = sign).

    Raises:
        ValueError: ``packed_u8`` is not uint8 or is a scalar.
    """
    if packed_u8.dtype != torch.uint8:
        raise ValueError(f"packed e2m1 data must be uint8, got {packed_u8.dtype}")
    out_shape = nvfp4_unpacked_shape(packed_u8.shape)
    p = packed_u8.to(torch_device(device))
    codes = torch.stack((p & 0x0F, p >> 4), dim=-1)
    return codes.reshape(out_shape).cpu()


_PAIR_TABLES: dict[int, np.ndarray] = {}


def _pair_table(lut: torch.Tensor) -> np.ndarray:
    """[256, 2] in the dtype of ``lut``: the values of a byte's low and high nibble."""
    key = id(lut)
    if key not in _PAIR_TABLES:
        codes = torch.arange(256)
        _PAIR_TABLES[key] = torch.stack((lut.cpu()[codes & 0x0F], lut.cpu()[codes >> 4]),
                                        dim=-1).numpy()
    return _PAIR_TABLES[key]


def decode_packed(packed: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Decode packed rows ``[rows, n/2]`` straight to ``[rows, n]`` values of ``lut`` (in its
    dtype). On the CPU one numpy lookup per byte in a 256 x 2 table (~10x faster than torch's
    gather)."""
    if packed.device.type == "cpu" and lut.device.type == "cpu":
        table = _pair_table(lut)
        pairs = np.take(table, packed.contiguous().numpy(), axis=0)
        return torch.from_numpy(pairs).reshape(packed.shape[0], -1)
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)
    return lut[codes.to(torch.int32)]


def round_to_e2m1_codes(scaled: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """Round float32 values (already divided by their scale) to e2m1 codes.

    Nearest value, ties to even mantissa: the thresholds of ModelOpt's ``_cast_fp4`` (bounds
    0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 with ties at 0.75, 1.75, 3.5 rounding up) and
    compressed-tensors' ``cast_to_fp4`` agree. Magnitudes above 5 become 6 (saturation).
    """
    a = scaled.abs()
    code = (a > 0.25).to(torch.uint8)
    code += a >= 0.75
    code += a > 1.25
    code += a >= 1.75
    code += a > 2.5
    code += a >= 3.5
    code += a > 5.0
    return code | (sign.to(torch.uint8) << 3)
