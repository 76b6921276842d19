"""A shard header's tensors as columns, validated in bulk, built into ``TensorInfo`` on demand.

At Kimi-K2.5-NVFP4 scale (273k tensors in 119 shards) a ``TensorInfo`` per tensor and a Python
check per entry cost several times the ``json.loads`` of the headers, although a config-only apply
looks at no tensor. ``table_from_json`` checks a parsed header with C-level passes over whole
columns (``map``, ``set``, ``sorted``): the same rules as ``safetensors_io``'s per-entry path,
which it either proves hold or leaves to that path (returning None), so every defect is still
named by the exact path. ``TensorTable`` is the read-only mapping name -> ``TensorInfo``; it
builds an info when one is asked for, and all of them when values are iterated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import chain, repeat
from operator import itemgetter, mul, sub
from typing import Any, Iterator

from .safetensors_io import DTYPE_BITS, U64_MAX, TensorInfo

_DTYPES = frozenset(DTYPE_BITS)
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_DTYPE, _SHAPE, _OFFSETS = itemgetter("dtype"), itemgetter("shape"), itemgetter("data_offsets")


class TensorTable(Mapping):
    """tensor name -> ``TensorInfo`` over validated columns (in header order)."""

    __slots__ = ("names", "dtypes", "shapes", "starts", "ends", "_pos", "_infos")

    def __init__(self, names: list[str], dtypes: list[str], shapes: list, starts: list[int],
                 ends: list[int]):
        self.names, self.dtypes, self.shapes = names, dtypes, shapes
        self.starts, self.ends = starts, ends
        self._pos: dict[str, int] | None = None
        self._infos: dict[str, TensorInfo] | None = None

    def columns(self) -> tuple:
        return self.names, self.dtypes, self.shapes, self.starts, self.ends

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._positions()

    def __getitem__(self, name: str) -> TensorInfo:
        if self._infos is not None:
            return self._infos[name]
        i = self._positions()[name]
        return TensorInfo(name, self.dtypes[i], tuple(self.shapes[i]), self.starts[i],
                          self.ends[i])

    def values(self):
        return self._all().values()

    def items(self):
        return self._all().items()

    def _positions(self) -> dict[str, int]:
        if self._pos is None:
            self._pos = dict(zip(self.names, range(len(self.names))))
        return self._pos

    def _all(self) -> dict[str, TensorInfo]:
        if self._infos is None:
            self._infos = {n: TensorInfo(n, d, tuple(s), a, b)
                           for n, d, s, a, b in zip(*self.columns())}
        return self._infos

    def __repr__(self) -> str:
        return f"TensorTable({len(self)} tensors)"


def table_from_json(obj: dict[str, Any], data_size: int) -> TensorTable | None:
    """The tensors of a parsed header (``__metadata__`` removed) whose data section holds
    ``data_size`` bytes, if every entry is well-formed and non-empty and the entries tile the
    data section exactly; None when any of that is not proven (the per-entry path decides)."""
    try:
        return _checked_columns(list(obj), list(obj.values()), data_size)
    except (KeyError, TypeError, ValueError):
        return None


def _checked_columns(names: list, entries: list, data_size: int) -> TensorTable | None:
    if not entries:
        return TensorTable([], [], [], [], []) if data_size == 0 else None
    # Three keys each, and the three getters succeed: exactly dtype, shape and data_offsets (an
    # entry that is not an object fails its getter). Keys of a JSON object are strings.
    if set(map(len, entries)) != {3}:
        return None
    offsets = list(map(_OFFSETS, entries))
    # strict: every offsets value yields as many items, and two rows unpack: all are pairs
    starts, ends = map(list, zip(*offsets, strict=True))
    return _checked(names, list(map(_DTYPE, entries)), list(map(_SHAPE, entries)), starts, ends,
                    data_size)


def checked_table(names: list, dtypes: list, shapes: list, starts: list, ends: list,
                  data_size: int) -> TensorTable | None:
    """A table of these columns if they hold non-empty tensors of known dtypes, with
    shape-consistent offsets that tile ``data_size`` bytes exactly; else None. Also the check of
    columns read back from ``patcher.model.header_cache`` (which trusts no cached header)."""
    try:
        if set(map(type, names)) != {str} and names:
            return None
        return _checked(names, dtypes, shapes, starts, ends, data_size)
    except (KeyError, TypeError, ValueError):
        return None


def _checked(names, dtypes, shapes, starts, ends, data_size) -> TensorTable | None:
    if not names:
        return TensorTable([], [], [], [], []) if data_size == 0 else None
    if not (len(names) == len(dtypes) == len(shapes) == len(starts) == len(ends)):
        return None
    if not set(dtypes) <= _DTYPES or set(map(type, shapes)) != {list}:
        return None
    dims = list(chain.from_iterable(shapes))
    if set(map(type, chain(dims, starts, ends))) != {int} or (dims and min(dims) < 0):
        return None
    # A non-zero product of dimensions bounds every partial product, so the library's u64
    # overflow checks reduce to one bound on the bit count; empty tensors take the exact path.
    numels = list(map(math.prod, shapes))
    if 0 in numels:
        return None
    bits = list(map(mul, numels, map(DTYPE_BITS.__getitem__, dtypes)))
    # Whole bytes, as many as the offsets span: bits == 8 * (end - start).
    if bits != list(map(mul, map(sub, ends, starts), repeat(8))):
        return None
    # The offsets tile the data section (below), so each bit count is at most 8 * data_size.
    if data_size > U64_MAX >> 3 and max(bits) > U64_MAX:
        return None
    # Each tensor starts where the previous ended, the first at 0 and the last ends at the data
    # section's end: no gap, no overlap, nothing past the end. Writers lay tensors out in header
    # order (one list comparison); otherwise sorted by (start, end).
    if starts[0] == 0 and ends[-1] == data_size and starts[1:] == ends[:-1]:
        return TensorTable(names, dtypes, shapes, starts, ends)
    ordered = sorted(zip(starts, ends))
    first, last = list(map(_FIRST, ordered)), list(map(_SECOND, ordered))
    if first[0] != 0 or last[-1] != data_size or first[1:] != last[:-1]:
        return None
    return TensorTable(names, dtypes, shapes, starts, ends)


class LazyTable(TensorTable):
    """A ``TensorTable`` whose columns ``load`` returns (another table) on first use: a cached
    header costs nothing until a command looks at its tensors."""

    __slots__ = ("_load",)

    def __init__(self, load):
        self._load = load
        self._pos = self._infos = None

    def __getattr__(self, name: str):
        if name not in ("names", "dtypes", "shapes", "starts", "ends"):
            raise AttributeError(name)
        (self.names, self.dtypes, self.shapes, self.starts,
         self.ends) = self._load().columns()
        return getattr(self, name)

    def __repr__(self) -> str:
        return "LazyTable()"
