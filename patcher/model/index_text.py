"""The shard index proven against the headers by its text, without parsing its weight map.

A Kimi-K2.5-sized index is 29 MB of JSON naming 273k tensors: ``json.loads`` of it, then a dict of
the headers' tensors compared with it, cost as much as parsing the headers. But writers lay the
weight map out predictably: ``json.dumps`` with an indent, its keys sorted (transformers'
``save_pretrained``) or in the order of the shards' headers. ``index_from_headers`` writes the
weight map those headers imply in the layout the file shows (the whitespace and separators around
its first entry) and compares the bytes. When they are equal, the weight map is exactly the
headers' tensors, each in its shard; the rest of the file (``metadata``) is parsed strictly with
the weight map replaced by a random placeholder string. Anything else (another order or layout,
escapes, a defect) returns None, and the index is parsed and checked entry by entry as before, so
every defect is named the same way.
"""

from __future__ import annotations

import os
import re
from itertools import chain, repeat
from operator import concat

from ..config.jsonfile import parse_json
from ..errors import PatchError
from .header_cache import LazyMap, ordered_weight_map
from .safetensors_io import ShardHeader
from .shard_index import ShardIndex, safe_relpath, shard_set

_OPEN = re.compile(rb'"weight_map"[ \t\n\r]*:[ \t\n\r]*\{([ \t\n\r]*)"([^"]*)"'
                   rb'([ \t\n\r]*:[ \t\n\r]*)"([^"]*)"(?:([ \t\n\r]*,[ \t\n\r]*)")?')
_CLOSE = re.compile(rb"[ \t\n\r]*\}")
# Bytes a name must not hold for its JSON string to be itself between quotes (control
# characters, quote, backslash); space and "!" too, so that sorting name + '"...' sorts by name.
_UNSAFE = bytes(range(0x23)) + b"\\"


def index_from_headers(raw: bytes, where: str,
                       shards: dict[str, ShardHeader]) -> ShardIndex | None:
    """The index whose bytes are ``raw``, if its weight map is byte for byte the one the headers
    of a set of ``shards`` imply (see the module docstring); else None."""
    if b"\\" in raw:
        return None
    m = _OPEN.search(raw)
    if m is None:
        return None
    indent, first, kv, value, sep = (g.decode("utf-8", "replace") if g is not None else None
                                     for g in m.groups())
    names = _shard_group(value, shards)
    if names is None:
        return None
    tables = [shards[s].tensors for s in names]
    tensors = list(chain.from_iterable(tables))
    if not _plain(tensors, names) or len(set(tensors)) != len(tensors):
        return None
    suffixes = chain.from_iterable(map(repeat, [f'"{kv}"{s}"' for s in names], map(len, tables)))
    lines = list(map(concat, tensors, suffixes))
    if sep is None and len(lines) > 1:
        return None
    start = m.start(1)
    for order in ("headers", "sorted"):
        if order == "sorted":
            lines.sort()
        elif tensors[0] != first:
            continue
        body = (indent + '"' + (f'{sep}"'.join(lines) if sep is not None else lines[0])).encode()
        close = _CLOSE.match(raw, start + len(body))
        if raw.startswith(body, start) and close is not None:
            break
    else:
        return None
    return _with_metadata(raw, where, m.start(1) - 1, close.end(), names, shards, order)


def _shard_group(first_value: str, shards: dict[str, ShardHeader]) -> list[str] | None:
    """The shards of the set the weight map's first value belongs to (sorted), if it is one."""
    key = shard_set(first_value)
    if first_value not in shards or key is None:
        return None
    return sorted(s for s in shards if shard_set(s) == key)


def _plain(tensors: list[str], names: list[str]) -> bool:
    """Every name is its own JSON string text, and sorts as its line does."""
    try:
        text = "".join(chain(tensors, names)).encode("utf-8")
    except UnicodeEncodeError:         # a lone surrogate
        return False
    return len(text.translate(None, _UNSAFE)) == len(text) and all(map(safe_relpath, names))


def _with_metadata(raw: bytes, where: str, begin: int, end: int, names: list[str],
                   shards: dict[str, ShardHeader], order: str) -> ShardIndex | None:
    """Parse ``raw`` with the weight map (``raw[begin:end]``) replaced by a placeholder."""
    token = f"modelpatch-weight-map-{os.urandom(16).hex()}"
    rest = raw[:begin] + f'"{token}"'.encode() + raw[end:]
    try:
        doc = parse_json(rest, where)
    except PatchError:
        return None
    if type(doc) is not dict or doc.get("weight_map") != token or rest.count(token.encode()) != 1:
        return None
    metadata = doc.get("metadata") or {}
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if not isinstance(metadata, dict) or \
            total not in (None, sum(shards[s].data_size for s in names)) or \
            type(total) not in (int, type(None)):
        return None
    weight_map = LazyMap(lambda: ordered_weight_map(order, names, shards))
    weight_map.order, weight_map.names = order, tuple(names)
    return ShardIndex(weight_map=weight_map, total_size=total, metadata=metadata,
                      shard_names=tuple(names))
