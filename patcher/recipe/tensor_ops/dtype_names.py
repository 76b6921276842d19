"""One dtype vocabulary for recipes: every common spelling in, one canonical form out.

The canonical form is the safetensors header's name (``BF16``, ``F32``, ``F8_E4M3``), which is
also what ``inspect`` and ``plan`` print. Accepted, in any letter case: those names, the short
names (``bf16``, ``fp16``, ``fp32``, ``fp8``), torch's names with or without ``torch.``
(``bfloat16``, ``float32``, ``float8_e4m3fn``, ``half``), and numpy-style ``uint8``/``int64``.
"""

from __future__ import annotations

import difflib

from ..schema import SAFETENSORS_DTYPES

_SPELLINGS = {
    "BOOL": ("bool",),
    "U8": ("uint8",), "I8": ("int8",),
    "U16": ("uint16",), "I16": ("int16", "short"),
    "U32": ("uint32",), "I32": ("int32", "int"),
    "U64": ("uint64",), "I64": ("int64", "long"),
    "F16": ("float16", "fp16", "half"),
    "BF16": ("bfloat16",),
    "F32": ("float32", "fp32", "float"),
    "F64": ("float64", "fp64", "double"),
    "C64": ("complex64",),
    "F8_E4M3": ("float8_e4m3fn", "float8_e4m3", "fp8", "fp8_e4m3", "e4m3"),
    "F8_E5M2": ("float8_e5m2", "fp8_e5m2", "e5m2"),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", "fp8_e4m3fnuz"),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", "fp8_e5m2fnuz"),
    "F8_E8M0": ("float8_e8m0fnu", "fp8_e8m0", "e8m0"),
    "F4": ("float4_e2m1fn_x2", "fp4", "e2m1"),
    "F6_E2M3": ("float6_e2m3fn", "fp6_e2m3"),
    "F6_E3M2": ("float6_e3m2fn", "fp6_e3m2"),
}
if set(_SPELLINGS) != set(SAFETENSORS_DTYPES):
    raise RuntimeError("the dtype vocabulary and SAFETENSORS_DTYPES disagree: "
                       f"{sorted(set(_SPELLINGS) ^ set(SAFETENSORS_DTYPES))}")

ALIASES: dict[str, str] = {name.lower(): name for name in SAFETENSORS_DTYPES}
ALIASES.update({s: name for name, spellings in _SPELLINGS.items() for s in spellings})


def canonical_dtype(spelling: str) -> str | None:
    """The safetensors name ``spelling`` stands for, or None if it is no dtype."""
    return ALIASES.get(spelling.strip().lower().removeprefix("torch."))


def dtype_problem(spelling: str, allowed: tuple[str, ...] = SAFETENSORS_DTYPES) -> str | None:
    """Why ``spelling`` is not one of ``allowed`` (canonical names), with a did-you-mean in
    canonical form; None when it is."""
    name = canonical_dtype(spelling)
    if name in allowed:
        return None
    if name is not None:
        alias = f" ({name})" if spelling != name else ""
        return f"dtype {spelling!r}{alias} is not allowed here; use one of " + ", ".join(allowed)
    candidates = [s for s, n in ALIASES.items() if n in allowed]
    close = difflib.get_close_matches(spelling.lower(), candidates, n=1, cutoff=0.6)
    hint = f"did you mean {ALIASES[close[0]]!r}?" if close else "one of " + ", ".join(allowed)
    return f"unknown dtype {spelling!r} ({hint})"


def spellings(allowed: tuple[str, ...] = SAFETENSORS_DTYPES) -> list[str]:
    """Every spelling of the dtypes in ``allowed`` as the JSON schema lists them: the canonical
    names first, then each alias lower-case and torch's names also with ``torch.``."""
    names = list(allowed)
    names += [s for s, n in ALIASES.items() if n in allowed and s != n]
    names += [f"torch.{s}" for s, n in ALIASES.items()
              if n in allowed and s.startswith(("float", "bfloat", "int", "uint", "bool",
                                                 "complex", "half", "double", "short", "long"))]
    return names
