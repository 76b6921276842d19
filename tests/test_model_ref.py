"""One model reference (``patcher.model_ref``): every MODEL argument is parsed by
``ModelRef.parse``, and no other module spells the ``hf://`` scheme of a MODEL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from patcher.errors import InputError
from patcher.model_ref import ModelKind, ModelRef, is_hub

PATCHER = Path(__file__).resolve().parent.parent / "patcher"


@pytest.mark.parametrize("text, kind, repo_id, revision, name", [
    ("hf://org/base", ModelKind.HUB, "org/base", None, "base"),
    ("hf://org/base@refs/pr/1", ModelKind.HUB, "org/base", "refs/pr/1", "base"),
    ("/models/kimi/", ModelKind.DIRECTORY, None, None, "kimi"),
    ("models/tiny.Q4_K_M.gguf", ModelKind.GGUF_FILE, None, None, "tiny.Q4_K_M.gguf"),
])
def test_a_model_reference_says_what_it_names(text, kind, repo_id, revision, name):
    ref = ModelRef.parse(text)
    assert (ref.kind, ref.repo_id, ref.revision, ref.name) == (kind, repo_id, revision, name)
    assert str(ref) == text and ModelRef.parse(ref) is ref and is_hub(text) == ref.is_hub


def test_a_directory_named_like_a_gguf_file_is_a_directory(tmp_path):
    (tmp_path / "odd.gguf").mkdir()
    assert ModelRef.parse(tmp_path / "odd.gguf").kind is ModelKind.DIRECTORY


@pytest.mark.parametrize("text", ["hf://base", "hf://a/b/c", "hf://org/base@", "hf://o/b@@x",
                                  "hf://org/ba..se"])
def test_a_malformed_hub_reference_is_refused_in_one_line(text):
    with pytest.raises(InputError) as info:
        ModelRef.parse(text)
    assert "\n" not in info.value.one_line()


def test_only_model_ref_parses_the_scheme_of_a_model():
    """``hf://`` as a MODEL is parsed in one module; recipes' ``from: hf://ORG/NAME/PATH``
    sources (another grammar, ``recipe/sources.py``) are theirs."""
    pattern = re.compile(r"""HF_SCHEME\s*=|startswith\(["']hf://|len\(["']hf://""")
    sources = {"patcher/recipe/sources.py", "patcher/remote/sources.py",
               "patcher/hub/client/model_card.py"}
    found = [rel for path in sorted(PATCHER.rglob("*.py"))
             if (rel := str(path.relative_to(PATCHER.parent))) not in sources
             and path.name != "model_ref.py" and pattern.search(path.read_text())]
    assert found == []
    assert pattern.search('if text.startswith("hf://"):')        # the check sees a parse
