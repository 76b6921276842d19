"""What doctor's rules, the built-in recipes and the docs claim about transformers holds for the
transformers constraints/cpu.txt pins, the one version every such claim names: the claims name
it, and the behaviour they rely on is observed with the installed transformers (a test here
fails when transformers changes it)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tensor_helpers import transformers_logits

from patcher import api
from patcher.errors import GuardRefused

REPO = Path(__file__).resolve().parents[1]
#: where claims about a transformers version are written
CLAIM_FILES = ("patcher/doctor/rules/*.yaml", "patcher/builtin_recipes/*.yaml", "README.md",
               "docs/*.md")
#: "transformers 5.25", "transformers (checked in 5.25)"
_CLAIM = re.compile(r"transformers\s+(?:\(checked in\s+)?(\d+\.\d+)(?:\.\d+)?")
#: historical facts, not claims about today's transformers: who wrote a committed fixture
_HISTORY = ("written by transformers 5.17.0",)
QWEN3 = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             max_position_embeddings=256)


def checked_transformers() -> str:
    """The transformers version constraints/cpu.txt pins (what the claims were checked in)."""
    for line in (REPO / "constraints" / "cpu.txt").read_text().splitlines():
        if line.startswith("transformers=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError("constraints/cpu.txt pins no transformers")


def test_every_transformers_claim_names_the_pinned_version():
    pinned = ".".join(checked_transformers().split(".")[:2])
    claims = []
    for pattern in CLAIM_FILES:
        for path in sorted(REPO.glob(pattern)):
            text = " ".join(path.read_text(encoding="utf-8").split())
            for phrase in _HISTORY:
                text = text.replace(phrase, "")
            claims += [(path.relative_to(REPO).as_posix(), m.group(0))
                       for m in _CLAIM.finditer(text)]
    assert claims, "no claim found: the pattern no longer matches how claims are written"
    assert [c for c in claims if not c[1].endswith(pinned) and pinned + "." not in c[1]] == []


@pytest.fixture(scope="module")
def differing_head(tmp_path_factory) -> Path:
    """A tiny Qwen3 saved untied by save_pretrained (its lm_head differs from its embeddings),
    then marked tied in config.json: the layout tie-embeddings and doctor's rule are about."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("head") / "model"
    Qwen3ForCausalLM(Qwen3Config(**QWEN3, tie_word_embeddings=False)).to(
        torch.bfloat16).save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_transformers_keeps_a_stored_head_that_differs_from_tied_embeddings(differing_head):
    """The claim of tie-embeddings and of doctor's tied-lm-head-ignored: with
    tie_word_embeddings true, transformers serves a stored lm_head.weight that differs from the
    embeddings (it ties only equal ones)."""
    from transformers import AutoModelForCausalLM

    stored = load_file(differing_head / "model.safetensors")
    assert not torch.equal(stored["lm_head.weight"], stored["model.embed_tokens.weight"])
    model = AutoModelForCausalLM.from_pretrained(differing_head, dtype=torch.bfloat16)
    assert torch.equal(model.lm_head.weight, stored["lm_head.weight"])
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_transformers_ties_a_stored_head_equal_to_the_embeddings(differing_head, tmp_path):
    """The other half: an equal stored head is tied, so dropping it changes nothing."""
    from transformers import AutoModelForCausalLM

    base = Path(shutil.copytree(differing_head, tmp_path / "equal"))
    tensors = load_file(base / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    out = api.apply("tie-embeddings", base, out=tmp_path / "v").output
    assert torch.equal(transformers_logits(out), transformers_logits(base))


def test_tie_embeddings_refuses_a_head_that_differs(differing_head):
    with pytest.raises(GuardRefused, match=r"lm_head\.weight differs from "
                                           r"model\.embed_tokens\.weight in value"):
        api.plan("tie-embeddings", differing_head)
