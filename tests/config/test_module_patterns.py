"""ModelOpt's ``exclude_modules`` patterns as compressed-tensors ``ignore`` entries
(``config.module_patterns``): checked with compressed-tensors' own matcher (``match_name``, the
one vLLM's ``_is_equal_or_regex_match`` mirrors: equality, or ``re.match`` after ``re:``) against
``fnmatch``, ModelOpt's, on every module of the real exports under tests/fixtures/modelopt."""

from __future__ import annotations

import fnmatch
import json
import struct
from pathlib import Path

import pytest
from compressed_tensors.utils.match import match_name

from patcher.config.module_patterns import ignore_from_modelopt

FIXTURES = Path(__file__).parent.parent / "fixtures" / "modelopt"
EXPORTS = sorted(p.name for p in FIXTURES.iterdir() if (p / "hf_quant_config.json").exists())

#: the exports' own excludes, and the wildcards ModelOpt writes for partial and multimodal
#: exports (per-layer attention kept in BF16, routers, towers, projectors)
PATTERNS = ["lm_head", "model.embed_tokens", "model.layers.1.mlp.gate",
            "model.layers.0.self_attn*", "*mlp.gate", "*vision_tower*", "multi_modal_projector*",
            "*.[kv]_proj", "model.layers.?.mlp.*_proj", "*experts.[!0]*", "*lm_head*", "*"]


def _modules(export: str) -> list[str]:
    """Every module name of the export: each tensor's owner and all its ancestors."""
    with open(FIXTURES / export / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    names = set()
    for tensor in header:
        if tensor != "__metadata__":
            parts = tensor.split(".")[:-1]
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(names)


@pytest.mark.parametrize("export", EXPORTS)
def test_ignore_matches_what_modelopt_excludes_on_every_module(export):
    own = json.loads((FIXTURES / export / "hf_quant_config.json").read_text())
    patterns = PATTERNS + own["quantization"]["exclude_modules"]
    modules = _modules(export)
    assert len(modules) > 20
    for pattern in patterns:
        ignore = ignore_from_modelopt([pattern])
        for module in modules:
            want = fnmatch.fnmatchcase(module, pattern)
            assert any(match_name(module, entry) for entry in ignore) == want, (pattern, module)


def test_exact_names_stay_exact_and_wildcards_become_anchored_regexes():
    """vLLM maps an exact name to its own module names and keeps a re: entry as written."""
    assert ignore_from_modelopt(["lm_head", "model.layers.1.mlp.gate"]) == \
        ["lm_head", "model.layers.1.mlp.gate"]
    (entry,) = ignore_from_modelopt(["model.layers.1.self_attn*"])
    assert entry.startswith("re:") and entry.endswith("$")
    assert not match_name("model.layers.11.self_attn.q_proj", entry)
    assert not match_name("xmodel.layers.1.self_attn", entry)


@pytest.mark.parametrize("pattern, spellings", [
    ("language_model.lm_head", ["language_model.lm_head", "lm_head"]),
    ("language_model.model.layers.0.self_attn*",
     ["language_model.model.layers.0.self_attn.q_proj",
      "model.language_model.layers.0.self_attn.q_proj"]),
    ("vision_tower*", ["vision_tower.blocks.0.attn.qkv", "model.vision_tower.blocks.0.attn.qkv"]),
    ("multi_modal_projector*", ["multi_modal_projector.linear_1",
                                "model.multi_modal_projector.linear_1"]),
])
def test_multimodal_names_match_every_consumers_spelling(pattern, spellings):
    """ModelOpt's language_model.* names (remote-code classes, Kimi-K2.5's) against
    transformers' model.language_model.* / lm_head and vLLM's language_model.model.*."""
    ignore = ignore_from_modelopt([pattern])
    for name in spellings:
        assert any(match_name(name, entry) for entry in ignore), (pattern, name)
    assert not any(match_name("model.layers.0.mlp.lm_head_x", e) for e in ignore)


def test_bad_entries_are_refused():
    with pytest.raises(ValueError, match="non-empty string"):
        ignore_from_modelopt(["lm_head", 3])
