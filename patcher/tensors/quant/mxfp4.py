"""MXFP4 (OCP microscaling) dequantization, in the layout gpt-oss checkpoints ship.

Format (OCP Microscaling Formats (MX) v1.0): blocks of 32 e2m1 values share one E8M0 scale, a
bare biased exponent: ``scale = 2 ** (byte - 127)``; byte 255 is NaN.

gpt-oss layout, confirmed in the two loaders that read it:

* transformers ``integrations/mxfp4.py``, ``_convert_moe_packed_tensors``: ``<proj>_blocks``
  uint8 ``[experts, rows, G, 16]`` (16 bytes = 32 codes per block), ``<proj>_scales`` uint8
  ``[experts, rows, G]``; exponent ``scales.to(int32) - 127``; the even element is the LOW
  nibble (``sub[:, 0::2] = lut[blk & 0x0F]``, ``sub[:, 1::2] = lut[blk >> 4]``); code 8 is
  -0.0 (``FP4_VALUES``); the values, ``[experts, rows, G * 32]``, are then transposed to
  ``[experts, G * 32, rows]``, the layout of ``GptOssExperts.gate_up_proj`` /
  ``down_proj`` (``quantizer_mxfp4.py`` maps ``gate_up_proj`` to ``gate_up_proj_blocks`` and
  ``gate_up_proj_scales``).
* vLLM ``model_executor/models/gpt_oss.py``, ``GptOssModel.load_weights``: views
  ``gate_up_proj_blocks`` ``(E, 2 * N, block_size, entry_per_block)`` as ``(E, 2 * N, -1)``
  for ``w13_weight``: the ``rows`` dimension is the output features.

Every product ``e2m1 * 2**k`` (two significant bits, ``k`` in -127..127) is exact in float64; it
is rounded once, half to even, to the output dtype by ``rounding.round_exact`` (a product past
the dtype's range becomes inf, which the caller refuses).
"""

from __future__ import annotations

import numpy as np
import torch

from .kernel_args import check_out_dtype, row_chunks, torch_device
from .rounding import round_exact

#: Bytes per 32-element block (two e2m1 codes per byte).
MXFP4_BLOCK_BYTES = 16
#: Elements that share one E8M0 scale.
MXFP4_BLOCK = 32

# The values of a byte's low and high nibble, [256, 2] float64 (code 8 is -0.0, as in
# transformers' FP4_VALUES).
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1 = np.array(_MAGNITUDES + tuple(-v for v in _MAGNITUDES), dtype=np.float64)
_PAIRS = np.stack((_E2M1[np.arange(256) & 0x0F], _E2M1[np.arange(256) >> 4]), axis=-1)

# 2 ** (byte - 127) for every E8M0 byte, float64; byte 255 is NaN.
_E8M0 = np.array([np.ldexp(1.0, b - 127) for b in range(255)] + [np.nan], dtype=np.float64)


def mxfp4_gpt_oss_shape(blocks_shape, scales_shape) -> tuple[int, int, int]:
    """The dequantized ``[experts, G * 32, rows]`` shape of gpt-oss ``blocks`` / ``scales``.

    Raises:
        ValueError: ``blocks`` is not ``[experts, rows, G, 16]`` or ``scales`` not
            ``[experts, rows, G]``; the message gives both shapes.
    """
    b, s = tuple(int(d) for d in blocks_shape), tuple(int(d) for d in scales_shape)
    if len(b) != 4 or b[-1] != MXFP4_BLOCK_BYTES:
        raise ValueError(f"MXFP4 blocks must be [experts, rows, blocks, {MXFP4_BLOCK_BYTES}] "
                         f"(gpt-oss layout), got shape {list(b)}")
    if s != b[:-1]:
        raise ValueError(f"MXFP4 scales have shape {list(s)}, expected {list(b[:-1])} (one "
                         f"per {MXFP4_BLOCK}-element block of blocks {list(b)})")
    return b[0], b[2] * MXFP4_BLOCK, b[1]


def dequantize_mxfp4_gpt_oss(blocks: torch.Tensor, scales: torch.Tensor,
                             out_dtype: torch.dtype = torch.bfloat16, *,
                             device: str = "cpu", on_device: bool = False) -> torch.Tensor:
    """Dequantize one gpt-oss MXFP4 expert weight.

    ``W[e, g * 32 + j, r] = e2m1(code j of blocks[e, r, g]) * 2 ** (scales[e, r, g] - 127)``.

    Args:
        blocks: uint8 ``[experts, rows, G, 16]``.
        scales: E8M0 bytes ``[experts, rows, G]``, uint8 (gpt-oss) or float8_e8m0fnu.
        out_dtype: bfloat16, float16 or float32.
        device: where the arithmetic runs. The result is on the CPU.
        on_device: return the result on ``device`` instead (no copy back, no wait for it).

    Returns:
        ``[experts, G * 32, rows]`` in ``out_dtype``, on the CPU.

    Raises:
        ValueError: wrong dtypes or shapes.
    """
    check_out_dtype(out_dtype)
    if blocks.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks must be uint8, got {blocks.dtype}")
    if scales.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise ValueError(f"MXFP4 scales must be E8M0 bytes (uint8), got {scales.dtype}")
    experts, k, rows = mxfp4_gpt_oss_shape(blocks.shape, scales.shape)
    scales = scales.view(torch.uint8)
    dev = torch_device(device)
    out = torch.empty((experts, k, rows), dtype=out_dtype, device=dev)
    for e in range(experts):
        for r0, r1 in row_chunks(rows, k, dev=dev):
            values = _values(blocks[e, r0:r1], scales[e, r0:r1], dev)
            round_exact(values, out_dtype, out=out[e, :, r0:r1].T)
    return out if on_device else out.cpu()


def _values(blocks: torch.Tensor, scales: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """The exact float64 values ``[rows, G * 32]`` of ``blocks`` ``[rows, G, 16]`` and
    ``scales`` ``[rows, G]``."""
    rows, groups = scales.shape
    if dev.type == "cpu":
        pairs = torch.from_numpy(np.take(_PAIRS, blocks.contiguous().numpy(), axis=0))
        scale = torch.from_numpy(np.take(_E8M0, scales.contiguous().numpy()))
    else:
        b = blocks.to(dev).to(torch.int64)
        pairs = torch.from_numpy(_PAIRS).to(dev)[b]
        scale = torch.from_numpy(_E8M0).to(dev)[scales.to(dev).to(torch.int64)]
    values = pairs.reshape(rows, groups, MXFP4_BLOCK) * scale.unsqueeze(-1)
    return values.reshape(rows, groups * MXFP4_BLOCK)
