"""Safetensors headers, read and written directly: 8-byte little-endian length, JSON, data.

Reading parses and validates only the header; no tensor data is touched. Validation is strict
(every defect named with the file and tensor), because everything downstream trusts the offsets.
Writing lays out a header for a list of tensors before any data exists, so a shard can be streamed
tensor by tensor with memory bounded by one tensor.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from ..config.jsonfile import no_duplicate_keys
from ..errors import SafetensorsFormatError

# The safetensors library refuses headers over 100 MB (MAX_HEADER_SIZE); so do we.
MAX_HEADER_SIZE = 100_000_000
# It computes sizes in u64 (usize): the element count multiplying the dimensions left to right,
# then the bit count; either overflowing is an error, and so is a bit count that is not a whole
# number of bytes (sub-byte dtypes).
U64_MAX = 2**64 - 1

# Element size in bits for each dtype name the safetensors format defines.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,        # AMD's float8 variants (torch *_fnuz)
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a header. Offsets are relative to the start of the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ShardHeader:
    """A parsed and validated safetensors header."""

    path: Path
    header_len: int
    file_size: int
    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, str] | None = field(default=None)

    @property
    def data_offset(self) -> int:
        """Absolute file offset of the first data byte."""
        return 8 + self.header_len

    @property
    def data_size(self) -> int:
        return self.file_size - self.data_offset


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    """Bytes a tensor of ``dtype`` and ``shape`` occupies (sub-byte dtypes are packed)."""
    bits = DTYPE_BITS[dtype] * math.prod(shape)
    return (bits + 7) // 8


def read_header(path: str | os.PathLike, display: str | None = None) -> ShardHeader:
    """Read and validate the header of the safetensors file at ``path``.

    Args:
        path: the file to read.
        display: the name used in error messages (defaults to ``path``).

    Returns:
        The validated ``ShardHeader``.

    Raises:
        SafetensorsFormatError: naming the file (and tensor) for every kind of defect.
    """
    return parse_header(*read_raw_header(path, display), display or str(path))


def read_raw_header(path: str | os.PathLike,
                    display: str | None = None) -> tuple[Path, int, bytes]:
    """The I/O half of ``read_header``: (path, file size, header JSON bytes), size-checked."""
    path = Path(path)
    where = display or str(path)
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        if file_size < 8:
            raise SafetensorsFormatError(f"file is {file_size} bytes, too short for a header",
                                         where=where)
        header_len = header_length(f.read(8), file_size, where)
        raw = f.read(header_len)
    if len(raw) != header_len:
        raise SafetensorsFormatError("the file shrank while being read", where=where)
    return path, file_size, raw


def header_length(prefix: bytes, file_size: int, where: str) -> int:
    """The header length the first 8 bytes of a ``file_size``-byte file declare, size-checked."""
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len > MAX_HEADER_SIZE:
        raise SafetensorsFormatError(
            f"header length {header_len} is absurd (limit {MAX_HEADER_SIZE} bytes)", where=where)
    if header_len > file_size - 8:
        raise SafetensorsFormatError(
            f"header length {header_len} runs past the end of the {file_size}-byte file",
            where=where, hint="the file is truncated or not safetensors")
    return header_len


def parse_header(path: Path, file_size: int, raw: bytes, where: str) -> ShardHeader:
    """The CPU half of ``read_header``: parse and validate header bytes read from ``path``."""
    fast = _parse_header_fast(raw, file_size - 8 - len(raw))
    if fast is not None:
        return ShardHeader(path=path, header_len=len(raw), file_size=file_size,
                           tensors=fast[0], metadata=fast[1])
    tensors, metadata = _parse_header_json(raw, where)
    header = ShardHeader(path=path, header_len=len(raw), file_size=file_size,
                         tensors=tensors, metadata=metadata)
    _check_layout(header, where)
    return header


def _parse_header_fast(raw: bytes, data_size: int):
    """(tensors, metadata) of a header proven well-formed by whole-column checks
    (``patcher.model.tensor_table``), or None: the per-entry path below then decides, and names
    the defect if there is one."""
    from .tensor_table import table_from_json

    if b"\\" in raw:       # escapes (lone surrogates among them) take the exact path
        return None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if type(obj) is not dict:
        return None
    keys = len(obj)
    metadata = obj.pop("__metadata__", None)
    if metadata is not None and not (type(metadata) is dict and all(
            type(k) is str and type(v) is str for k, v in metadata.items())):
        return None
    table = table_from_json(obj, data_size)
    # Entries of a table hold exactly three keys and no object inside, so this counts every
    # key kept; as many colons in the text prove none was a duplicate (config.unique_keys).
    if table is None or raw.count(b":") != keys + 3 * len(table) + len(metadata or ()):
        return None
    return table, metadata


def _parse_header_json(raw: bytes, where: str) -> tuple[dict[str, TensorInfo], dict | None]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsFormatError(f"header is not UTF-8 (byte {exc.start})",
                                     where=where) from None
    obj = _loads(text, where)
    if not isinstance(obj, dict):
        raise SafetensorsFormatError("header is not a JSON object", where=where)
    metadata = obj.pop("__metadata__", None)
    if metadata is not None and not (
            isinstance(metadata, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise SafetensorsFormatError("__metadata__ must map strings to strings", where=where)
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(obj, metadata, where)
    tensors = {name: _parse_entry(name, entry, where) for name, entry in obj.items()}
    return tensors, metadata


# A JSON escape of a UTF-16 surrogate: valid only as half of a pair, which json decodes into one
# character; a lone one becomes a string that is not Unicode (safetensors itself refuses it).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(obj: dict, metadata: dict | None, where: str) -> None:
    for text in [*obj, *(metadata or {}), *(metadata or {}).values()]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise SafetensorsFormatError(f"header string {text!r} is not valid Unicode (a lone "
                                         f"surrogate escape)", where=where) from None


def _loads(text: str, where: str):
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys)
    except ValueError as exc:
        raise SafetensorsFormatError(f"header is not valid JSON: {exc}", where=where) from None
    except RecursionError:
        raise SafetensorsFormatError("header JSON is nested too deeply", where=where) from None


def _parse_entry(name: str, entry: object, where: str) -> TensorInfo:
    if type(entry) is dict and len(entry) == 3:
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        # Fast path for a well-formed entry (type(x) is int excludes bool).
        if (type(dtype) is str and dtype in DTYPE_BITS and type(shape) is list
                and type(offsets) is list
                and len(offsets) == 2 and type(offsets[0]) is int and type(offsets[1]) is int
                and all(type(d) is int and d >= 0 for d in shape)
                and 0 <= offsets[0] <= offsets[1]):
            # A non-zero product of dimensions >= 1 bounds every left-to-right partial product,
            # so one comparison covers the library's overflow checks; empty tensors (where a
            # zero can hide an overflowing prefix) take the slow path.
            nbits = DTYPE_BITS[dtype] * math.prod(shape)
            if 0 < nbits <= U64_MAX and nbits % 8 == 0 and nbits >> 3 == offsets[1] - offsets[0]:
                return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])
    return _parse_entry_slow(name, entry, where)


def _parse_entry_slow(name: str, entry: object, where: str) -> TensorInfo:
    """An entry the fast path refused: a valid empty tensor, or the precise defect raised."""
    def bad(message: str) -> SafetensorsFormatError:
        return SafetensorsFormatError(message, where=where, tensor=name)

    if not isinstance(entry, dict):
        raise bad("entry is not an object")
    extra = set(entry) - {"dtype", "shape", "data_offsets"}
    if extra:
        raise bad(f"unexpected field(s) {sorted(extra)}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise bad(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise bad(f"shape must be a list of integers, got {shape!r}")
    if any(d < 0 for d in shape):
        raise bad(f"negative dimension in shape {shape}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise bad(f"data_offsets must be [begin, end], got {offsets!r}")
    start, end = offsets
    if start < 0 or end < start:
        raise bad(f"data_offsets {offsets} are not an increasing non-negative range")
    defect = size_defect(dtype, shape)
    if defect:
        raise bad(defect)
    expected = tensor_nbytes(dtype, shape)
    if expected != end - start:
        raise bad(f"shape {shape} x {dtype} needs {expected} bytes but data_offsets span "
                  f"{end - start}")
    return TensorInfo(name, dtype, tuple(shape), start, end)


def size_defect(dtype: str, shape: Iterable[int]) -> str | None:
    """Why the safetensors library refuses a tensor of ``dtype`` and ``shape`` whatever its
    offsets, or None: its size overflows 64 bits, or it is not a whole number of bytes."""
    shape = list(shape)
    count = 1
    for dim in shape:  # left to right, as the library multiplies (checked u64)
        count *= dim
        if count > U64_MAX:
            return (f"shape {shape}: the product of its dimensions overflows 64 bits "
                    f"(the safetensors library refuses it)")
    bits = count * DTYPE_BITS[dtype]
    if bits > U64_MAX:
        return (f"shape {shape} x {dtype}: {count} elements of {DTYPE_BITS[dtype]} bits "
                f"overflow a 64-bit bit count (the safetensors library refuses it)")
    if bits % 8:
        return (f"shape {shape} x {dtype}: {count} elements of {DTYPE_BITS[dtype]} bits are "
                f"{bits} bits, not a whole number of bytes")
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_layout(header: ShardHeader, where: str) -> None:
    """Offsets must tile the data section exactly: no overlap, no gap, nothing past the end."""
    position, previous = 0, None
    for info in sorted(header.tensors.values(), key=lambda t: (t.start, t.end)):
        if info.end > header.data_size:
            raise SafetensorsFormatError(
                f"data_offsets [{info.start}, {info.end}] run past the {header.data_size}-byte "
                f"data section", where=where, tensor=info.name, hint="the file is truncated")
        if info.start < position:
            raise SafetensorsFormatError(
                f"data_offsets [{info.start}, {info.end}] overlap tensor {previous!r}",
                where=where, tensor=info.name)
        if info.start > position:
            raise SafetensorsFormatError(
                f"gap of {info.start - position} bytes before data_offsets [{info.start}, "
                f"{info.end}]", where=where, tensor=info.name)
        position, previous = info.end, info.name
    if position != header.data_size:
        raise SafetensorsFormatError(
            f"{header.data_size - position} trailing bytes after the last tensor", where=where)


# --- writing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputTensor:
    """A tensor as it will appear in an output shard."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


def encode_header(tensors: Iterable[OutputTensor],
                  metadata: Mapping[str, str] | None) -> tuple[bytes, list[TensorInfo]]:
    """Lay out ``tensors`` in the given order and return the full header prefix and the layout.

    The prefix is the 8-byte length plus the JSON, padded with spaces to a multiple of 8 bytes
    as the safetensors library does, so data stays aligned.
    """
    entries: dict[str, object] = {}
    if metadata is not None:
        entries["__metadata__"] = dict(metadata)
    layout: list[TensorInfo] = []
    offset = 0
    for t in tensors:
        if t.name in entries or t.name == "__metadata__":
            raise SafetensorsFormatError("duplicate tensor name in output", tensor=t.name)
        end = offset + t.nbytes
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, end]}
        layout.append(TensorInfo(t.name, t.dtype, tuple(t.shape), offset, end))
        offset = end
    body = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body, layout
