"""The shard index (``model.safetensors.index.json``): parsed strictly, and checked against the
shards' headers (every tensor in the shard the index names, no tensor twice, ``total_size``)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, Iterable, Mapping

from ..config.jsonfile import parse_json
from ..errors import PatchError, ShardIndexError
from .safetensors_io import ShardHeader

# Shard names as transformers and huggingface_hub write them: model-00001-of-00004.safetensors.
_SHARD_NAME = re.compile(r"(?P<stem>.+)-(?P<number>\d{5,})-of-(?P<count>\d{5,})\.safetensors")


@dataclass(frozen=True)
class ShardIndex:
    """``model.safetensors.index.json``: which shard holds each tensor."""

    weight_map: Mapping[str, str]
    total_size: int | None
    metadata: dict[str, Any]
    shard_names: tuple[str, ...] | None = None     # the weight map's values, when known

    def shards(self) -> list[str]:
        """The shards the index names, sorted."""
        if self.shard_names is not None:
            return sorted(self.shard_names)
        return sorted(set(self.weight_map.values()))


def shard_set(relpath: str) -> tuple[str, str] | None:
    """(directory/prefix, shard count) of a file named like a shard of a sharded model."""
    m = _SHARD_NAME.fullmatch(relpath)
    return (m["stem"], m["count"]) if m else None


def parse_index(raw: bytes, where: str) -> ShardIndex:
    """The shard index from the bytes of ``model.safetensors.index.json`` (``where``: its name)."""
    doc = parse_json(raw, where)
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise ShardIndexError("no weight_map object", where=where)
    weight_map = doc["weight_map"]
    try:
        shard_names = set(weight_map.values())
    except TypeError:       # a list or object among the values
        shard_names = set(map(_hashable, weight_map.values()))
    bad_names = {s for s in shard_names if not (isinstance(s, str) and safe_relpath(s))}
    if bad_names:
        tensor, shard = next((t, s) for t, s in weight_map.items() if _hashable(s) in bad_names)
        raise ShardIndexError(f"shard name {shard!r} is not a relative path inside the model",
                              where=where, tensor=tensor)
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ShardIndexError("metadata is not an object", where=where)
    total = metadata.get("total_size")
    if total is not None and not (isinstance(total, int) and not isinstance(total, bool)):
        raise ShardIndexError(f"metadata.total_size is not an integer: {total!r}", where=where)
    return ShardIndex(weight_map=dict(weight_map), total_size=total, metadata=metadata)


def _hashable(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def safe_relpath(name: str) -> bool:
    return (bool(name) and not name.startswith("/") and "\\" not in name
            and posixpath.normpath(name) == name and not name.startswith("../") and name != "..")


def name_to_shard(shards: dict[str, ShardHeader], names: Iterable[str]) -> dict[str, str]:
    """tensor name -> shard over the shards ``names``, built by one C-level ``dict`` call."""
    return dict(chain.from_iterable(zip(shards[s].tensors, repeat(s)) for s in names))


def _index_matches(index: ShardIndex, shards: dict[str, ShardHeader]) -> bool:
    """The common case, proven without a Python step per tensor: the index maps exactly the
    tensors of the shards it names, each to its shard, and ``total_size`` (if given) is their
    data (validated headers tile their data sections, so a shard's data is its tensors' bytes)."""
    referenced = set(index.weight_map.values())
    if not referenced <= shards.keys():
        return False
    actual = name_to_shard(shards, sorted(referenced))
    return (len(actual) == sum(len(shards[s].tensors) for s in referenced)
            and actual == index.weight_map
            and index.total_size in (None, sum(shards[s].data_size for s in referenced)))


def index_defects(where: str, index: ShardIndex,
                  shards: dict[str, ShardHeader]) -> list[PatchError]:
    """Every way the index (at ``where``) and the shards' headers disagree."""
    if _index_matches(index, shards):
        return _unreferenced_siblings(where, index, shards)
    defects: list[PatchError] = []
    for shard in sorted(set(index.weight_map.values())):
        if shard not in shards:
            defects.append(ShardIndexError(f"names shard {shard!r}, which does not exist",
                                           where=where))
    defects += _unreferenced_siblings(where, index, shards)
    seen: dict[str, str] = {}
    for shard in sorted(set(shards) & set(index.weight_map.values())):
        for name in shards[shard].tensors:
            if name in seen:
                defects.append(ShardIndexError(f"present in both {seen[name]} and {shard}",
                                               where=where, tensor=name))
                continue
            seen[name] = shard
            mapped = index.weight_map.get(name)
            if mapped is None:
                defects.append(ShardIndexError(f"in shard {shard} but missing from the index",
                                               where=where, tensor=name))
            elif mapped != shard:
                defects.append(ShardIndexError(f"index places it in {mapped} but it is in {shard}",
                                               where=where, tensor=name))
    for name, shard in index.weight_map.items():
        if shard in shards and name not in shards[shard].tensors and name not in seen:
            defects.append(ShardIndexError(f"index places it in {shard}, which has no such tensor",
                                           where=where, tensor=name))
    if index.total_size is not None and not defects:
        actual = sum(shards[s].tensors[t].nbytes for t, s in index.weight_map.items())
        if actual != index.total_size:
            defects.append(ShardIndexError(
                f"metadata.total_size is {index.total_size} but the tensors hold {actual} bytes",
                where=where))
    return defects


def _unreferenced_siblings(where: str, index: ShardIndex,
                           shards: dict[str, ShardHeader]) -> list[PatchError]:
    """Shards the index does not name, though named as members of a set of shards it does name
    (same prefix, same shard count): the index is evidently missing their tensors."""
    referenced = set(index.weight_map.values())
    sets = {key: shard for shard in sorted(referenced, reverse=True)
            if (key := shard_set(shard)) is not None}
    defects: list[PatchError] = []
    for shard in sorted(set(shards) - referenced):
        key = shard_set(shard)
        member_of = sets.get(key) if key else None
        if member_of is not None:
            defects.append(ShardIndexError(
                f"does not reference {shard}, a shard of the same set as {member_of} "
                f"(it holds {len(shards[shard].tensors)} tensor(s))", where=where,
                hint="the index is incomplete, or the file is left over from another download"))
    return defects
