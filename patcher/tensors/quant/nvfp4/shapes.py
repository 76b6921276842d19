"""Shape checks of NVFP4 weights and their scales, usable on header metadata alone."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..kernel_args import shape_tuple

#: Elements that share one ``weight_scale`` value.
NVFP4_GROUP_SIZE = 16


def nvfp4_unpacked_shape(packed_shape: Sequence[int]) -> tuple[int, ...]:
    """Shape of the dequantized weight for a packed ``[..., in/2]`` uint8 weight.

    Args:
        packed_shape: shape of ``weight`` (ModelOpt) or ``weight_packed`` (compressed-tensors).

    Returns:
        ``(..., in)``.
    """
    ps = shape_tuple(packed_shape)
    if not ps:
        raise ValueError("packed NVFP4 weight must have at least one dimension, got a scalar")
    return (*ps[:-1], ps[-1] * 2)


def check_nvfp4_shapes(packed_shape: Sequence[int], scale_shape: Sequence[int],
                       global_scale_shape: Sequence[int] = (), *,
                       names: tuple[str, str, str] = ("weight", "weight_scale",
                                                      "weight_scale_2")) -> tuple[int, ...]:
    """Validate an NVFP4 weight and its companions by shape.

    Args:
        packed_shape: packed uint8 weight, ``[out, in/2]`` (or ``[..., out, in/2]``).
        scale_shape: ``weight_scale``, must be ``[out, in/16]`` (same leading dimensions).
        global_scale_shape: ``weight_scale_2`` / ``weight_global_scale``; must hold one value.
        names: what to call the three tensors in messages (ModelOpt names by default).

    Returns:
        The dequantized weight's shape ``[..., out, in]``.

    Raises:
        ValueError: a shape that breaks the format; the message gives expected and actual shapes.
    """
    ps, ss = shape_tuple(packed_shape), shape_tuple(scale_shape)
    gs = shape_tuple(global_scale_shape)
    w_name, s_name, g_name = names
    if len(ps) < 2:
        raise ValueError(f"NVFP4 {w_name} must be at least 2-D [out, in/2], "
                         f"got shape {list(ps)}")
    full = nvfp4_unpacked_shape(ps)
    k = full[-1]
    if k % NVFP4_GROUP_SIZE:
        raise ValueError(
            f"NVFP4 input dimension must be a multiple of {NVFP4_GROUP_SIZE}: {w_name} shape "
            f"{list(ps)} unpacks to {list(full)} ({k} is not divisible by {NVFP4_GROUP_SIZE})")
    expected = (*full[:-1], k // NVFP4_GROUP_SIZE)
    if ss != expected:
        raise ValueError(
            f"NVFP4 {s_name} has shape {list(ss)}, expected {list(expected)} "
            f"(one scale per {NVFP4_GROUP_SIZE} elements of the unpacked weight {list(full)}; "
            f"{w_name} shape {list(ps)})")
    if math.prod(gs) != 1:
        raise ValueError(f"NVFP4 {g_name} must hold exactly one value, got shape {list(gs)}")
    return full
