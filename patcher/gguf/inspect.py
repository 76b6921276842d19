"""``modelpatch inspect`` for GGUF: architecture, metadata (long values summarised), tensors by
ggml type, bytes by module group, and the split layout, as plain data
(``patcher.cli.render`` draws it)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from .files import SPLIT_NAME, GGUFModel, gguf_models
from .format import read_header
from .metadata import summarize

# Module groups by llama.cpp tensor name, first match wins; named as inspect names the groups
# of a safetensors model (patcher.model.inspect_model), plus mtp_nextn.
_GROUPS = [("vision", re.compile(r"^(v|mm)\.")),
           ("embeddings", re.compile(r"^(token_embd|per_layer_token_embd)\.")),
           ("lm_head", re.compile(r"^output\.")),
           ("mtp_nextn", re.compile(r"\.nextn\.")),
           ("routed_experts", re.compile(r"_exps\.")),
           ("shared_experts", re.compile(r"_shexp\.")),
           ("norms", re.compile(r"_norm\.")),
           ("attention", re.compile(r"\.attn_")),
           ("dense_mlp", re.compile(r"\.ffn_"))]


def module_group(name: str) -> str:
    return next((g for g, pattern in _GROUPS if pattern.search(name)), "other")


def inspect_gguf_file(path: Path) -> dict:
    """A report for one GGUF file given directly (a split part is reported on its own)."""
    header = read_header(path)
    rel = path.name
    return {"format": "gguf", "path": str(path),
            "models": [_model_report(GGUFModel(rel, (rel,), (header,)),
                                     split_note=bool(SPLIT_NAME.fullmatch(rel)))]}


def inspect_gguf_dir(model) -> list[dict]:
    return [_model_report(gm) for gm in gguf_models(model)]


def _model_report(gm: GGUFModel, split_note: bool = False) -> dict:
    first = gm.first
    by_type: dict[str, Counter] = {}
    by_group: dict[str, Counter] = {}
    for header in gm.headers:
        for t in header.tensors.values():
            for bucket in (by_type.setdefault(t.type_name, Counter()),
                           by_group.setdefault(module_group(t.name), Counter())):
                bucket["tensors"] += 1
                bucket["bytes"] += t.nbytes
    return {
        "name": gm.name, "architecture": gm.architecture, "version": first.version,
        "alignment": first.alignment,
        "files": [{"name": rel, "size": h.file_size, "tensors": len(h.tensors)}
                  for rel, h in zip(gm.files, gm.headers)],
        "split": {"count": len(gm.files), "consistent": not split_note,
                  **({"note": "one file of a split set, read on its own"} if split_note else {})},
        "metadata": {k: {"type": kv.type_name(), "value": summarize(kv)}
                     for k, kv in first.kv.items()},
        "tensors": {"count": gm.tensor_count(),
                    "by_type": {k: dict(c) for k, c in sorted(by_type.items())},
                    "by_group": {k: dict(c) for k, c in sorted(by_group.items())}},
    }
