"""Files, comments and reports speak of the product: none refers to the items of a work list,
to a branch or to a review, by number or otherwise. Comments say why, not when. (Upstream
issues a doctor rule or a recipe cites as evidence are the product's own content.)"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("patcher", "tests", "benchmarks")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".json", ".sh"}

# e.g. "# --- item 7: errors as JSON", "(recipe language v2, items 5 and 6)", "this branch",
# "a review found", "round 3", "in this session"
DEVELOPMENT_WORDS = re.compile(
    r"\bitems? \d+(?: and \d+)?\b(?!\s*items)(?!])|\bthis (?:branch|session|PR|round)\b"
    r"|\ba review found\b|\b(?:review|round|session) ?#?\d+\b",
    re.IGNORECASE)
# "[32 items]" (a GGUF array's summary) is data, not a reference
ALLOWED = re.compile(r"\[\d+ items\]")


def offending_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if DEVELOPMENT_WORDS.search(ALLOWED.sub("", line))]


def test_no_file_refers_to_work_items_branches_or_reviews():
    found = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file() or path == Path(__file__):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            found += [f"{path.relative_to(REPO)}: {line}" for line in offending_lines(text)]
    assert found == []


def test_the_pattern_catches_what_it_is_for():
    assert offending_lines("# --- item 7: errors as JSON under --json ---")
    assert offending_lines('"""Recipe language v2 items 5 and 6: tensor split"""')
    assert offending_lines("## What changed (this branch)")
    assert offending_lines("(a review found a shortcut that trusted the note)")
    assert offending_lines("# threads in this session, processes in another")
    assert not offending_lines('assert value == "[32 items]"')
    assert not offending_lines("# vllm issue #35577 quotes the code it replaced")
