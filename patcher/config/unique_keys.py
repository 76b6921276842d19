"""Proving that a plain ``json.loads`` lost no duplicate key, without a per-object hook.

``json.loads`` keeps the last of duplicate keys silently; ``object_pairs_hook`` catches them but
calls Python once per object (273k times for a Kimi-K2.5-sized checkpoint's headers). In JSON
text every key is followed by exactly one structural colon, and any other colon byte lies inside
a string (an escape cannot make one). So ``raw.count(b":")`` is at least the number of keys
written, which is at least the number of keys the parsed document kept; when the first equals
the last, no key was lost.

Colons inside strings (timestamps, recipe text: every provenance manifest has some) are counted
too: the colons in the parsed document's keys and string values. Without a ``\\u003a`` escape in
the text, each of those is a colon byte of a string that was kept, so keys kept plus colons in
strings kept equals the colon bytes only when no key, and no string inside a lost value, was
dropped. ``keys_all_distinct`` answers True only when one of the two counts matches; False means
"parse again with the hook" (an escaped colon, or a real duplicate).
"""

from __future__ import annotations

import re
from itertools import chain, compress, repeat
from operator import is_
from typing import Any


def keys_all_distinct(raw: bytes, doc: Any) -> bool:
    """Whether ``doc`` (``json.loads`` of ``raw``) provably kept every key of ``raw``."""
    colons = raw.count(b":")
    if colons == key_count(doc):
        return True             # the common case (a shard index): no colon inside a string
    if _MAY_DECODE_TO_A_COLON.search(raw):
        return False            # a colon in the document that is no colon byte of the text
    keys, in_strings = _keys_and_string_colons(doc)
    return colons == keys + in_strings


# ``\u003a`` in either case, and any ``\u`` not followed by four hex digits: CPython's C scanner
# refuses those, but its pure-Python fallback decodes ``\u+03a`` or ``\u 03a`` with ``int(x, 16)``.
_MAY_DECODE_TO_A_COLON = re.compile(rb"\\u(?:003[aA]|(?![0-9a-fA-F]{4}))")


def key_count(doc: Any) -> int:
    """Keys of every object in ``doc``, counted a level at a time with C-level passes."""
    return _walk(doc, count_colons=False)[0]


def _keys_and_string_colons(doc: Any) -> tuple[int, int]:
    """``key_count(doc)``, and the colons in every key and string value of ``doc``."""
    return _walk(doc, count_colons=True)


def _walk(doc: Any, *, count_colons: bool) -> tuple[int, int]:
    keys, colons, level = 0, 0, [doc]
    while level:
        kinds = list(map(type, level))
        dicts = list(compress(level, map(is_, kinds, repeat(dict))))
        lists = compress(level, map(is_, kinds, repeat(list)))
        keys += sum(map(len, dicts))
        if count_colons:
            strings = compress(level, map(is_, kinds, repeat(str)))
            colons += sum(map(str.count, chain(strings, chain.from_iterable(dicts)),
                              repeat(":")))
        level = list(chain(chain.from_iterable(map(dict.values, dicts)),
                           chain.from_iterable(lists)))
    return keys, colons
