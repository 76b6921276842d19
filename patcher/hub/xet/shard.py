"""Shards (hub-docs ``docs/xet/shard.md``): a 48-byte header, the file info section (per file a
header, its terms, optionally one verification entry per term and the file's sha256), the CAS
info section (per xorb a header and one entry per chunk), each section closed by a bookend, and
an optional 200-byte footer. Every record is 48 bytes; integers are little-endian.

A shard uploaded by a client has no footer; the global dedupe answer has one, carrying the key its
chunk hashes are keyed with (``hashing.keyed_hash``) and the answer's expiry."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from patcher.errors import XetFormatError
from patcher.hub.xet.hashing import HASH_SIZE, ZERO_HASH

HEADER_TAG = (b"HFRepoMetaData\x00" + bytes((
    85, 105, 103, 69, 106, 123, 129, 87, 131, 165, 189, 217, 92, 205, 209, 74, 169)))
HEADER_VERSION = 2
FOOTER_VERSION = 1
HEADER_SIZE = 48
ENTRY_SIZE = 48
FOOTER_SIZE = 200
FLAG_WITH_VERIFICATION = 1 << 31
FLAG_WITH_METADATA_EXT = 1 << 30
BOOKEND = b"\xff" * HASH_SIZE + bytes(16)

_FOUR_U32 = struct.Struct("<4I")
# version, file info / CAS info offsets, the three lookup tables (offset, entry count), the chunk
# hash key, created, expiry, 6 reserved u64, stored bytes on disk, materialized and stored bytes,
# footer offset: 200 bytes
_FOOTER = struct.Struct("<9Q32s2Q6Q4Q")


@dataclass(frozen=True)
class FileTerm:
    """One term of a file: chunks ``[chunk_start, chunk_end)`` of xorb ``xorb_hash``, which
    unpack to ``size`` bytes."""

    xorb_hash: bytes
    size: int
    chunk_start: int
    chunk_end: int
    flags: int = 0


@dataclass(frozen=True)
class FileInfo:
    """A file's reconstruction: its Xet hash, terms, verification hashes (one per term, or
    none) and its sha256 (or none)."""

    file_hash: bytes
    terms: tuple[FileTerm, ...]
    verification: tuple[bytes, ...] | None = None
    sha256: bytes | None = None

    @property
    def size(self) -> int:
        return sum(term.size for term in self.terms)


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk of a xorb listed in a shard: its hash, byte offset in the xorb, raw size."""

    hash: bytes
    offset: int
    size: int


@dataclass(frozen=True)
class XorbInfo:
    """A xorb listed in a shard: its hash, chunks, raw bytes and serialized size."""

    xorb_hash: bytes
    chunks: tuple[ChunkInfo, ...]
    raw_bytes: int
    stored_bytes: int
    flags: int = 0


@dataclass(frozen=True)
class ShardFooter:
    hmac_key: bytes = ZERO_HASH
    created: int = 0
    expiry: int = 0


@dataclass
class Shard:
    files: list[FileInfo] = field(default_factory=list)
    xorbs: list[XorbInfo] = field(default_factory=list)
    footer: ShardFooter | None = None


class _Reader:
    def __init__(self, data: bytes, max_records: int):
        self.data, self.pos, self.left = data, 0, max_records

    def record(self, what: str) -> bytes:
        if self.pos + ENTRY_SIZE > len(self.data):
            raise XetFormatError(f"the shard ends inside a {what} at byte {self.pos}")
        self.left -= 1
        if self.left < 0:
            raise XetFormatError("the shard has more records than the hub accepts")
        out = self.data[self.pos:self.pos + ENTRY_SIZE]
        self.pos += ENTRY_SIZE
        return out


def _file_info(head: bytes, reader: _Reader) -> FileInfo:
    flags, count = struct.unpack_from("<2I", head, HASH_SIZE)
    terms = []
    for _ in range(count):
        rec = reader.record("file term")
        flags_t, size, start, end = _FOUR_U32.unpack_from(rec, HASH_SIZE)
        if end <= start or size == 0:
            raise XetFormatError(f"a file term's chunk range [{start}, {end}) or size is empty")
        terms.append(FileTerm(rec[:HASH_SIZE], size, start, end, flags_t))
    verification = None
    if flags & FLAG_WITH_VERIFICATION:
        verification = tuple(reader.record("verification entry")[:HASH_SIZE]
                             for _ in range(count))
    sha256 = None
    if flags & FLAG_WITH_METADATA_EXT:
        sha256 = reader.record("file metadata")[:HASH_SIZE]
    return FileInfo(head[:HASH_SIZE], tuple(terms), verification, sha256)


def _xorb_info(head: bytes, reader: _Reader) -> XorbInfo:
    flags, count, raw_bytes, stored_bytes = _FOUR_U32.unpack_from(head, HASH_SIZE)
    chunks = []
    for _ in range(count):
        rec = reader.record("chunk entry")
        offset, size = struct.unpack_from("<2I", rec, HASH_SIZE)
        chunks.append(ChunkInfo(rec[:HASH_SIZE], offset, size))
    return XorbInfo(head[:HASH_SIZE], tuple(chunks), raw_bytes, stored_bytes, flags)


def parse_shard(data: bytes, max_records: int = 1 << 20) -> Shard:
    """A shard's files and xorbs (and footer, if it has one). At most ``max_records`` 48-byte
    records are read; anything malformed raises ``XetFormatError``."""
    if len(data) < HEADER_SIZE or data[:HASH_SIZE] != HEADER_TAG:
        raise XetFormatError("not a shard (its header tag is wrong)")
    version, footer_size = struct.unpack_from("<2Q", data, HASH_SIZE)
    if version != HEADER_VERSION:
        raise XetFormatError(f"shard header version {version} (the hub reads {HEADER_VERSION})")
    if footer_size not in (0, FOOTER_SIZE) or footer_size > len(data) - HEADER_SIZE:
        raise XetFormatError(f"shard footer size {footer_size} is not 0 or {FOOTER_SIZE}")
    body_end = len(data) - footer_size
    reader = _Reader(data[:body_end], max_records)
    reader.pos = HEADER_SIZE
    shard = Shard()
    while (head := reader.record("file header"))[:HASH_SIZE] != b"\xff" * HASH_SIZE:
        shard.files.append(_file_info(head, reader))
    while (head := reader.record("xorb header"))[:HASH_SIZE] != b"\xff" * HASH_SIZE:
        shard.xorbs.append(_xorb_info(head, reader))
    if footer_size:
        fields = _FOOTER.unpack_from(data, body_end)
        if fields[0] != FOOTER_VERSION or fields[-1] != body_end:
            raise XetFormatError(f"shard footer version {fields[0]} at {fields[-1]}")
        # the lookup tables between the sections and the footer are derived data: skipped
        shard.footer = ShardFooter(fields[9], fields[10], fields[11])
    elif reader.pos != body_end:
        raise XetFormatError("the shard has bytes after its sections")
    return shard


def _file_records(info: FileInfo) -> list[bytes]:
    flags = 0
    if info.verification is not None:
        if len(info.verification) != len(info.terms):
            raise XetFormatError("a file needs one verification hash per term")
        flags |= FLAG_WITH_VERIFICATION
    if info.sha256 is not None:
        flags |= FLAG_WITH_METADATA_EXT
    out = [info.file_hash + struct.pack("<2I", flags, len(info.terms)) + bytes(8)]
    out += [t.xorb_hash + _FOUR_U32.pack(t.flags, t.size, t.chunk_start, t.chunk_end)
            for t in info.terms]
    out += [h + bytes(16) for h in info.verification or ()]
    if info.sha256 is not None:
        out.append(info.sha256 + bytes(16))
    return out


def _xorb_records(info: XorbInfo) -> list[bytes]:
    out = [info.xorb_hash + _FOUR_U32.pack(info.flags, len(info.chunks), info.raw_bytes,
                                           info.stored_bytes)]
    out += [c.hash + struct.pack("<2I", c.offset, c.size) + bytes(8) for c in info.chunks]
    return out


def serialize_shard(shard: Shard) -> bytes:
    """A shard's bytes; with a footer where ``shard.footer`` is set."""
    file_records = [rec for info in shard.files for rec in _file_records(info)]
    xorb_records = [rec for xorb in shard.xorbs for rec in _xorb_records(xorb)]
    sections = b"".join([*file_records, BOOKEND, *xorb_records, BOOKEND])
    footer_size = FOOTER_SIZE if shard.footer is not None else 0
    head = HEADER_TAG + struct.pack("<2Q", HEADER_VERSION, footer_size)
    if shard.footer is None:
        return head + sections
    xorbs_at = HEADER_SIZE + ENTRY_SIZE * (len(file_records) + 1)
    tables, counts = _lookup_tables(shard)
    lookups_at = HEADER_SIZE + len(sections)
    offsets, pos = [], lookups_at
    for table in tables:
        offsets.append(pos)
        pos += len(table)
    footer = _FOOTER.pack(
        FOOTER_VERSION, HEADER_SIZE, xorbs_at,
        offsets[0], counts[0], offsets[1], counts[1], offsets[2], counts[2],
        shard.footer.hmac_key, shard.footer.created, shard.footer.expiry, 0, 0, 0, 0, 0, 0,
        sum(x.stored_bytes for x in shard.xorbs), sum(f.size for f in shard.files),
        sum(x.raw_bytes for x in shard.xorbs), pos)
    return head + sections + b"".join(tables) + footer


def _truncated(raw: bytes) -> int:
    return int.from_bytes(raw[:8], "little")


def _lookup_tables(shard: Shard) -> tuple[list[bytes], list[int]]:
    """The three sorted lookup tables readers of a footer'd shard search: files (truncated hash,
    record index), xorbs (truncated hash, record index) and chunks (truncated stored hash, xorb
    record index, chunk index)."""
    files, index = [], 0
    for info in shard.files:
        files.append((_truncated(info.file_hash), index))
        index += len(_file_records(info))
    xorbs, chunks, index = [], [], 0
    for xorb in shard.xorbs:
        xorbs.append((_truncated(xorb.xorb_hash), index))
        chunks += [(_truncated(c.hash), index, i) for i, c in enumerate(xorb.chunks)]
        index += 1 + len(xorb.chunks)
    tables = [b"".join(struct.pack("<QI", *e) for e in sorted(files)),
              b"".join(struct.pack("<QI", *e) for e in sorted(xorbs)),
              b"".join(struct.pack("<QII", *e) for e in sorted(chunks))]
    return tables, [len(files), len(xorbs), len(chunks)]
