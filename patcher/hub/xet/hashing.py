"""Xet hashes (hub-docs ``docs/xet/hashing.md``): the keyed blake3 chunk hash, the Merkle
aggregation that gives a xorb's hash and, keyed once more with zeros, a file's hash, the term
verification hash a shard carries for each term, the keyed form the global dedupe answer uses, and
the string form hashes take in URLs and JSON.

A hash is 32 raw bytes here; ``hash_to_hex``/``hex_to_hash`` convert to and from the string form,
which prints each 8-byte word as a little-endian 64-bit number (never the bytes in order)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from blake3 import blake3

from patcher.errors import XetHashFormatError

HASH_SIZE = 32
ZERO_HASH = bytes(HASH_SIZE)

DATA_KEY = bytes((
    102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28,
    157, 228, 33, 16, 155, 235, 43, 88, 180, 208, 176, 75, 147, 173, 242, 41))
INTERNAL_NODE_KEY = bytes((
    1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230,
    93, 221, 83, 111, 55, 199, 109, 210, 248, 99, 82, 230, 74, 83, 113, 63))
VERIFICATION_KEY = bytes((
    127, 24, 87, 214, 206, 86, 237, 102, 18, 127, 249, 19, 231, 165, 195, 243,
    164, 205, 38, 213, 181, 219, 73, 230, 65, 36, 152, 127, 40, 251, 148, 195))

# The aggregation tree's mean branching factor: a node closes after a child whose hash is 0 modulo
# this, with at least 2 and at most 2 * it + 1 children.
MEAN_BRANCHING = 4

_HEX_DIGITS = frozenset("0123456789abcdef")


def hash_to_hex(raw: bytes) -> str:
    """The string form: each 8-byte word read as a little-endian u64, printed as 16 hex digits."""
    if len(raw) != HASH_SIZE:
        raise XetHashFormatError(f"a hash is {HASH_SIZE} bytes, not {len(raw)}")
    return "".join(raw[i:i + 8][::-1].hex() for i in range(0, HASH_SIZE, 8))


def hex_to_hash(text: str) -> bytes:
    """The raw bytes of a hash's string form; only 64 lowercase hex digits are accepted."""
    if len(text) != 2 * HASH_SIZE or not set(text) <= _HEX_DIGITS:
        raise XetHashFormatError("a hash is 64 lowercase hexadecimal digits")
    return b"".join(bytes.fromhex(text[i:i + 16])[::-1] for i in range(0, 2 * HASH_SIZE, 16))


def is_hash_hex(text: str) -> bool:
    return len(text) == 2 * HASH_SIZE and set(text) <= _HEX_DIGITS


def chunk_hash(data: bytes) -> bytes:
    """A chunk's hash: blake3 keyed with DATA_KEY over the chunk's bytes."""
    return blake3(data, key=DATA_KEY).digest()


def keyed_hash(raw: bytes, key: bytes) -> bytes:
    """``raw`` (a hash) keyed with ``key``: the file hash's last step (key of zeros) and the form
    chunk hashes take in a global dedupe answer (the footer's key)."""
    return blake3(raw, key=key).digest()


def verification_hash(chunk_hashes: Iterable[bytes]) -> bytes:
    """A shard term's verification hash: blake3 keyed with VERIFICATION_KEY over the raw chunk
    hashes of the term's chunk range, concatenated."""
    return blake3(b"".join(chunk_hashes), key=VERIFICATION_KEY).digest()


def _merge_cut(nodes: Sequence[tuple[bytes, int]], start: int) -> int:
    left = len(nodes) - start
    if left <= 2:
        return left
    end = min(2 * MEAN_BRANCHING + 1, left)
    for i in range(2, end):
        if int.from_bytes(nodes[start + i][0][24:32], "little") % MEAN_BRANCHING == 0:
            return i + 1
    return end


def _merged(nodes: Sequence[tuple[bytes, int]]) -> tuple[bytes, int]:
    text = "".join(f"{hash_to_hex(h)} : {size}\n" for h, size in nodes)
    return (blake3(text.encode("ascii"), key=INTERNAL_NODE_KEY).digest(),
            sum(size for _, size in nodes))


def merkle_root(chunks: Sequence[tuple[bytes, int]]) -> bytes:
    """The aggregated hash of ``(chunk hash, chunk size)`` pairs; the zero hash for none."""
    level = list(chunks)
    if not level:
        return ZERO_HASH
    while len(level) > 1:
        merged, start = [], 0
        while start < len(level):
            cut = start + _merge_cut(level, start)
            merged.append(_merged(level[start:cut]))
            start = cut
        level = merged
    return level[0][0]


def xorb_hash(chunks: Sequence[tuple[bytes, int]]) -> bytes:
    """A xorb's hash: the aggregated hash of its chunks."""
    return merkle_root(chunks)


def file_hash(chunks: Sequence[tuple[bytes, int]]) -> bytes:
    """A file's hash: the aggregated hash of its chunks keyed with 32 zero bytes (the zero hash
    for an empty file)."""
    if not chunks:
        return ZERO_HASH
    return keyed_hash(merkle_root(chunks), ZERO_HASH)
