"""The float8 e4m3 codec: decoding float8_e4m3fn to float32/float64 and rounding float32 to it."""

from __future__ import annotations

import numpy as np
import torch

#: Largest finite float8_e4m3fn value.
FP8_E4M3_MAX = 448.0

# Value of every float8_e4m3fn bit pattern in float32 and float64 (the NaN patterns decode to
# NaN, as in torch).
_E4M3_TABLES = {dtype: torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(dtype)
                for dtype in (torch.float32, torch.float64)}


def fp8_decode(x: torch.Tensor, dev: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dev).to(dtype)`` for float32 or float64, bit for bit (every float8 value is exact
    in both). torch converts float8 on the CPU with scalar code; a 256-entry table lookup in
    numpy is ~4x faster."""
    if dev.type == "cpu" and x.device.type == "cpu" and x.dtype == torch.float8_e4m3fn:
        codes = x.contiguous().view(torch.uint8).numpy()
        return torch.from_numpy(np.take(_E4M3_TABLES[dtype].numpy(), codes))
    return x.to(dev).to(dtype)


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturate ``x`` to +-448 (in place) and round it to float8_e4m3fn (nearest even)."""
    return x.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
