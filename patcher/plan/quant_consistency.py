"""Warnings when a planned output's quantization declarations and its tensors disagree.

After tensor work, the config may still declare quantization for tensors that no longer have it
(a dequantized model whose config says NVFP4 fails to load), or the tensors may be quantized with
no declaration left. Both are legal to write, and both deserve a warning before anything runs.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any, Mapping

from ..recipe.regex_bound import per_name
from .changes import ABSENT, TensorConverted

QUANTIZED_DTYPES = {"F8_E4M3", "F8_E5M2", "F4"}


def _declared(config: Any, hf_quant: Any) -> str | None:
    """A short label of the quantization the configs declare, or None."""
    for scope in (config, (config or {}).get("text_config") if isinstance(config, dict) else None):
        if isinstance(scope, dict) and isinstance(scope.get("quantization_config"), dict):
            qc = scope["quantization_config"]
            return str(qc.get("quant_algo") or qc.get("quant_method") or "quantization")
    if isinstance(hf_quant, dict):
        algo = (hf_quant.get("quantization") or {}).get("quant_algo")
        if algo:
            return str(algo)
    return None


def quantized_tensors(dtypes: Mapping[str, str]) -> list[str]:
    """Names of tensors holding quantized weights: FP8 data, or packed FP4 bytes with scales
    (NVFP4 ``weight`` / ``weight_packed``, gpt-oss MXFP4 ``<proj>_blocks``)."""
    out = []
    for name, dtype in dtypes.items():
        if dtype in QUANTIZED_DTYPES and not name.endswith("_scale"):
            out.append(name)
        elif dtype == "U8" and (name.endswith(".weight_packed") or (
                name.endswith(".weight") and f"{name[:-7]}.weight_scale" in dtypes) or (
                name.endswith("_blocks") and f"{name[:-7]}_scales" in dtypes)):
            out.append(name)
    return out


def skip_lists(config: Any, hf_quant: Any) -> list[tuple[str, list[str]]]:
    """``(where, patterns)`` of every declaration of quantization in the final configs, with the
    modules it leaves unquantized: ``quantization_config.ignore`` (compressed-tensors, and
    ModelOpt in config.json) and ``exclude_modules`` (ModelOpt), at the top level or in
    ``text_config``; hf_quant_config.json's ``quantization.exclude_modules``."""
    out = []
    for where, scope in (("config.json", config),
                         ("config.json text_config",
                          config.get("text_config") if isinstance(config, dict) else None)):
        qc = scope.get("quantization_config") if isinstance(scope, dict) else None
        if isinstance(qc, dict):
            out.append((f"{where} quantization_config",
                        _strings(qc.get("ignore")) + _strings(qc.get("exclude_modules"))))
    q = hf_quant.get("quantization") if isinstance(hf_quant, dict) else None
    if isinstance(q, dict) and q.get("quant_algo"):
        out.append(("hf_quant_config.json", _strings(q.get("exclude_modules"))))
    return out


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def module_skipped(module: str, patterns: list[str]) -> bool:
    """Whether a skip list names ``module``: exactly, by an fnmatch pattern (ModelOpt's
    ``exclude_modules``: ``*self_attn*``), or by a ``re:`` regex (compressed-tensors' ``ignore``,
    matched from the start of the name as compressed-tensors does with ``re.match``)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            try:
                if re.match(pattern[3:], module):
                    return True
            except (re.error, RecursionError):      # not a pattern compressed-tensors reads
                continue
        elif pattern == module or fnmatch.fnmatchcase(module, pattern):
            return True
    return False


def _not_skipped(config: Any, hf_quant: Any, changes: list) -> list[str]:
    """The dequantized tensors (output names) that some declaration of quantization still
    covers: their module is missing from its ignore/exclude list."""
    lists = skip_lists(config, hf_quant)
    names = [c.tensor if c.to is ABSENT else c.to for c in changes
             if isinstance(c, TensorConverted) and c.how.startswith("dequantize")]
    out = []
    # the lists' re: entries come from the model: their matching draws on the plan's budget
    with per_name("the model's ignore/exclude list patterns", "config.json", len(names),
                  kind="module name") as clock:
        for name in names:
            module = name.rsplit(".", 1)[0]
            clock.start(module)
            if any(not module_skipped(module, patterns) for _where, patterns in lists):
                out.append(name)
    return out


def quantization_warnings(config: Any, hf_quant: Any, dtypes: Mapping[str, str],
                          changes: list) -> list[str]:
    declared = _declared(config, hf_quant)
    quantized = quantized_tensors(dtypes)
    dequantized = _not_skipped(config, hf_quant, changes) if declared else []
    warnings = []
    if declared and not quantized:
        warnings.append(f"the output config still declares {declared} quantization but no tensor "
                        f"is quantized any more: drop quantization_config (and "
                        f"hf_quant_config.json) in the recipe")
    elif declared and dequantized:
        warnings.append(f"{len(dequantized)} tensors were dequantized while the config still "
                        f"declares {declared} for the model (e.g. {dequantized[0]}): add their "
                        f"modules to the ignore/exclude lists")
    if quantized and not declared:
        warnings.append(f"{len(quantized)} tensors are quantized (e.g. {quantized[0]}) but the "
                        f"output config declares no quantization")
    return warnings


def final_json(replaced_content: bytes | None, dropped: bool, original: Any) -> Any:
    """A JSON file as the output will have it."""
    if dropped:
        return None
    if replaced_content is not None:
        return json.loads(replaced_content)
    return original
