"""The registry of quantization schemes: one object per scheme, in ``SCHEMES``.

Each scheme knows, for a primary weight tensor, which companion tensors hold its scales (found by
name anywhere in the model, whatever shard they sit in), which tensors become meaningless once it
is dequantized (activation scales), their dtypes and shapes (checked on header metadata, no torch,
no data), the names and shapes a quantization writes, and its kernels: ``dequantize`` and
``quantize`` import torch (``patcher.tensors.quant``) only when called. Recipe validation reads
the scheme names from here; a new format is one more ``QuantScheme`` in ``SCHEMES``:

- ``fp8-tensor``: ModelOpt FP8 / compressed-tensors float-quantized: ``weight`` F8_E4M3 and
  ``weight_scale`` (scalar, [1] or per channel [out, 1]); ``input_scale`` is dropped.
- ``fp8-block``: DeepSeek-V3: ``weight`` F8_E4M3 and ``weight_scale_inv`` F32
  [ceil(M/bm), ceil(N/bn)], 128x128 blocks unless the recipe or the model's
  ``quantization_config.weight_block_size`` says otherwise.
- ``nvfp4-modelopt``: ``weight`` U8 [out, in/2], ``weight_scale`` F8_E4M3 [out, in/16],
  ``weight_scale_2`` F32 scalar; ``input_scale`` is dropped.
- ``nvfp4-compressed-tensors``: ``weight_packed`` U8, ``weight_scale`` F8_E4M3,
  ``weight_global_scale`` F32 [1]; ``input_global_scale`` is dropped; the output is ``weight``.
  It also quantizes, weights only (compressed-tensors' NVFP4A16: no ``input_global_scale``).
  ModelOpt's NVFP4 is W4A4, whose ``input_scale`` only a calibration can give, so
  ``nvfp4-modelopt`` does not quantize.
- ``mxfp4-gpt-oss``: gpt-oss MoE experts, ``<proj>_blocks`` U8 [experts, rows, G, 16] and
  ``<proj>_scales`` E8M0 (U8 or F8_E8M0) [experts, rows, G]; the output is ``<proj>``
  [experts, G * 32, rows] (see ``patcher.tensors.quant.mxfp4``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

from ..errors import CompanionError, NotThisScheme

NVFP4_GROUP = 16
MXFP4_BLOCK_BYTES = 16          # 32 e2m1 codes, two per byte, share one E8M0 scale


class _Tensor(Protocol):
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Companions:
    inputs: tuple[str, ...]        # scale tensors read by the computation, in kernel order
    dropped: tuple[str, ...]       # tensors removed because they lose their meaning
    output_name: str
    shape: tuple[int, ...]


def _stem(name: str, suffix: str) -> str:
    if not name.endswith("." + suffix):
        raise NotThisScheme(f"expected a tensor name ending in '.{suffix}'")
    return name[: -len(suffix) - 1]


def _need(view: Mapping[str, _Tensor], name: str, dtypes: tuple[str, ...],
          shapes: tuple[tuple[int, ...], ...], what: str) -> None:
    t = view.get(name)
    if t is None:
        raise CompanionError(f"missing {what} {name!r}")
    if t.dtype not in dtypes:
        raise CompanionError(f"{what} {name!r} is {t.dtype}, expected {' or '.join(dtypes)}")
    if tuple(t.shape) not in shapes:
        wanted = " or ".join(str(list(s)) for s in shapes)
        raise CompanionError(f"{what} {name!r} has shape {list(t.shape)}, expected {wanted}")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _matrix(weight: _Tensor, dtype: str) -> tuple[int, int]:
    if weight.dtype != dtype:
        raise NotThisScheme(f"is {weight.dtype}, expected {dtype} for this scheme")
    if len(weight.shape) != 2:
        raise NotThisScheme(f"has shape {list(weight.shape)}, expected a 2-D weight")
    return weight.shape[0], weight.shape[1]


class QuantScheme:
    """One scheme. ``name`` is what recipes write (``dequantize: {scheme: NAME}``);
    ``layouts`` are the checkpoint layouts it quantizes to (none: dequantize only);
    ``fused_scale``: its per-tensor scale is one per vLLM fused layer (``plan.fused_groups``):
    quantizing gives the members of a group the scale of their largest magnitude, passed to
    ``quantize`` as ``amax``;
    ``global_divides``: its second scale divides instead of multiplying (for the overflow bound
    of ``compute``)."""

    name = ""
    weight_suffix = "weight"
    layouts: tuple[str, ...] = ()
    fused_scale = False
    global_divides = False

    def dequantize(self, inputs: list, out_dtype, device: str, block=None):
        """The weight in ``out_dtype`` (a torch dtype) from ``inputs``, the primary tensor then
        the companions in ``Companions.inputs`` order; ``block``: fp8-block's block size. The
        result stays on ``device`` (the shard writer copies it back, overlapping the next
        tensor's compute: ``tensors.writing.cuda_transfer``)."""
        raise NotImplementedError

    def quantize(self, weight, device: str, block=None, amax=None) -> dict:
        """The tensors that stand for ``weight``, on the CPU, by the role
        ``quantized_outputs`` gives them (``weight``, ``scale``...); only schemes with
        ``layouts`` quantize. ``amax``: a fused group's largest magnitude (``fused_scale``)."""
        raise CompanionError(f"scheme {self.name} cannot quantize")

    def companions(self, name: str, view: Mapping[str, _Tensor]) -> Companions:
        raise NotImplementedError

    def quantized_outputs(self, name, shape, layout, block):
        """``[(name, dtype, shape, role), ...]`` that quantizing the weight ``name`` writes, the
        quantized weight first (role ``weight``).

        Raises:
            CompanionError: the weight cannot be quantized by this scheme (its shape).
        """
        raise CompanionError(f"scheme {self.name} cannot quantize")

    def matches(self, name: str, view: Mapping[str, _Tensor]) -> bool:
        try:
            self.companions(name, view)
            return True
        except CompanionError:
            return False


class Fp8Tensor(QuantScheme):
    name = "fp8-tensor"
    layouts = ("modelopt", "compressed-tensors")
    fused_scale = True

    def dequantize(self, inputs, out_dtype, device, block=None):
        from .quant import fp8

        weight, scale = inputs
        return fp8.dequantize_fp8_per_tensor(weight, scale, out_dtype, device=device,
                                             on_device=True)

    def quantize(self, weight, device, block=None, amax=None):
        from .quant import fp8

        q, scale = fp8.quantize_fp8_per_tensor(weight, device=device, amax=amax)
        return {"weight": q, "scale": scale}

    def companions(self, name, view):
        stem = _stem(name, "weight")
        rows, _ = _matrix(view[name], "F8_E4M3")
        scale = f"{stem}.weight_scale"
        _need(view, scale, ("F32", "BF16", "F16"), ((), (1,), (rows, 1), (rows,)), "weight scale")
        dropped = tuple(n for n in (f"{stem}.input_scale",) if n in view)
        return Companions((scale,), dropped, name, view[name].shape)

    def quantized_outputs(self, name, shape, layout, block):
        stem = _stem(name, "weight")
        scale_shape = (1,) if layout == "compressed-tensors" else ()
        return [(name, "F8_E4M3", tuple(shape), "weight"),
                (f"{stem}.weight_scale", "F32", scale_shape, "scale")]


DEFAULT_FP8_BLOCK = (128, 128)


class Fp8Block(QuantScheme):
    """``block`` is the ``(bm, bn)`` block size dequantizing assumes; ``origin`` says where it
    came from (for the message when a scale's shape does not fit it)."""

    name = "fp8-block"
    layouts = ("deepseek", "compressed-tensors")

    def dequantize(self, inputs, out_dtype, device, block=None):
        from .quant import fp8

        weight, scale_inv = inputs
        return fp8.dequantize_fp8_block(weight, scale_inv, out_dtype,
                                        block=tuple(block or DEFAULT_FP8_BLOCK), device=device,
                                        on_device=True)

    def quantize(self, weight, device, block=None, amax=None):
        from .quant import fp8

        q, scale = fp8.quantize_fp8_block(weight, tuple(block or DEFAULT_FP8_BLOCK),
                                          device=device)
        return {"weight": q, "scale": scale}

    def __init__(self, block: tuple[int, int] = DEFAULT_FP8_BLOCK, origin: str = "the default"):
        self.block = (int(block[0]), int(block[1]))
        self.origin = origin

    def companions(self, name, view):
        rows, cols = _matrix(view[name], "F8_E4M3")
        expected = (_ceil_div(rows, self.block[0]), _ceil_div(cols, self.block[1]))
        scale = f"{name}_scale_inv"                       # DeepSeek-V3
        ct_scale = f"{name[:-len('.weight')]}.weight_scale" if name.endswith(".weight") else None
        if scale not in view and ct_scale in view:
            scale = ct_scale                              # compressed-tensors FP8_BLOCK
        elif scale not in view:
            also = f" (or compressed-tensors' {ct_scale!r})" if ct_scale else ""
            raise CompanionError(f"missing block scale {scale!r}{also}")
        try:
            accepted = _block_scale_shapes(expected)
            shapes = accepted if tuple(view[scale].shape) in accepted else (expected,)
            _need(view, scale, ("F32", "BF16", "F16"), shapes, "block scale")
        except CompanionError as exc:
            if tuple(view[scale].shape) in _block_scale_shapes(expected):
                raise
            bm, bn = self.block
            if len(view[scale].shape) == 1 and min(expected) > 1:
                exc = f"{exc} (a 1-D scale fits only one row or one column of blocks)"
            raise CompanionError(f"{exc} for {bm}x{bn} blocks ({self.origin}); if the weights "
                                 f"use another block size, set it in the recipe: "
                                 f"dequantize: {{scheme: fp8-block, block: [BM, BN]}}") from None
        dropped = tuple(n for n in (f"{name[:-len('weight')]}input_scale",) if n in view)
        return Companions((scale,), dropped, name, view[name].shape)

    def quantized_outputs(self, name, shape, layout, block):
        bm, bn = block or self.block
        scale_shape = (_ceil_div(shape[0], bm), _ceil_div(shape[1], bn))
        scale = (f"{_stem(name, 'weight')}.weight_scale" if layout == "compressed-tensors"
                 else f"{name}_scale_inv")
        return [(name, "F8_E4M3", tuple(shape), "weight"), (scale, "F32", scale_shape, "scale")]


def _block_scale_shapes(grid: tuple[int, int]) -> tuple[tuple[int, ...], ...]:
    """The grid of block scales, and the grid with its size-1 dimensions squeezed out, which is
    how transformers 5.x saves MoE expert scales (``[2]`` for a ``[256, 128]`` weight). Only a
    grid with at most one dimension above 1 has a squeezed form: for any other, a 1-D scale
    could not say the order of its values (``patcher.tensors.quant.fp8.shapes`` is the same
    rule)."""
    squeezed = tuple(d for d in grid if d != 1)
    return (grid,) if squeezed == grid else (grid, squeezed)


class _Nvfp4(QuantScheme):
    """NVFP4: packed e2m1 bytes, an F8_E4M3 scale per 16 elements and one global scale; the
    producers differ only in names."""

    global_suffix = ""
    dropped_suffix = ""

    def companions(self, name, view):
        stem = _stem(name, self.weight_suffix)
        rows, half = _matrix(view[name], "U8")
        cols = half * 2
        if cols % NVFP4_GROUP:
            raise CompanionError(f"unpacked width {cols} is not a multiple of {NVFP4_GROUP}")
        scale, global_scale = f"{stem}.weight_scale", f"{stem}.{self.global_suffix}"
        _need(view, scale, ("F8_E4M3",), ((rows, cols // NVFP4_GROUP),), "block scale")
        _need(view, global_scale, ("F32",), ((), (1,)), "global scale")
        dropped = tuple(n for n in (f"{stem}.{self.dropped_suffix}",) if n in view)
        return Companions((scale, global_scale), dropped, f"{stem}.weight", (rows, cols))


class Nvfp4ModelOpt(_Nvfp4):
    name = "nvfp4-modelopt"
    global_suffix = "weight_scale_2"          # multiplies
    dropped_suffix = "input_scale"

    def dequantize(self, inputs, out_dtype, device, block=None):
        from .quant import nvfp4

        return nvfp4.dequantize_nvfp4_modelopt(*inputs, out_dtype, device=device, on_device=True)


class Nvfp4CompressedTensors(_Nvfp4):
    """Quantizes as compressed-tensors' NVFP4A16 preset does (``quantize_nvfp4``): weights only,
    so no ``input_global_scale``."""

    name = "nvfp4-compressed-tensors"
    weight_suffix = "weight_packed"
    global_suffix = "weight_global_scale"     # divides (the reciprocal of weight_scale_2)
    dropped_suffix = "input_global_scale"
    global_divides = True
    fused_scale = True
    layouts = ("compressed-tensors",)

    def quantize(self, weight, device, block=None, amax=None):
        from .quant import nvfp4

        out = nvfp4.quantize_nvfp4(weight, "compressed-tensors", device=device, amax=amax)
        return {"weight": out["weight_packed"], "scale": out["weight_scale"],
                "global_scale": out["weight_global_scale"]}

    def quantized_outputs(self, name, shape, layout, block):
        stem = _stem(name, "weight")
        rows, cols = shape
        if cols % NVFP4_GROUP:
            raise CompanionError(f"has {cols} columns, not a multiple of {NVFP4_GROUP}: NVFP4 "
                                 f"gives each group of {NVFP4_GROUP} inputs one scale")
        return [(f"{stem}.weight_packed", "U8", (rows, cols // 2), "weight"),
                (f"{stem}.weight_scale", "F8_E4M3", (rows, cols // NVFP4_GROUP), "scale"),
                (f"{stem}.weight_global_scale", "F32", (1,), "global_scale")]

    def dequantize(self, inputs, out_dtype, device, block=None):
        from .quant import nvfp4

        return nvfp4.dequantize_nvfp4_compressed_tensors(*inputs, out_dtype, device=device,
                                                         on_device=True)


class Mxfp4GptOss(QuantScheme):
    """gpt-oss MXFP4 experts: ``<proj>_blocks`` and ``<proj>_scales`` give ``<proj>``, transposed
    to the ``[experts, in, out]`` layout of transformers' ``GptOssExperts``."""

    name = "mxfp4-gpt-oss"
    weight_suffix = "_blocks"

    def dequantize(self, inputs, out_dtype, device, block=None):
        from .quant.mxfp4 import dequantize_mxfp4_gpt_oss

        return dequantize_mxfp4_gpt_oss(*inputs, out_dtype, device=device, on_device=True)

    def companions(self, name, view):
        if not name.endswith("_blocks") or name == "_blocks":
            raise NotThisScheme("expected a tensor name ending in '_blocks'")
        blocks = view[name]
        if blocks.dtype != "U8":
            raise NotThisScheme(f"is {blocks.dtype}, expected U8 for this scheme")
        if len(blocks.shape) != 4 or blocks.shape[-1] != MXFP4_BLOCK_BYTES:
            raise CompanionError(f"has shape {list(blocks.shape)}, expected [experts, rows, "
                                 f"blocks, {MXFP4_BLOCK_BYTES}] (gpt-oss MXFP4: 32 e2m1 codes "
                                 f"per {MXFP4_BLOCK_BYTES}-byte block)")
        experts, rows, groups, _ = blocks.shape
        stem = name[: -len("_blocks")]
        scales = f"{stem}_scales"
        _need(view, scales, ("U8", "F8_E8M0"), ((experts, rows, groups),), "E8M0 block scale")
        return Companions((scales,), (), stem, (experts, groups * 2 * MXFP4_BLOCK_BYTES, rows))


SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (
    Fp8Tensor(), Fp8Block(), Nvfp4ModelOpt(), Nvfp4CompressedTensors(), Mxfp4GptOss())}
"""Every scheme by name, in the order ``scheme: auto`` tries them."""


def scheme_named(name: str, fp8_block: Fp8Block | None = None) -> QuantScheme:
    """The scheme called ``name``; ``fp8_block`` replaces the default (128x128) ``fp8-block``."""
    if name == Fp8Block.name and fp8_block is not None:
        return fp8_block
    return SCHEMES[name]


def find_scheme(name: str, view: Mapping[str, _Tensor],
                fp8_block: Fp8Block | None = None) -> QuantScheme:
    """The scheme whose companions ``name`` has (for ``scheme: auto``); ``fp8_block`` as in
    ``scheme_named``.

    Raises:
        CompanionError: no scheme fits; the message says what each plausible scheme missed.
    """
    problems = []
    for scheme in (scheme_named(n, fp8_block) for n in SCHEMES):
        try:
            scheme.companions(name, view)
            return scheme
        except NotThisScheme:
            continue
        except CompanionError as exc:
            problems.append(f"{scheme.name}: {exc}")
    if not problems:
        t = view[name]
        raise CompanionError(f"no quantization scheme stores a weight as {t.dtype} "
                             f"{list(t.shape)} under this name (FP8: F8_E4M3 '.weight'; NVFP4: "
                             f"U8 '.weight' or '.weight_packed'; MXFP4: U8 '_blocks')")
    raise CompanionError("no quantization scheme fits: " + "; ".join(problems))


def config_weight_block(config) -> tuple[tuple[int, int], str] | None:
    """The FP8 block size a model's config.json declares (``quantization_config.
    weight_block_size``, at the top level or in ``text_config``) and where, or None.

    Raises:
        ValueError: the config declares one that is not two positive integers.
    """
    if not isinstance(config, dict):
        return None
    for where, scope in (("", config), ("text_config.", config.get("text_config"))):
        qc = scope.get("quantization_config") if isinstance(scope, dict) else None
        if not isinstance(qc, dict) or qc.get("weight_block_size") is None:
            continue
        value = qc["weight_block_size"]
        key = f"config.json {where}quantization_config.weight_block_size"
        if not (isinstance(value, list) and len(value) == 2 and all(
                isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in value)):
            raise ValueError(f"{key} is {value!r}, expected two positive integers")
        return (value[0], value[1]), f"from {key}"
    return None
