"""Strict JSON reading for files found in model directories."""

from __future__ import annotations

import json
from typing import Any

from .errors import ModelDirError


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def parse_json(data: bytes, where: str) -> Any:
    """Parse ``data`` as strict UTF-8 JSON; duplicate keys and bad encodings are errors."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelDirError(f"not valid UTF-8 at byte {exc.start}", where=where) from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                            where=where) from None
    except (ValueError, RecursionError) as exc:
        raise ModelDirError(f"invalid JSON: {exc}", where=where) from None
