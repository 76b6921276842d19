"""Facts about a whole model that doctor rules read under ``@model`` (``diagnose.model_facts``),
beyond what one JSON file says: how the EOS token is spelled across the three files, which
quantization ignore entries match nothing and which unquantized modules no entry covers, how the
KV-cache scale tensors are named, and which layers lie past ``num_hidden_layers``.

Each is computed from headers and JSON only, and only when a rule first reads it.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from ..model.model_dir import ModelDir

# --- EOS ------------------------------------------------------------------------------------


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in value):
        return list(value)
    return None


def _token_text(tokenizer_config: dict) -> str | None:
    eos = tokenizer_config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def _token_id(model: ModelDir, tokenizer_config: dict, text: str) -> int | None:
    """The id of the added token ``text``: tokenizer_config.json's added_tokens_decoder, else
    tokenizer.json's added_tokens."""
    decoder = tokenizer_config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for key, token in decoder.items():
            if isinstance(token, dict) and token.get("content") == text and key.isdigit():
                return int(key)
    tokenizer = model.json("tokenizer.json") if model.has("tokenizer.json") else None
    added = tokenizer.get("added_tokens") if isinstance(tokenizer, dict) else None
    for token in added if isinstance(added, list) else []:
        if isinstance(token, dict) and token.get("content") == text and \
                isinstance(token.get("id"), int):
            return token["id"]
    return None


def eos_facts(model: ModelDir) -> dict:
    """``disagreements``: one line each where the files stop generation at different tokens;
    ``fix``: the params of ``fix-eos`` that make them agree (every id any file names, the
    tokenizer's EOS first), or None when the tokenizer's EOS id cannot be found."""
    config = model.json_object("config.json") or {}
    config = config.get("text_config") if "eos_token_id" not in config and isinstance(
        config.get("text_config"), dict) else config
    generation = model.json_object("generation_config.json") if \
        model.has("generation_config.json") else None
    tokenizer = model.json_object("tokenizer_config.json") if \
        model.has("tokenizer_config.json") else None
    in_config = _ids(config.get("eos_token_id"))
    in_generation = _ids((generation or {}).get("eos_token_id"))
    text = _token_text(tokenizer or {})
    token = _token_id(model, tokenizer, text) if tokenizer and text else None
    lines = []
    if in_config and in_generation and set(in_config) - set(in_generation):
        lines.append(f"config.json eos_token_id {in_config} is not all in "
                     f"generation_config.json eos_token_id {in_generation} (generation follows "
                     f"generation_config.json)")
    stops = in_generation or in_config
    if token is not None and stops and token not in stops:
        where = "generation_config.json" if in_generation else "config.json"
        lines.append(f"tokenizer_config.json eos_token {text!r} (id {token}) is not among "
                     f"{where} eos_token_id {stops}: generation does not stop at it")
    fix = None
    if lines and token is not None and generation is not None:
        ids = list(dict.fromkeys([token, *(in_generation or []), *(in_config or [])]))
        fix = {"eos_token_id": ids, "eos_token": text}
    return {"disagreements": lines, "fix": fix}


# --- quantization ignore lists ----------------------------------------------------------------

_IGNORE_KEYS = ("ignore", "exclude_modules", "modules_to_not_convert", "ignored_layers",
                "exclude")
# Companions that mark a Linear's weight as quantized (ModelOpt, compressed-tensors, FP8 block,
# GPTQ/AWQ): a module with none of them beside its weight is stored unquantized.
_QUANT_PARTS = ("weight_scale", "weight_scale_inv", "weight_packed", "qweight", "scales",
                "weight_scale_2", "weight_global_scale")


def _ignore_entries(model: ModelDir) -> tuple[str, list[str]] | None:
    """(where, entries) of the quantization config's ignore list, if the model has one."""
    sources = []
    config = model.json_object("config.json") or {}
    for prefix, doc in (("config.json /quantization_config", config.get("quantization_config")),
                        ("config.json /text_config/quantization_config",
                         (config.get("text_config") or {}).get("quantization_config")
                         if isinstance(config.get("text_config"), dict) else None)):
        if isinstance(doc, dict):
            sources.append((prefix, doc))
    quant = model.json_object("hf_quant_config.json") if model.has("hf_quant_config.json") \
        else None
    if isinstance(quant, dict) and isinstance(quant.get("quantization"), dict):
        sources.append(("hf_quant_config.json /quantization", quant["quantization"]))
    for where, doc in sources:
        for key in _IGNORE_KEYS:
            entries = doc.get(key)
            if isinstance(entries, list) and all(isinstance(e, str) for e in entries):
                return f"{where}/{key}", entries
    return None


def _matcher(entry: str):
    """How engines read an ignore entry: ``re:`` a regular expression (compressed-tensors), a
    shell wildcard (ModelOpt, Quark), else a module name or a dotted prefix of one."""
    if entry.startswith("re:"):
        try:
            pattern = re.compile(entry[3:])
        except re.error:
            return lambda name: False
        return lambda name: pattern.fullmatch(name) is not None or \
            pattern.match(name) is not None
    if any(c in entry for c in "*?["):
        return lambda name: fnmatch.fnmatchcase(name, entry)
    return lambda name: name == entry or name.startswith(entry + ".") or \
        name.endswith("." + entry) or ("." + entry + ".") in f".{name}."


def _modules(model: ModelDir) -> dict[str, set[str]]:
    """Module name -> the leaf names of its tensors (``weight``, ``weight_scale``, ...)."""
    modules: dict[str, set[str]] = {}
    for name in model.tensor_shards:
        module, _, leaf = name.rpartition(".")
        modules.setdefault(module, set()).add(leaf)
    return modules


def ignore_facts(model: ModelDir) -> dict:
    """``list``: where the ignore list is; ``unmatched``: its entries that match no module of
    the checkpoint; ``uncovered``: modules stored unquantized although modules of the same kind
    (same last name, e.g. ``q_proj``) are quantized, and matched by no entry."""
    found = _ignore_entries(model)
    if found is None:
        return {"list": None, "unmatched": [], "uncovered": []}
    where, entries = found
    modules = _modules(model)
    if not modules:         # no tensors read (a directory of configs): nothing to match
        return {"list": where, "unmatched": [], "uncovered": []}
    matchers = [(e, _matcher(e)) for e in entries]
    unmatched = [e for e, match in matchers if not any(match(m) for m in modules)]
    quantized = {m for m, leaves in modules.items() if leaves & set(_QUANT_PARTS)}
    kinds = {m.rpartition(".")[2] for m in quantized}
    uncovered = sorted(
        m for m, leaves in modules.items()
        if m not in quantized and "weight" in leaves and m.rpartition(".")[2] in kinds
        and _is_matrix(model, m) and not any(match(m) for _, match in matchers))
    return {"list": where, "unmatched": unmatched, "uncovered": uncovered[:20],
            "uncovered_count": len(uncovered)}


def _is_matrix(model: ModelDir, module: str) -> bool:
    info = model.tensor(module + ".weight")
    return info is not None and len(info.shape) == 2 and info.dtype in ("BF16", "F16", "F32")


# --- KV-cache scales, extra layers -----------------------------------------------------------

KV_SCALE_NAMINGS = {
    "fused": re.compile(r"\.qkv_proj\.[kv]_scale$"),              # llm-compressor
    "per_projection": re.compile(r"\.[kv]_proj\.[kv]_scale$"),    # ModelOpt
    "kv_scale": re.compile(r"\.kv_scale$"),                        # deprecated single scale
    "attention": re.compile(r"\.self_attn\.(?:attn\.)?[kv]_scale$"),  # compressed-tensors
}


def kv_scale_names(model: ModelDir) -> list[str]:
    """The namings (``KV_SCALE_NAMINGS``) of the KV-cache scale tensors the model has."""
    names = [n for n in model.tensor_shards if n.endswith(("_scale", ".kv_scale"))]
    return sorted(kind for kind, pattern in KV_SCALE_NAMINGS.items()
                  if any(pattern.search(n) for n in names))


_LAYER = re.compile(r"(?:^|\.)model\.layers\.(\d+)\.")


def layers_past_config(model: ModelDir) -> dict:
    """Tensors of decoder layers numbered ``num_hidden_layers`` or more (MTP/nextn layers)."""
    config = model.json_object("config.json") or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    count = config.get("num_hidden_layers", text.get("num_hidden_layers"))
    if not isinstance(count, int) or isinstance(count, bool):
        return {"tensors": 0, "layers": []}
    layers = set()
    tensors = 0
    for name in model.tensor_shards:
        m = _LAYER.search(name)
        if m and int(m[1]) >= count:
            layers.add(int(m[1]))
            tensors += 1
    return {"tensors": tensors, "layers": sorted(layers)}


# --- GGUF ------------------------------------------------------------------------------------

def gguf_facts(model: ModelDir) -> dict:
    """``files``: the GGUF models (a file, or a split set's stem); ``nextn``: one line per model
    whose ``{arch}.nextn_predict_layers`` is above 0 (MTP blocks appended by llama.cpp's
    converter, which gguf-strip-mtp drops); ``eos``: one line per model whose EOS id is not the
    tokenizer_config.json beside it's ``eos_token`` (which gguf-fix-eos sets)."""
    from ..gguf.files import gguf_models, gguf_relpaths

    if not gguf_relpaths(model):
        return {"files": [], "nextn": [], "eos": []}
    models = gguf_models(model)
    nextn, eos = [], []
    tokenizer = model.json_object("tokenizer_config.json") if \
        model.has("tokenizer_config.json") else None
    text = _token_text(tokenizer or {})
    for gm in models:
        line = _gguf_eos_line(gm, text) if text else None
        eos += [line] if line else []
        arch = gm.architecture
        count = gm.first.get(f"{arch}.nextn_predict_layers") if arch else None
        blocks = gm.first.get(f"{arch}.block_count")
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            nextn.append(f"{gm.name}: {arch}.nextn_predict_layers = {count}, the last {count} of "
                         f"{blocks} blocks")
    return {"files": [gm.name for gm in models], "nextn": nextn, "eos": eos}


def _gguf_eos_line(gm, text: str) -> str | None:
    """Where the GGUF's ``tokenizer.ggml.eos_token_id`` is not the id, in its own vocabulary, of
    the ``eos_token`` that tokenizer_config.json beside it names (what gguf-fix-eos sets)."""
    from ..errors import PlanError
    from ..gguf.metadata import token_id

    eos = gm.first.get("tokenizer.ggml.eos_token_id")
    try:
        wanted = token_id(gm.first.kv, text, "")
    except PlanError:           # the token is not in the vocabulary once: nothing to compare
        return None
    if eos == wanted:
        return None
    return (f"{gm.name}: tokenizer.ggml.eos_token_id is {eos}, but tokenizer_config.json's "
            f"eos_token {text!r} is token {wanted}: generation does not stop at it")
