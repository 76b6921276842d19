"""A strict, bounded GGUF header parser and encoder.

Why not ``gguf.GGUFReader``: it memory-maps the whole file and builds numpy views of every
field and tensor, trusting counts and offsets as it goes: an array count of 2**60 or a tensor
offset past the end surfaces as a numpy error (or an enormous allocation), not as a one-line
message naming the file, and it does not refuse overlapping tensors, misaligned offsets or
duplicate keys. modelpatch reads untrusted downloads, so the header is parsed here: every length
and count is checked against the bytes that remain before anything is allocated, the header is
capped (``MAX_HEADER_BYTES``), and tensor data is never read. gguf-py is used for what it is the
reference for: value types, ggml types with their block sizes, and key names.

Each key/value keeps its exact encoded bytes (``KeyValue.raw``): a rewrite copies the keys a
recipe does not touch byte for byte, and encodes only the new ones.
"""

from __future__ import annotations

import math
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GGUFFormatError
from ..gguf_py import gguf_constants

MAX_HEADER_BYTES = 256 << 20       # metadata + tensor infos; real ones (vocab, merges) take ~20 MiB
MAX_KEY_BYTES = 65535
MAX_DIMS = 4                      # GGML_MAX_DIMS
# general.alignment: llama.cpp (gguf.cpp) takes any power of two that fits a uint32, with no
# maximum; files use 32 (the default) or 64. Every rewrite pads the header and each tensor to
# it, so a 256-byte file saying 2**31 would make a 2 GiB write: above this budget it is refused.
MAX_ALIGNMENT = 1 << 20
SUPPORTED_VERSIONS = (2, 3)       # version 1 used 32-bit counts and is long gone

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class KeyValue:
    key: str
    vtype: int                   # gguf.GGUFValueType
    raw: bytes                   # the value's exact encoding (type word excluded)
    item_type: int | None = None  # arrays
    count: int = 1               # array length

    @property
    def value(self) -> Any:
        return decode_value(self.vtype, self.raw, self.item_type)

    def type_name(self) -> str:
        gguf = gguf_constants()
        name = gguf.GGUFValueType(self.vtype).name
        if self.vtype == ARRAY:
            name += f"[{gguf.GGUFValueType(self.item_type).name}]"
        return name


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]       # as stored: ne[0] (the contiguous dimension) first
    ggml_type: int
    offset: int                  # relative to the data section
    nbytes: int

    @property
    def type_name(self) -> str:
        return gguf_constants().GGMLQuantizationType(self.ggml_type).name


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    kv: dict[str, KeyValue]
    tensors: dict[str, TensorInfo]     # in file order
    alignment: int
    data_offset: int                   # absolute offset of the data section
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kv.get(key)
        return default if kv is None else kv.value

    @property
    def architecture(self) -> str | None:
        arch = self.get("general.architecture")
        return arch if isinstance(arch, str) else None


FIRST_READ = 1 << 20


class _NeedMore(Exception):
    """The header runs past the bytes read so far (and the file and the cap allow more)."""


def read_header(path: str | Path, where: str | None = None) -> GGUFHeader:
    """Parse and validate the header of the GGUF file ``path`` (no tensor data is read). The
    first MiB is read, and twice as much again while the header runs past what was read, up
    to ``MAX_HEADER_BYTES``. A header parsed earlier in this process is returned again while
    the file is the same (``_remembered``): one command reads a model's headers several times
    (the in-place check, the plan), and a 150k-token vocabulary takes a while to parse."""
    where = where or str(path)
    gguf_constants(where)
    try:
        with open(path, "rb") as f:
            key = _file_key(os.fstat(f.fileno()), str(path), where)
            if key is not None and key in _PARSED:
                return _PARSED[key]
            size = f.seek(0, 2)
            want = min(size, FIRST_READ)
            while True:
                f.seek(0)
                head = f.read(want)
                try:
                    header = parse_header(head, size, where, partial=want < min(
                        size, MAX_HEADER_BYTES))
                    break
                except _NeedMore:
                    want = min(size, MAX_HEADER_BYTES, want * 2)
    except OSError as exc:
        raise GGUFFormatError(f"cannot read: {exc.strerror or exc}", where=where) from None
    _remember(key, header)
    return header


# Parsed headers by file state, as the digest cache keys digests (``digest_cache``): the same
# device, inode, size, mtime and ctime. A file changed less than ``_RACY_NS`` before it was read
# is not remembered: a same-size rewrite within the timestamps' granularity could keep them all.
_PARSED: dict[tuple, GGUFHeader] = {}
_PARSED_MAX = 256
_RACY_NS = 2_000_000_000
_now_ns = time.time_ns


def _file_key(st: os.stat_result, path: str, where: str) -> tuple | None:
    if _now_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, path, where)


def _remember(key: tuple | None, header: GGUFHeader) -> None:
    if key is None:
        return
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.pop(next(iter(_PARSED)))
    _PARSED[key] = header


def parse_header(data: bytes, file_size: int, where: str, partial: bool = False) -> GGUFHeader:
    """Parse ``data``, the start of a file of ``file_size`` bytes (``partial``: more of it could
    be read: running past ``data`` raises ``_NeedMore``, not an error)."""
    gguf = gguf_constants(where)
    r = _Reader(data, where, file_size, partial)
    if r.take(4) != b"GGUF":
        raise GGUFFormatError("not a GGUF file (bad magic)", where=where)
    version = r.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFFormatError(f"unsupported GGUF version {version} (this reads versions "
                              f"{', '.join(map(str, SUPPORTED_VERSIONS))})", where=where)
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    r.bound_count(n_kv, 8 + 1 + 4 + 1, "metadata keys")
    kv: dict[str, KeyValue] = {}
    for _ in range(n_kv):
        key = r.string("key", MAX_KEY_BYTES)
        if key in kv:
            raise GGUFFormatError(f"duplicate metadata key {key!r}", where=where)
        vtype = r.unpack("<I")
        start = r.pos
        item_type, count = r.skip_value(vtype, key)
        kv[key] = KeyValue(key, vtype, bytes(data[start:r.pos]), item_type, count)
    alignment = _alignment(kv, where)
    r.bound_count(n_tensors, 8 + 1 + 4 + 4 + 8, "tensor infos")
    raw_infos = []
    names: set[str] = set()
    for _ in range(n_tensors):
        name = r.string("tensor name", MAX_KEY_BYTES)
        if name in names:
            raise GGUFFormatError(f"duplicate tensor {name!r}", where=where)
        names.add(name)
        n_dims = r.unpack("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})",
                                  where=where)
        shape = tuple(r.unpack("<Q") for _ in range(n_dims))
        raw_infos.append((name, shape, r.unpack("<I"), r.unpack("<Q")))
    data_offset = _align(r.pos, alignment)
    tensors = {}
    for name, shape, ggml_type, offset in raw_infos:
        info = _tensor(gguf, name, shape, ggml_type, offset, alignment, where)
        tensors[name] = info
    _check_layout(tensors, data_offset, file_size, where)
    return GGUFHeader(where, version, kv, tensors, alignment, data_offset, file_size)


def _alignment(kv: dict[str, KeyValue], where: str) -> int:
    entry = kv.get("general.alignment")
    if entry is None:
        return gguf_constants().GGUF_DEFAULT_ALIGNMENT
    value = entry.value
    if entry.vtype != 4 or value == 0 or value & (value - 1):
        raise GGUFFormatError(f"general.alignment must be a UINT32 power of two; got "
                              f"{entry.type_name()} {value!r}", where=where)
    if value > MAX_ALIGNMENT:
        raise GGUFFormatError(f"general.alignment {value} is above modelpatch's alignment budget "
                              f"of {MAX_ALIGNMENT} bytes (1 MiB): every tensor and the header "
                              "would be padded to it", where=where)
    return value


def _tensor(gguf, name, shape, ggml_type, offset, alignment, where) -> TensorInfo:
    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"tensor {name!r} has unknown ggml type {ggml_type}",
                              where=where) from None
    if any(d == 0 for d in shape) or shape[0] % block:
        raise GGUFFormatError(f"tensor {name!r} shape {list(shape)} does not fit type "
                              f"{gguf.GGMLQuantizationType(ggml_type).name} (blocks of {block})",
                              where=where)
    if offset % alignment:
        raise GGUFFormatError(f"tensor {name!r} offset {offset} is not a multiple of the "
                              f"alignment {alignment}", where=where)
    elements = math.prod(shape)
    return TensorInfo(name, shape, ggml_type, offset, elements // block * type_size)


def _check_layout(tensors: dict[str, TensorInfo], data_offset: int, file_size: int,
                  where: str) -> None:
    end_prev, prev = 0, None
    for info in sorted(tensors.values(), key=lambda t: t.offset):
        if info.offset < end_prev:
            raise GGUFFormatError(f"tensor {info.name!r} overlaps {prev!r}", where=where)
        end_prev, prev = info.offset + info.nbytes, info.name
        if data_offset + end_prev > file_size:
            raise GGUFFormatError(f"tensor {info.name!r} ends at byte {data_offset + end_prev}, "
                                  f"past the end of the file ({file_size} bytes)", where=where)


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


class _Reader:
    def __init__(self, data: bytes, where: str, file_size: int, partial: bool = False):
        self.data, self.where, self.pos, self.file_size = memoryview(data), where, 0, file_size
        self.partial = partial

    def fail(self, what: str):
        if self.partial:
            raise _NeedMore
        if len(self.data) < self.file_size:
            raise GGUFFormatError(f"the header is longer than {MAX_HEADER_BYTES} bytes "
                                  f"({what})", where=self.where)
        raise GGUFFormatError(f"truncated header: {what} runs past the end of the file",
                              where=self.where)

    def take(self, n: int) -> memoryview:
        if n > len(self.data) - self.pos:
            self.fail(f"{n} bytes at offset {self.pos}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def bound_count(self, count: int, min_size: int, what: str) -> None:
        """An array bomb (a count the remaining bytes cannot hold) is refused before looping."""
        if count > (len(self.data) - self.pos) // min_size:
            self.fail(f"{count} {what}")

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.unpack("<Q")
        if limit is not None and n > limit:
            raise GGUFFormatError(f"a {what} of {n} bytes (the limit is {limit})",
                                  where=self.where)
        raw = self.take(n)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"a {what} at offset {self.pos - n} is not UTF-8",
                                  where=self.where) from None

    def skip_value(self, vtype: int, key: str) -> tuple[int | None, int]:
        if vtype in _SCALAR:
            self.take(struct.calcsize(_SCALAR[vtype]))
            return None, 1
        if vtype == STRING:
            self.take(self.unpack("<Q"))
            return None, 1
        if vtype != ARRAY:
            raise GGUFFormatError(f"key {key!r} has unknown value type {vtype}",
                                  where=self.where)
        item_type, count = self.unpack("<I"), self.unpack("<Q")
        if item_type in _SCALAR:
            self.take(count * struct.calcsize(_SCALAR[item_type]))
        elif item_type == STRING:
            self.bound_count(count, 8, f"strings in {key!r}")
            for _ in range(count):
                self.take(self.unpack("<Q"))
        else:
            raise GGUFFormatError(f"key {key!r} is an array of unsupported type {item_type} "
                                  "(arrays of arrays are refused)", where=self.where)
        return item_type, count


# ----------------------------------------------------------------------- values

def decode_value(vtype: int, raw: bytes, item_type: int | None = None) -> Any:
    if vtype in _SCALAR:
        return struct.unpack(_SCALAR[vtype], raw)[0]
    if vtype == STRING:
        return raw[8:].decode("utf-8", "surrogateescape")
    count = struct.unpack_from("<Q", raw, 4)[0]
    body = memoryview(raw)[12:]
    if item_type in _SCALAR:
        fmt = _SCALAR[item_type]
        return list(struct.unpack(f"<{count}{fmt[1]}", body))
    out, pos = [], 0
    for _ in range(count):
        n = struct.unpack_from("<Q", body, pos)[0]
        out.append(bytes(body[pos + 8:pos + 8 + n]).decode("utf-8", "surrogateescape"))
        pos += 8 + n
    return out


def encode_value(vtype: int, value: Any, item_type: int | None = None) -> bytes:
    """The encoding of ``value`` as GGUF type ``vtype``; ValueError when it does not fit."""
    if vtype in _SCALAR:
        if vtype == 7 and not isinstance(value, bool):
            raise ValueError(f"expected true/false, got {value!r}")
        if vtype in (6, 12):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"expected a number, got {value!r}")
        elif vtype != 7 and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"expected an integer, got {value!r}")
        try:
            return struct.pack(_SCALAR[vtype], value)
        except struct.error:
            raise ValueError(f"{value!r} is out of range for this type") from None
    if vtype == STRING:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        data = value.encode("utf-8", "surrogateescape")
        return struct.pack("<Q", len(data)) + data
    if vtype == ARRAY:
        if not isinstance(value, list) or item_type not in (*_SCALAR, STRING):
            raise ValueError(f"expected a list, got {value!r}")
        items = b"".join(encode_value(item_type, v) for v in value)
        return struct.pack("<IQ", item_type, len(value)) + items
    raise ValueError(f"unknown value type {vtype}")


def encode_string(text: str) -> bytes:
    return encode_value(STRING, text)


def encode_header(kv: list[tuple[str, KeyValue]], tensors: list[TensorInfo],
                  alignment: int) -> bytes:
    """Header bytes (magic, version 3, counts, metadata, tensor infos), padded to ``alignment``."""
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kv))]
    for key, entry in kv:
        parts += [encode_string(key), struct.pack("<I", entry.vtype), entry.raw]
    for t in tensors:
        parts += [encode_string(t.name), struct.pack("<I", len(t.shape)),
                  struct.pack(f"<{len(t.shape)}Q", *t.shape), struct.pack("<IQ", t.ggml_type,
                                                                            t.offset)]
    head = b"".join(parts)
    return head + b"\0" * (_align(len(head), alignment) - len(head))


def layout(tensors: list[TensorInfo], alignment: int) -> list[TensorInfo]:
    """The tensors with offsets recomputed back to back, each aligned."""
    out, pos = [], 0
    for t in tensors:
        out.append(TensorInfo(t.name, t.shape, t.ggml_type, pos, t.nbytes))
        pos = _align(pos + t.nbytes, alignment)
    return out


def aligned(n: int, alignment: int) -> int:
    return _align(n, alignment)
