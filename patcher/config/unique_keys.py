"""Proving that a plain ``json.loads`` lost no duplicate key, without a per-object hook.

``json.loads`` keeps the last of duplicate keys silently; ``object_pairs_hook`` catches them but
calls Python once per object (273k times for a Kimi-K2.5-sized checkpoint's headers). In JSON
text every key is followed by exactly one structural colon, and any other colon byte lies inside
a string (an escape cannot make one). So ``raw.count(b":")`` is at least the number of keys
written, which is at least the number of keys the parsed document kept; when the first equals
the last, no key was lost. ``keys_all_distinct`` answers True only then; False means "parse
again with the hook" (a colon inside a string, or a real duplicate).
"""

from __future__ import annotations

from itertools import chain, compress, repeat
from operator import is_
from typing import Any


def keys_all_distinct(raw: bytes, doc: Any) -> bool:
    """Whether ``doc`` (``json.loads`` of ``raw``) provably kept every key of ``raw``."""
    return raw.count(b":") == key_count(doc)


def key_count(doc: Any) -> int:
    """Keys of every object in ``doc``, counted a level at a time with C-level passes."""
    count, level = 0, [doc]
    while level:
        kinds = list(map(type, level))
        dicts = list(compress(level, map(is_, kinds, repeat(dict))))
        lists = compress(level, map(is_, kinds, repeat(list)))
        count += sum(map(len, dicts))
        level = list(chain(chain.from_iterable(map(dict.values, dicts)),
                           chain.from_iterable(lists)))
    return count
