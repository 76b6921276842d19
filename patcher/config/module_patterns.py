"""Module-name patterns of quantization configs, translated between their matchers.

- ModelOpt's ``exclude_modules`` (hf_quant_config.json, and the ``ignore`` its export writes into
  config.json) are ``fnmatch`` patterns over ModelOpt's module names: ``*`` and ``?`` match any
  characters, dots included, and ``[...]`` a set; ``model.layers.0.self_attn*``,
  ``*vision_tower*``.
- compressed-tensors' ``ignore`` (``match_name``) and vLLM's (``should_ignore_layer``, through
  ``_is_equal_or_regex_match``) accept an exact module name, or ``re:REGEX`` tried with
  ``re.match`` (anchored at the start only). A wildcard copied into ``ignore`` matches nothing, so
  the modules it meant to keep in BF16 get the NVFP4 scheme.
- vLLM maps an exact name of ``ignore`` to its own module names (``apply_vllm_mapper``, through the
  model's ``hf_to_vllm_mapper``) but keeps a ``re:`` entry as written.

``ignore_from_modelopt`` turns ModelOpt's list into compressed-tensors' entries: an exact name
stays exact (vLLM maps it), a pattern becomes ``re:`` with ``$`` (fnmatch matches the whole name).
Multimodal ModelOpt exports name the text model ``language_model.model.*`` and its head
``language_model.lm_head`` (the names of the remote-code classes they were made from, Kimi-K2.5's
among them), where transformers' own classes say ``model.language_model.*`` and ``lm_head`` and
vLLM's ``language_model.model.*`` and ``language_model.lm_head``; such an entry becomes a ``re:``
entry that matches every one of those spellings of the same module (vLLM leaves it as written).
"""

from __future__ import annotations

import re

_WILDCARD = re.compile(r"[*?\[]")

#: ModelOpt's name prefix -> a regex matching the same modules under every consumer's spelling
_PREFIX_SPELLINGS = (
    ("language_model.model.", r"(?:language_model\.model\.|model\.language_model\.)"),
    ("language_model.lm_head", r"(?:language_model\.)?lm_head"),
    ("model.language_model.", r"(?:language_model\.model\.|model\.language_model\.)"),
    ("vision_tower", r"(?:model\.)?vision_tower"),
    ("multi_modal_projector", r"(?:model\.)?multi_modal_projector"),
)


def ignore_from_modelopt(patterns: list) -> list[str]:
    """compressed-tensors ``ignore`` entries matching exactly the modules ModelOpt's
    ``exclude_modules`` ``patterns`` match (see the module docstring). A non-string entry raises
    ``ValueError``."""
    out: list[str] = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"a ModelOpt exclude_modules entry must be a non-empty string, "
                             f"got {pattern!r}")
        entry = _entry(pattern)
        if entry not in out:
            out.append(entry)
    return out


def _entry(pattern: str) -> str:
    prefix, rest = "", pattern
    for modelopt, spellings in _PREFIX_SPELLINGS:
        if pattern.startswith(modelopt):
            prefix, rest = spellings, pattern[len(modelopt):]
            break
    if not prefix and not _WILDCARD.search(pattern):
        return pattern
    return f"re:{prefix}{_fnmatch_regex(rest)}$"


def _fnmatch_regex(pattern: str) -> str:
    """``pattern``'s fnmatch meaning as a regex body (no anchors)."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and pattern[j] in "!]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:                          # no closing bracket: a literal "["
                out.append(r"\[")
                continue
            body = pattern[i:j].replace("\\", r"\\")
            i = j + 1
            if body.startswith("!"):
                body = "^" + body[1:]
            elif body.startswith("^"):
                body = "\\" + body
            out.append(f"[{body}]")
        else:
            out.append(re.escape(c))
    return "".join(out)
