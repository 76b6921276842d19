"""Variants of an example model that declare their FP8 KV cache in exactly one spelling.

vLLM resolves an FP8 KV cache from several places (see recipes/sm120-fp16-kv.yaml). Each variant
here keeps the example's weights (hard links, or copies across filesystems) and rewrites its
config.json / hf_quant_config.json so that exactly one of those places says FP8; every other KV
declaration is removed, or set to null where ModelOpt's nested ``quantization`` object requires the
key. The tests and ``integration/vllm_config.py`` both build their cases with ``make_variant``.

Spellings (``SPELLINGS``):
  shipped                                the example as generated, untouched
  config.kv_cache_scheme                 config.json quantization_config.kv_cache_scheme
  config.kv_cache_quant_algo             config.json quantization_config.kv_cache_quant_algo
  config.quantization.kv_cache_quant_algo  config.json quantization_config in the
                                         hf_quant_config shape ({producer, quantization: {...}})
  config.quantization.kv_cache_scheme    the same shape, kv_cache_scheme inside ``quantization``
  text_config.kv_cache_scheme            the quantization_config moved into text_config
  hf.quantization.kv_cache_quant_algo    no quantization_config in config.json (older ModelOpt
                                         exports): hf_quant_config.json's nested form
  hf.quantization.kv_cache_scheme        the same layout, a kv_cache_scheme in ``quantization``
  hf.kv_cache_quant_algo                 the same layout, hf_quant_config.json flattened

``applicable(model_dir)`` lists the spellings an example can carry without inventing a weight
quantization it does not have: the ``config.*`` spellings need a ``quantization_config``, the
``config.quantization.*``, ``text_config.*`` and ``hf.*`` ones need an hf_quant_config.json to
take the ModelOpt declaration from.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

FP8_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float"}
KV_KEYS = ("kv_cache_scheme", "kv_cache_quant_algo")

SPELLINGS = (
    "shipped",
    "config.kv_cache_scheme",
    "config.kv_cache_quant_algo",
    "config.quantization.kv_cache_quant_algo",
    "config.quantization.kv_cache_scheme",
    "text_config.kv_cache_scheme",
    "hf.quantization.kv_cache_quant_algo",
    "hf.quantization.kv_cache_scheme",
    "hf.kv_cache_quant_algo",
)


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _write(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def applicable(model_dir: str | os.PathLike) -> list[str]:
    """The spellings ``make_variant`` can build from ``model_dir``."""
    root = Path(model_dir)
    config = _read(root / "config.json") or {}
    has_qc = isinstance(config.get("quantization_config"), dict)
    hq = _read(root / "hf_quant_config.json")
    has_hq = isinstance(hq, dict) and isinstance(hq.get("quantization"), dict)
    return [s for s in SPELLINGS
            if s == "shipped"
            or (s.startswith("config.kv") and has_qc)
            or (not s.startswith("config.kv") and has_hq)]


def _strip_kv(quant: dict, *, keep_null: bool) -> dict:
    """``quant`` without KV declarations (``kv_cache_quant_algo: null`` where ``keep_null``)."""
    out = {k: v for k, v in quant.items() if k not in KV_KEYS}
    if keep_null:
        out["kv_cache_quant_algo"] = None
    return out


def _declare(spelling: str, config: dict, hq: dict | None) -> tuple[dict, dict | None]:
    """(config.json, hf_quant_config.json) declaring FP8 KV only in ``spelling``."""
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        config["quantization_config"] = qc = _strip_kv(qc, keep_null=False)
        if isinstance(qc.get("quantization"), dict):
            qc["quantization"] = _strip_kv(qc["quantization"], keep_null=True)
    if hq is not None:
        hq = {**hq, "quantization": _strip_kv(hq["quantization"], keep_null=True)}
    key = spelling.rsplit(".", 1)[-1]
    value = FP8_SCHEME if key == "kv_cache_scheme" else "FP8"
    if spelling in ("config.kv_cache_scheme", "config.kv_cache_quant_algo"):
        qc[key] = copy.deepcopy(value)
    elif spelling.startswith("config.quantization."):
        config["quantization_config"] = {"producer": hq["producer"],
                                         "quantization": dict(hq["quantization"], **{key: value})}
    elif spelling == "text_config.kv_cache_scheme":
        moved = config.pop("quantization_config", None) or _flat_modelopt(hq)
        config.setdefault("text_config", {})["quantization_config"] = dict(moved, **{key: value})
    elif spelling.startswith("hf."):
        config.pop("quantization_config", None)
        inner = dict(hq["quantization"], **{key: copy.deepcopy(value)})
        if key == "kv_cache_scheme":
            inner["kv_cache_quant_algo"] = None
        hq = ({"producer": hq["producer"], "quantization": inner}
              if spelling.startswith("hf.quantization.")
              else {"producer": hq["producer"], **inner})
    else:
        raise ValueError(f"unknown spelling {spelling!r}; expected one of {', '.join(SPELLINGS)}")
    return config, hq


def _flat_modelopt(hq: dict) -> dict:
    """A config.json-style (flat) ModelOpt quantization_config built from hf_quant_config.json."""
    inner = {k: v for k, v in hq["quantization"].items() if k not in KV_KEYS}
    return {**inner, "producer": hq["producer"], "quant_method": "modelopt"}


def make_variant(model_dir: str | os.PathLike, out: str | os.PathLike, spelling: str) -> Path:
    """Write ``model_dir`` declaring its FP8 KV cache only in ``spelling`` to ``out`` (new)."""
    src, dst = Path(model_dir), Path(out)
    if spelling not in applicable(src):
        raise ValueError(f"{src.name} cannot carry spelling {spelling!r}")

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)
    if spelling == "shipped":
        return dst
    for name in ("config.json", "hf_quant_config.json"):   # replace the links, never write
        if (dst / name).is_file():                         # through them into the example
            (dst / name).unlink()
    config, hq = _declare(spelling, _read(src / "config.json"), _read(src / "hf_quant_config.json"))
    _write(dst / "config.json", config)
    if hq is not None:
        _write(dst / "hf_quant_config.json", hq)
    return dst
