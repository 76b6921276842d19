"""``modelpatch inspect``: an exact report of a model directory, from headers and JSON only."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from functools import lru_cache
from typing import Any

from .model_dir import ModelDir
from .safetensors_io import TensorInfo

REPORT_VERSION = 2   # 2: "kv_scales" became "kv_cache_tensors" (scales and affine-KV biases)

SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale",
                  "weight_global_scale", "input_global_scale", "k_scale", "v_scale", "q_scale")
# KV-cache tensors: scales (ModelOpt ``k_proj.k_scale``, compressed-tensors ``self_attn.k_scale``)
# and the biases of ModelOpt's affine FP8 KV cache (FP8_AFFINE_KV_CFG), which its
# ``postprocess_state_dict`` exports as ``k_proj.k_bias`` / ``v_proj.v_bias``.
KV_CACHE_RE = re.compile(r"(^|\.)(k_proj\.k_(scale|bias)|v_proj\.v_(scale|bias)|k_scale|v_scale)$")

# Module groups, first match wins. Routers count as "other".
_GROUPS = [
    ("vision", re.compile(
        r"(^|\.)(vision_tower|vision_model|visual|mm_projector|multi_modal_projector)\.")),
    ("lm_head", re.compile(r"(^|\.)lm_head\.")),
    ("embeddings", re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings)\.")),
    ("norms", re.compile(r"norm[^.]*\.(weight|bias)$")),
    ("shared_experts", re.compile(r"\.shared_experts?\.")),
    ("routed_experts", re.compile(r"\.experts\.")),
    ("attention", re.compile(r"\.(self_attn|attention|attn)\.")),
    ("dense_mlp", re.compile(r"\.mlp\.(gate_proj|up_proj|down_proj|fc1|fc2)\.")),
]
GROUP_NAMES = [name for name, _ in _GROUPS] + ["other"]


_DIGITS = re.compile(r"\d+")


def module_group(name: str) -> str:
    """The module group of a tensor; layer and expert numbers do not matter, so the lookup is
    cached on the name without them (300k tensors share a few hundred shapes of name)."""
    return _group_of_pattern(_DIGITS.sub("0", name))


@lru_cache(maxsize=65536)
def _group_of_pattern(name: str) -> str:
    for group, pattern in _GROUPS:
        if pattern.search(name):
            return group
    return "other"


def is_scale(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in SCALE_SUFFIXES


def logical_params(name: str, info: TensorInfo, names: set[str]) -> int:
    """Parameters a tensor stands for: packed FP4 bytes hold two each."""
    stem = name.rsplit(".", 1)[0]
    packed_fp4 = info.dtype == "U8" and (
        name.endswith(".weight_packed")
        or (name.endswith(".weight") and f"{stem}.weight_scale" in names))
    return info.numel * 2 if packed_fp4 else info.numel


def architectures(config: dict) -> list[dict]:
    """Architectures and model_type of the config and of each nested ``*_config``."""
    found = [{"path": "/", "architectures": config.get("architectures"),
              "model_type": config.get("model_type")}]
    for key, value in config.items():
        if key.endswith("_config") and isinstance(value, dict) and "model_type" in value:
            found.append({"path": f"/{key}", "architectures": value.get("architectures"),
                          "model_type": value.get("model_type")})
    return found


def _quant_config(config: dict) -> tuple[str | None, dict | None]:
    for path, scope in (("/quantization_config", config),
                        ("/text_config/quantization_config", config.get("text_config") or {})):
        if isinstance(scope, dict) and isinstance(scope.get("quantization_config"), dict):
            return path, scope["quantization_config"]
    return None, None


def _kv_label(scheme: Any) -> str | None:
    if not isinstance(scheme, dict):
        return None if scheme is None else str(scheme)
    kind = {"float": "FP", "int": "INT"}.get(scheme.get("type"), str(scheme.get("type")))
    return f"{kind}{scheme.get('num_bits')}"


def _weight_format(qc: dict) -> dict:
    groups = qc.get("config_groups") if isinstance(qc.get("config_groups"), dict) else {}
    weights = next((g.get("weights") for g in groups.values()
                    if isinstance(g, dict) and isinstance(g.get("weights"), dict)), None)
    if weights:
        return {"num_bits": weights.get("num_bits"), "type": weights.get("type"),
                "strategy": weights.get("strategy"), "group_size": weights.get("group_size")}
    if "weight_block_size" in qc:
        return {"type": qc.get("fmt"), "block_size": qc.get("weight_block_size")}
    return {}


def quantization_summary(model: ModelDir) -> dict:
    path, qc = _quant_config(model.config)
    hf = model.hf_quant_config
    hq = hf.get("quantization") if isinstance(hf, dict) else None
    hq = hq if isinstance(hq, dict) else {}
    summary: dict[str, Any] = {"config": None, "hf_quant_config": None, "disagreements": []}
    if qc is not None:
        wf = _weight_format(qc)
        summary["config"] = {
            "path": path, "quant_method": qc.get("quant_method"),
            "quant_algo": qc.get("quant_algo"), "format": qc.get("format"),
            "weights": wf, "group_size": qc.get("group_size", wf.get("group_size")),
            "kv_cache": _kv_label(qc.get("kv_cache_scheme")),
            "ignore": list(qc.get("ignore") or qc.get("modules_to_not_convert") or []),
        }
    if isinstance(hf, dict):
        producer = hf["producer"] if isinstance(hf.get("producer"), dict) else {}
        summary["hf_quant_config"] = {
            "producer": producer.get("name"), "producer_version": producer.get("version"),
            "quant_algo": hq.get("quant_algo"), "group_size": hq.get("group_size"),
            "kv_cache": hq.get("kv_cache_quant_algo", hf.get("kv_cache_quant_algo")),
            "exclude_modules": list(hq.get("exclude_modules") or []),
        }
    summary["disagreements"] = _disagreements(summary["config"], summary["hf_quant_config"])
    return summary


def _disagreements(cfg: dict | None, hf: dict | None) -> list[str]:
    if cfg is None or hf is None:
        return []
    out = []
    method = cfg["quant_method"]
    if isinstance(method, str) and not method.startswith("modelopt") and hf["quant_algo"]:
        shown = f"{method} ({cfg['format']})" if cfg["format"] else method
        out.append(f"format: config.json quant_method {shown} vs hf_quant_config.json ModelOpt "
                   f"{hf['quant_algo']} (a ModelOpt file describing other tensors)")
    if cfg["quant_algo"] and hf["quant_algo"] and cfg["quant_algo"] != hf["quant_algo"]:
        out.append(f"quant_algo: config.json {cfg['quant_algo']} vs hf_quant_config.json "
                   f"{hf['quant_algo']}")
    if cfg["group_size"] and hf["group_size"] and cfg["group_size"] != hf["group_size"]:
        out.append(f"group_size: config.json {cfg['group_size']} vs hf_quant_config.json "
                   f"{hf['group_size']}")
    if bool(cfg["kv_cache"]) != bool(hf["kv_cache"]):
        out.append(f"KV cache: config.json {cfg['kv_cache'] or 'none'} vs hf_quant_config.json "
                   f"{hf['kv_cache'] or 'none'}")
    ignore, exclude = set(map(str, cfg["ignore"])), set(map(str, hf["exclude_modules"]))
    if ignore != exclude:
        only_cfg, only_hf = len(ignore - exclude), len(exclude - ignore)
        out.append(f"ignore lists differ: {only_cfg} only in config.json, {only_hf} only in "
                   f"hf_quant_config.json")
    return out


def tensor_summary(model: ModelDir) -> dict:
    names = set(model.tensor_shards)
    per_dtype: dict[str, Counter] = defaultdict(Counter)
    per_group: dict[str, Counter] = {g: Counter() for g in GROUP_NAMES}
    totals: Counter = Counter()
    for _, info in model.tensors():
        key = "scale_bytes" if is_scale(info.name) else "bytes"
        params = 0 if is_scale(info.name) else logical_params(info.name, info, names)
        for bucket in (totals, per_dtype[info.dtype], per_group[module_group(info.name)]):
            bucket["tensors"] += 1
            bucket["params"] += params
            bucket[key] += info.nbytes
    def plain(c: Counter) -> dict:
        return {k: c[k] for k in ("tensors", "params", "bytes", "scale_bytes")}
    return {"totals": plain(totals),
            "per_dtype": {d: plain(c) for d, c in sorted(per_dtype.items())},
            "per_group": {g: plain(c) for g, c in per_group.items() if c["tensors"]}}


def inspect_model(model: ModelDir) -> dict:
    """The full report as plain data; ``--json`` prints exactly this."""
    shards = [{"name": s, "size": model.shards[s].file_size,
               "tensors": len(model.shards[s].tensors)} for s in model.model_shards]
    kv_tensors = [{"name": info.name, "kind": info.name.rsplit("_", 1)[-1], "dtype": info.dtype,
                   "shape": list(info.shape)}
                  for _, info in model.tensors() if KV_CACHE_RE.search(info.name)]
    index = model.index
    return {
        "report_version": REPORT_VERSION,
        "path": str(model.root),
        "hf_cache_snapshot": model.cache_repo is not None,
        "architectures": architectures(model.config),
        "quantization": quantization_summary(model),
        "tensors": tensor_summary(model),
        "shards": {"count": len(shards), "total_file_bytes": sum(s["size"] for s in shards),
                   "files": shards},
        "kv_cache_tensors": kv_tensors,
        "index": {"present": index is not None,
                  "total_size": index.total_size if index else None,
                  "tensors": len(model.tensor_shards), "healthy": True,
                  "warnings": list(model.warnings)},
        "files": len(model.files),
    }
