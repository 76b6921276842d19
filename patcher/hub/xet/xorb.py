"""Xorbs (hub-docs ``docs/xet/xorb.md``): chunks, each an 8-byte header (version 0, compressed
size as 3 little-endian bytes, compression scheme, uncompressed size as 3 bytes) and its data,
stored as is (0), LZ4 frame (1) or byte-grouped by 4 then LZ4 frame (2).

Clients may append a metadata footer after the last chunk (it starts with ``XETBLOB``); it is
skipped, never trusted: the chunks are decoded and hashed here, and the xorb's hash is recomputed
from them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import lz4.frame

from patcher.errors import XetFormatError
from patcher.hub.xet.chunking import MAX_CHUNK_SIZE
from patcher.hub.xet.hashing import chunk_hash, xorb_hash

HEADER_SIZE = 8
CHUNK_VERSION = 0
SCHEME_NONE, SCHEME_LZ4, SCHEME_BG4_LZ4 = 0, 1, 2
SCHEMES = (SCHEME_NONE, SCHEME_LZ4, SCHEME_BG4_LZ4)
FOOTER_IDENT = b"XETBLOB"
# The protocol's cap on a serialized xorb
MAX_XORB_SIZE = 64 * 1024 * 1024


@dataclass(frozen=True)
class ChunkRecord:
    """One chunk of a parsed xorb: where its header starts, its stored and raw sizes and hash."""

    offset: int
    stored_size: int
    size: int
    hash: bytes

    @property
    def end(self) -> int:
        """The offset just past this chunk's data."""
        return self.offset + HEADER_SIZE + self.stored_size


def bg4_group(data: bytes) -> bytes:
    """Byte grouping: every 4th byte from offset 0, then from 1, 2 and 3."""
    return b"".join(data[i::4] for i in range(4))


def bg4_ungroup(data: bytes) -> bytes:
    """The inverse of ``bg4_group``."""
    n = len(data)
    out = bytearray(n)
    start = 0
    for i in range(4):
        count = n // 4 + (1 if i < n % 4 else 0)
        out[i::4] = data[start:start + count]
        start += count
    return bytes(out)


def _lz4_decode(data: bytes, size: int) -> bytes:
    decoder = lz4.frame.LZ4FrameDecompressor()
    try:
        raw = decoder.decompress(data, max_length=size + 1)
    except RuntimeError as err:
        raise XetFormatError(f"a chunk's LZ4 data does not decode: {err}") from None
    if len(raw) != size or not decoder.eof:
        raise XetFormatError(f"a chunk's LZ4 data does not decode to its {size} bytes")
    return raw


def decode_chunk(scheme: int, stored: bytes, size: int) -> bytes:
    """A chunk's raw bytes from its stored form; the size must be exactly ``size``."""
    if scheme == SCHEME_NONE:
        if len(stored) != size:
            raise XetFormatError("an uncompressed chunk's sizes differ")
        return bytes(stored)
    if scheme == SCHEME_LZ4:
        return _lz4_decode(stored, size)
    if scheme == SCHEME_BG4_LZ4:
        return bg4_ungroup(_lz4_decode(stored, size))
    raise XetFormatError(f"unknown chunk compression scheme {scheme}")


def encode_chunk(data: bytes, scheme: int = SCHEME_LZ4) -> bytes:
    """A chunk's header and stored data; kept uncompressed where compressing does not shrink it."""
    if len(data) > MAX_CHUNK_SIZE:
        raise XetFormatError(f"a chunk is at most {MAX_CHUNK_SIZE} bytes")
    stored = data
    if scheme == SCHEME_LZ4:
        stored = lz4.frame.compress(data)
    elif scheme == SCHEME_BG4_LZ4:
        stored = lz4.frame.compress(bg4_group(data))
    elif scheme != SCHEME_NONE:
        raise XetFormatError(f"unknown chunk compression scheme {scheme}")
    if len(stored) >= len(data):
        scheme, stored = SCHEME_NONE, data
    header = (bytes((CHUNK_VERSION,)) + len(stored).to_bytes(3, "little") + bytes((scheme,))
              + len(data).to_bytes(3, "little"))
    return header + stored


def serialize_xorb(chunks: Iterable[bytes], scheme: int = SCHEME_LZ4) -> bytes:
    """Chunks serialized as a xorb (no footer)."""
    return b"".join(encode_chunk(chunk, scheme) for chunk in chunks)


def _header(data: bytes, offset: int) -> tuple[int, int, int]:
    if offset + HEADER_SIZE > len(data):
        raise XetFormatError(f"a chunk header at byte {offset} is cut short")
    head = data[offset:offset + HEADER_SIZE]
    if head[0] != CHUNK_VERSION:
        raise XetFormatError(f"the chunk header at byte {offset} has version {head[0]}, not 0")
    stored = int.from_bytes(head[1:4], "little")
    scheme = head[4]
    size = int.from_bytes(head[5:8], "little")
    if scheme not in SCHEMES:
        raise XetFormatError(f"the chunk at byte {offset} has unknown compression {scheme}")
    if size == 0 or size > MAX_CHUNK_SIZE:
        raise XetFormatError(f"the chunk at byte {offset} claims {size} bytes "
                             f"(1 to {MAX_CHUNK_SIZE})")
    if offset + HEADER_SIZE + stored > len(data):
        raise XetFormatError(f"the chunk at byte {offset} runs past the xorb's end")
    return stored, scheme, size


def iter_xorb(data: bytes, max_chunks: int) -> Iterator[tuple[ChunkRecord, bytes]]:
    """Each chunk of a serialized xorb with its raw bytes, up to a footer or the end. More than
    ``max_chunks`` chunks, a bad header or data that does not decode raise ``XetFormatError``."""
    offset, count = 0, 0
    while offset < len(data):
        if data.startswith(FOOTER_IDENT, offset):
            return
        stored, scheme, size = _header(data, offset)
        count += 1
        if count > max_chunks:
            raise XetFormatError(f"a xorb has more than {max_chunks} chunks")
        body = data[offset + HEADER_SIZE:offset + HEADER_SIZE + stored]
        raw = decode_chunk(scheme, body, size)
        yield ChunkRecord(offset, stored, size, chunk_hash(raw)), raw
        offset += HEADER_SIZE + stored


def parse_xorb(data: bytes, max_chunks: int = 1 << 20) -> list[ChunkRecord]:
    """The chunks of a serialized xorb (decoded and hashed, their data not kept)."""
    records = [record for record, _ in iter_xorb(data, max_chunks)]
    if not records:
        raise XetFormatError("a xorb has no chunks")
    return records


def records_hash(records: Sequence[ChunkRecord]) -> bytes:
    """The xorb hash its chunk records give."""
    return xorb_hash([(r.hash, r.size) for r in records])


def read_chunks(data: bytes, first: int, records: Sequence[ChunkRecord]) -> list[bytes]:
    """The raw bytes of consecutive chunks ``records`` (whose first has index ``first``, only for
    messages) out of ``data``, the xorb's bytes from the first record's offset on."""
    out, base = [], records[0].offset if records else 0
    for index, record in enumerate(records, start=first):
        start = record.offset - base
        stored, scheme, size = _header(data, start)
        if size != record.size:
            raise XetFormatError(f"chunk {index} changed size")
        out.append(decode_chunk(scheme, data[start + HEADER_SIZE:start + HEADER_SIZE + stored],
                                size))
    return out
