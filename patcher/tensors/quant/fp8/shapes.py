"""Shape checks of FP8 weights and their scales, usable on header metadata alone (before any
tensor data is read)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..kernel_args import shape_tuple


def fp8_block_scale_shape(weight_shape: Sequence[int],
                          block: tuple[int, int] = (128, 128)) -> tuple[int, int]:
    """Expected block-scale shape for a 2-D block-quantized weight.

    Args:
        weight_shape: ``(M, N)`` of the FP8 weight.
        block: ``(bm, bn)`` block size (DeepSeek-V3: ``weight_block_size`` = ``[128, 128]``).

    Returns:
        ``(ceil(M / bm), ceil(N / bn))``.
    """
    bm, bn = check_block(block)
    m, n = shape_tuple(weight_shape)
    return (math.ceil(m / bm), math.ceil(n / bn))


def squeezed_block_scale_shape(grid: tuple[int, int]) -> tuple[int, ...]:
    """The shape of a ``grid`` of block scales with its size-1 dimensions dropped.

    transformers 5.x saves the ``weight_scale_inv`` of MoE expert weights that way (``[2]`` for
    a ``[256, 128]`` weight in 128 x 128 blocks, not ``[2, 1]``). A squeezed scale is read
    unambiguously only when the grid has at most one dimension larger than 1: then the values
    are in the grid's order. For a grid with two, squeezing changes nothing, and a 1-D scale
    cannot say which order its values are in.
    """
    return tuple(d for d in grid if d != 1)


def check_fp8_block_shapes(weight_shape: Sequence[int], scale_shape: Sequence[int],
                           block: tuple[int, int] = (128, 128)) -> None:
    """Validate a block-FP8 weight/scale pair by shape.

    Args:
        weight_shape: shape of the FP8 weight; must be 2-D.
        scale_shape: shape of its ``weight_scale_inv`` (or compressed-tensors block
            ``weight_scale``): the grid ``(ceil(M/bm), ceil(N/bn))``, or that grid squeezed
            (see ``squeezed_block_scale_shape``).
        block: ``(bm, bn)`` block size.

    Raises:
        ValueError: the weight is not 2-D, or the scale is neither shape.
    """
    ws, ss = shape_tuple(weight_shape), shape_tuple(scale_shape)
    if len(ws) != 2:
        raise ValueError(f"block-FP8 weight must be 2-D, got shape {list(ws)}")
    expected = fp8_block_scale_shape(ws, block)
    if ss not in (expected, squeezed_block_scale_shape(expected)):
        raise ValueError(
            f"block scale has shape {list(ss)}, expected {list(expected)} "
            f"(ceil of weight shape {list(ws)} / block {list(block)}){_squeeze_note(expected)}")


def _squeeze_note(grid: tuple[int, int]) -> str:
    squeezed = squeezed_block_scale_shape(grid)
    if squeezed == grid:
        return ""
    return f" or {list(squeezed)} (squeezed)"


def check_fp8_scale_shape(weight_shape: Sequence[int], scale_shape: Sequence[int]) -> str:
    """Validate a per-tensor or per-channel FP8 scale by shape.

    Accepted: one value (``[]``, ``[1]``, ``[1, 1]``) for per-tensor; ``[out, 1]``
    (compressed-tensors channel) or ``[out]`` (ModelOpt ``FP8_PC_PT``) for a 2-D weight.

    Args:
        weight_shape: shape of the FP8 weight.
        scale_shape: shape of its ``weight_scale``.

    Returns:
        ``"tensor"`` or ``"channel"``.

    Raises:
        ValueError: any other scale shape.
    """
    ws, ss = shape_tuple(weight_shape), shape_tuple(scale_shape)
    if math.prod(ss) == 1 and len(ss) <= 2:
        return "tensor"
    if len(ws) == 2 and ss in ((ws[0], 1), (ws[0],)):
        return "channel"
    expected = "[] or [1] (per tensor)"
    if len(ws) == 2:
        expected += f", [{ws[0]}, 1] or [{ws[0]}] (per channel)"
    raise ValueError(f"FP8 scale has shape {list(ss)}, expected {expected} "
                     f"for weight shape {list(ws)}")


def check_block(block: tuple[int, int]) -> tuple[int, int]:
    """``block`` as two positive ints ``(bm, bn)``; ValueError if it is anything else."""
    if len(block) != 2 or any(int(b) != b or b <= 0 for b in block):
        raise ValueError(f"block must be two positive integers, got {block!r}")
    return int(block[0]), int(block[1])
