"""The typed form of a recipe's ``tensors:`` section: selections, actions, and the dtype and
quantization-scheme names they use (re-exported by ``patcher.recipe.schema``)."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Union

from ...tensors.schemes import SCHEMES

# safetensors dtype names (the header's "dtype" field).
SAFETENSORS_DTYPES = (
    "BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64",
    "F16", "BF16", "F32", "F64", "C64",
    "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0",
    "F4", "F6_E2M3", "F6_E3M2",
)
FLOAT_TARGETS = ("BF16", "F16", "F32")     # cast and dequantize targets, canonical names
# Scheme names come from the registry (patcher.tensors.schemes, torch-free).
DEQUANT_SCHEMES = (*SCHEMES, "auto")
QUANT_SCHEMES = tuple(name for name, scheme in SCHEMES.items() if scheme.layouts)
QUANT_LAYOUTS = ("modelopt", "deepseek", "compressed-tensors")
# (scheme, layout) pairs a checkpoint format exists for: ModelOpt FP8 is per-tensor
# (weight_scale), DeepSeek-V3 is 128x128 blocks (weight_scale_inv), compressed-tensors has both,
# and NVFP4 weights only (NVFP4A16; ModelOpt's NVFP4 is W4A4 and needs a calibration).
QUANT_COMBINATIONS = tuple((name, layout) for name, scheme in SCHEMES.items()
                           for layout in scheme.layouts)
DEFAULT_BLOCK = (128, 128)
# The schemes that take ``block: [bm, bn]``: to quantize, and to dequantize (auto may find one).
QUANT_BLOCK_SCHEMES = ("fp8-block",)
DEQUANT_BLOCK_SCHEMES = (*QUANT_BLOCK_SCHEMES, "auto")

# The keys of each tensor action that takes a mapping, and those it needs (the loader checks
# them, ``patcher.recipe.json_schema`` writes them into the JSON Schema).
ACTION_KEYS = {"rename": ("pattern", "to"), "copy": ("pattern", "to"),
               "split": ("pattern", "to"), "scale": ("reciprocal", "cast", "reshape"),
               "dequantize": ("scheme", "to", "block"), "quantize": ("scheme", "layout", "block")}
ACTION_REQUIRED = {"rename": ("to",), "copy": ("to",), "split": ("pattern", "to"),
                   "scale": (), "dequantize": ("scheme",), "quantize": ("scheme", "layout")}


# ---------------------------------------------------------------------------- tensor ops

@dataclass(frozen=True)
class TensorSelect:
    """Which tensors an op applies to: names matching ANY glob (``fnmatch``, case-sensitive, on
    the full name) or ANY regex (``re.search``), and, if ``dtypes`` is set, of one of those
    safetensors dtypes. Exactly one of ``globs``/``regexes`` is non-empty."""

    globs: tuple[str, ...]
    regexes: tuple[str, ...]
    dtypes: tuple[str, ...] | None
    loc: str
    # ``layers: ">= 61"``: (comparison, bound); the bound is an int once the recipe is bound to a
    # model (a ``recipe.expr.Template`` before). Only names with a ``layers.N.`` part match.
    layers: tuple[str, Any] | None = None
    # ``group: [attention, ...]``: the module groups ``inspect`` reports (inspect_model)
    groups: tuple[str, ...] | None = None

    def matches(self, name: str, dtype: str | None = None) -> bool:
        if self.dtypes is not None and dtype is not None and dtype not in self.dtypes:
            return False
        if self.layers is not None and not _layer_matches(name, *self.layers):
            return False
        if self.groups is not None:
            from ...model.inspect_model import module_group

            if module_group(name) not in self.groups:
                return False
        if not self.globs and not self.regexes:
            return True
        if self.globs:
            return any(fnmatch.fnmatchcase(name, g) for g in self.globs)
        return any(re.search(r, name) for r in self.regexes)


LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
LAYER_COMPARISONS = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b,
                     "<=": lambda a, b: a <= b, "<": lambda a, b: a < b,
                     "==": lambda a, b: a == b}


def _layer_matches(name: str, comparison: str, bound: Any) -> bool:
    found = LAYER_RE.search(name)
    return found is not None and LAYER_COMPARISONS[comparison](int(found.group(1)), bound)


@dataclass(frozen=True)
class DropTensors:
    kind = "drop"


@dataclass(frozen=True)
class RenameTensors:
    """New name = ``re.sub(pattern, to, name)``."""

    pattern: str
    to: str
    kind = "rename"


@dataclass(frozen=True)
class CopyTensors:
    """Add a byte-identical copy of each selected tensor named ``re.sub(pattern, to, name)``."""

    pattern: str
    to: str
    kind = "copy"


@dataclass(frozen=True)
class CastTensors:
    to: str  # one of FLOAT_TARGETS
    kind = "cast"


@dataclass(frozen=True)
class DequantizeTensors:
    scheme: str  # one of DEQUANT_SCHEMES
    to: str      # one of FLOAT_TARGETS
    # fp8-block (or auto) only: (bm, bn); None: the config's weight_block_size, else 128x128
    block: tuple[int, int] | None = None
    kind = "dequantize"


@dataclass(frozen=True)
class QuantizeTensors:
    scheme: str                      # one of QUANT_SCHEMES
    layout: str                      # one of QUANT_LAYOUTS
    block: tuple[int, int] | None    # fp8-block only; default (128, 128)
    kind = "quantize"


@dataclass(frozen=True)
class SplitTensors:
    """Replace each selected tensor by byte-identical copies named ``re.sub(pattern, to[i],
    name)`` (a name equal to the source's keeps it)."""

    pattern: str
    to: tuple[str, ...]
    kind = "split"


@dataclass(frozen=True)
class ScaleTensors:
    """Elementwise scale math, in this order: ``reciprocal`` (``exact`` or ``nearest``, or None),
    ``cast`` to a float dtype (None: keep), ``reshape`` to a shape with the same element count
    (None: keep). The rules: ``patcher.tensors.scale_math``."""

    reciprocal: str | None
    cast: str | None
    reshape: tuple[int, ...] | None
    kind = "scale"


@dataclass(frozen=True)
class RefuseTensors:
    """A tensor guard: the model is refused (exit 1, like ``requires``) when the selection
    matches any tensor; ``message`` says why."""

    message: str
    kind = "refuse"


TensorAction = Union[DropTensors, RenameTensors, CopyTensors, SplitTensors, ScaleTensors,
                     RefuseTensors, CastTensors, DequantizeTensors, QuantizeTensors]


@dataclass(frozen=True)
class TensorOp:
    """Apply ``action`` to every tensor ``select`` matches. An empty selection is a PlanError
    unless ``allow_empty``; with ``refuse_empty`` (the reason), the recipe refuses the model.
    With ``refuse_unless_equal`` (a tensor name), the recipe refuses the model unless every
    selected tensor has that tensor's dtype, shape and bytes. ``when``: a condition on the
    model's JSON files (a ``requires:`` entry); binding drops the op where it does not hold."""

    select: TensorSelect
    action: TensorAction
    allow_empty: bool
    loc: str
    refuse_empty: str | None = None
    refuse_unless_equal: str | None = None
    when: Any = None

    @property
    def kind(self) -> str:
        return self.action.kind
