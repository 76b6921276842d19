"""The ``token`` parameter type: the text of a token the model's own tokenizer has.

A token text the vocabulary lacks is no token: transformers and vLLM give it an id past the
vocabulary (``convert_tokens_to_ids`` answers the unknown id, or none), so generation never stops
at it. The vocabulary read is tokenizer.json's ``added_tokens`` and ``model.vocab`` (an object
for BPE/WordPiece, a list of ``[piece, score]`` for Unigram) and tokenizer_config.json's
``added_tokens_decoder``.
"""

from __future__ import annotations

from typing import Any, Callable


def token_problem(text: str, read_json: Callable[[str], Any]) -> str | None:
    """Why ``text`` is not a token of the model's vocabulary, or None."""
    found_vocab = False
    config = read_json("tokenizer_config.json")
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    if isinstance(decoder, dict):
        found_vocab = True
        if any(isinstance(t, dict) and t.get("content") == text for t in decoder.values()):
            return None
    tokenizer = read_json("tokenizer.json")
    if isinstance(tokenizer, dict):
        added = tokenizer.get("added_tokens")
        if isinstance(added, list):
            found_vocab = True
            if any(isinstance(t, dict) and t.get("content") == text for t in added):
                return None
        model = tokenizer.get("model")
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if isinstance(vocab, dict):
            found_vocab = True
            if text in vocab:
                return None
        elif isinstance(vocab, list):
            found_vocab = True
            if any(isinstance(p, list) and p and p[0] == text for p in vocab):
                return None
    if not found_vocab:
        return ("cannot be checked against the vocabulary: the model has neither "
                "tokenizer.json nor tokenizer_config.json added_tokens_decoder")
    return ("is not a token of the model's vocabulary (tokenizer.json, tokenizer_config.json "
            "added_tokens_decoder): transformers and vLLM would give it an id past the vocabulary")
