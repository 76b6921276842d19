"""GGUF metadata values as read: shown shortened (``summarize``), and a token's id looked up by
its text (``token_id``), for the plan, ``inspect`` and doctor's facts."""

from __future__ import annotations

import json

from ..errors import PlanError
from .format import ARRAY, STRING, KeyValue

SUMMARY_CHARS = 80


def summarize(kv: KeyValue) -> str:
    """A value for display: long strings and arrays shortened."""
    if kv.vtype == ARRAY:
        if kv.count > 8:
            return f"[{kv.count} items]"
        return json.dumps(kv.value)
    text = json.dumps(kv.value, ensure_ascii=False)
    return text if len(text) <= SUMMARY_CHARS else f"{text[:SUMMARY_CHARS - 20]}... " \
        f"({len(kv.value)} chars)"


def token_id(kv: dict[str, KeyValue], text, loc: str) -> int:
    """The id of the token whose text is ``text`` (``tokenizer.ggml.tokens``); it must be
    unique. A Hugging Face ``AddedToken`` mapping gives its ``content``."""
    if isinstance(text, dict):
        text = text.get("content")
    if not isinstance(text, str):
        raise PlanError(f"token: expected a token's text, got {text!r}", where=loc)
    tokens = kv.get("tokenizer.ggml.tokens")
    if tokens is None or tokens.item_type != STRING:
        raise PlanError("token: the GGUF has no tokenizer.ggml.tokens list", where=loc)
    ids = [i for i, t in enumerate(tokens.value) if t == text]
    if len(ids) != 1:
        raise PlanError(f"token {text!r} is {'not' if not ids else 'more than once'} in "
                        "tokenizer.ggml.tokens", where=loc)
    return ids[0]
