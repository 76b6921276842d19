"""The Xet format library against independent truth: the specification's examples and the
reference implementation's test vectors (xet-core's aggregated hash tests), and hf_xet's own file
hashes; xorbs and shards round-trip and malformed ones are refused with XetFormatError; the
store's reads of stored files and blob-made xorbs give back exactly the bytes."""

from __future__ import annotations

import hashlib
import io
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.errors import XetFormatError, XetHashFormatError
from patcher.hub.xet import chunking, hashing, shard, xorb

# xet-core merklehash/aggregated_hashes.rs test_correctness: (chunks, xorb hash, file hash)
_REFERENCE = [
    ([("cfc5d07f6f03c29bbf424132963fe08d19a37d5757aaf520bf08119f05cd56d6", 100)],
     "cfc5d07f6f03c29bbf424132963fe08d19a37d5757aaf520bf08119f05cd56d6",
     "8e16257caa3fe079d484d872a8975264b2ff683b0d6db9028cc7c0f968a45661"),
    ([("cfc5d07f6f03c29bbf424132963fe08d19a37d5757aaf520bf08119f05cd56d6", 100),
      ("c3e67584b5c4fc2a89837ec39e40f2c8a6bb0b2987ac94cd4b31e5fbdd210a72", 200),
      ("0d2beb91b9196929a5ddec9f6e306924ddf4a24268e3e59fd8464738d525af37", 300)],
     "71ec1275fca074724e2dd666921b3277c7cee603e4d025bcab2d4050015be2bc",
     "54e55dccc6653c612bdb5576c5d3cb34bb31bc4e100248abccf4c908b3ef7715"),
    ([("cfc5d07f6f03c29bbf424132963fe08d19a37d5757aaf520bf08119f05cd56d6", 100)] * 4,
     "89f2ada89ff8c96763c6b25010e6dd76a4c05b1466207633ea559acf2093211b",
     "2cdba690d0e09563596e0cda626d43eb4c96ef1e994fe72d9b2f5a83cfcd36dd"),
    ([("cfc5d07f6f03c29bbf424132963fe08d19a37d5757aaf520bf08119f05cd56d6", 100),
      ("c3e67584b5c4fc2a89837ec39e40f2c8a6bb0b2987ac94cd4b31e5fbdd210a72", 200),
      ("cfc5d07f6f03c29bbf424132963fe08d19a37d5757aaf520bf08119f05cd56d6", 100),
      ("c3e67584b5c4fc2a89837ec39e40f2c8a6bb0b2987ac94cd4b31e5fbdd210a72", 200),
      ("0d2beb91b9196929a5ddec9f6e306924ddf4a24268e3e59fd8464738d525af37", 300),
      ("adf8773496a9b7319b2e50dc98093f344053b17d8ad37100b9c07d9805988784", 400)],
     "52c826f99507aa05d0b45e9837fa1709e0485425cfbcb1e80db3905cf98b3ee9",
     "91d21684db364c8883ab8209fa5eb2e781cf07f37e1fa43e731c30839afe422f"),
]


def test_hash_string_form_is_the_specs_example():
    # the specification's example (whose printed string drops the "10" of bytes 16..23) ...
    assert hashing.hash_to_hex(bytes(range(32))) == (
        "0706050403020100" "0f0e0d0c0b0a0908" "1716151413121110" "1f1e1d1c1b1a1918")
    # ... and xet-core's endianness test
    raw = bytes((22, 175, 58, 132, 4, 75, 131, 214, 190, 153, 138, 66, 226, 3, 153, 242,
                 204, 86, 80, 234, 249, 153, 80, 99, 159, 80, 65, 138, 236, 231, 149, 78))
    text = "d6834b04843aaf16f29903e2428a99be635099f9ea5056cc4e95e7ec8a41509f"
    assert hashing.hash_to_hex(raw) == text
    assert hashing.hex_to_hash(text) == raw
    for bad in ("", "0" * 63, "G" * 64, "A" * 64, "0" * 65):
        with pytest.raises(XetHashFormatError):
            hashing.hex_to_hash(bad)


@pytest.mark.parametrize("chunks, xorb_hex, file_hex", _REFERENCE)
def test_aggregated_hashes_match_the_reference_vectors(chunks, xorb_hex, file_hex):
    pairs = [(hashing.hex_to_hash(h), size) for h, size in chunks]
    assert hashing.hash_to_hex(hashing.xorb_hash(pairs)) == xorb_hex
    assert hashing.hash_to_hex(hashing.file_hash(pairs)) == file_hex


def test_empty_file_and_xorb_hash_to_zero():
    assert hashing.file_hash([]) == hashing.ZERO_HASH == hashing.xorb_hash([])


def _sample(size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    # half random, half repetitive: cuts are taken both ways (mask and maximum size)
    head = rng.randbytes(size // 2)
    return head + bytes(size - len(head))


@pytest.mark.parametrize("size", [0, 1, 8191, 8192, 8193, 200_000, 700_001])
def test_file_hashes_match_hf_xet(tmp_path, size):
    hf_xet = pytest.importorskip("hf_xet")
    data = _sample(size, size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    expected = hf_xet.hash_files([str(path)])[0].hash
    pairs = [(hashing.chunk_hash(c), len(c)) for c in chunking.chunk_bytes(data)]
    assert hashing.hash_to_hex(hashing.file_hash(pairs)) == expected


def test_chunk_sizes_keep_the_specs_bounds_and_streaming_cuts_the_same():
    data = os.urandom(1_500_000) + bytes(400_000)
    chunks = chunking.chunk_bytes(data)
    assert b"".join(chunks) == data
    assert all(chunking.MIN_CHUNK_SIZE <= len(c) <= chunking.MAX_CHUNK_SIZE for c in chunks[:-1])
    assert len(chunks[-1]) <= chunking.MAX_CHUNK_SIZE
    for read_size in (1, 65_537, 10_000_000):
        streamed = list(chunking.iter_chunks(io.BytesIO(data), read_size=max(read_size, 4096)))
        assert streamed == chunks


def _byte_by_byte(data: bytes) -> list[int]:
    """The specification's pseudocode, literally (for a sampled cross-check)."""
    from patcher.hub.xet.gear_table import GEAR_TABLE
    cuts, h, start = [], 0, 0
    for i, b in enumerate(data):
        h = ((h << 1) + GEAR_TABLE[b]) & 0xFFFFFFFFFFFFFFFF
        size = i + 1 - start
        if size < chunking.MIN_CHUNK_SIZE:
            continue
        if size >= chunking.MAX_CHUNK_SIZE or h & chunking.MASK == 0:
            cuts.append(i + 1)
            start, h = i + 1, 0
    if start < len(data):
        cuts.append(len(data))
    return cuts


def test_vectorised_cuts_equal_the_specs_pseudocode():
    data = random.Random(7).randbytes(300_000) + bytes(140_000)
    assert chunking.chunk_boundaries(data) == _byte_by_byte(data)


@pytest.mark.parametrize("scheme", xorb.SCHEMES)
def test_xorb_round_trip_and_hash(scheme):
    floats = b"".join(int(i * 7).to_bytes(4, "little") for i in range(30_001))
    chunks = chunking.chunk_bytes(floats + os.urandom(50_000))
    data = xorb.serialize_xorb(chunks, scheme)
    records = xorb.parse_xorb(data)
    assert [r.size for r in records] == [len(c) for c in chunks]
    pairs = [(hashing.chunk_hash(c), len(c)) for c in chunks]
    assert xorb.records_hash(records) == hashing.xorb_hash(pairs)
    assert xorb.read_chunks(data[records[1].offset:], 1, records[1:]) == chunks[1:]
    # a footer a client appends is skipped
    assert xorb.parse_xorb(data + b"XETBLOB" + bytes(50)) == records


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 13])
def test_bg4_groups_and_ungroups(n):
    data = bytes(range(n))
    assert xorb.bg4_ungroup(xorb.bg4_group(data)) == data
    if n == 5:
        assert xorb.bg4_group(data) == bytes((0, 4, 1, 2, 3))


@pytest.mark.parametrize("mangle", [
    lambda d: d[:5],                                   # header cut short
    lambda d: b"\x01" + d[1:],                         # version 1
    lambda d: d[:4] + b"\x07" + d[5:],                 # unknown scheme
    lambda d: d[:1] + b"\xff\xff\x00" + d[4:],         # runs past the end
    lambda d: d[:5] + b"\x00\x00\x00" + d[8:],         # zero raw size
    lambda d: d[:5] + (200_000).to_bytes(3, "little") + d[8:],  # over 128 KiB
    lambda d: d[:8] + bytes(len(d) - 8),               # LZ4 garbage
    lambda d: b"",                                     # no chunks
])
def test_malformed_xorbs_raise_format_errors(mangle):
    data = xorb.serialize_xorb([b"abcd" * 3000], xorb.SCHEME_LZ4)
    with pytest.raises(XetFormatError):
        xorb.parse_xorb(mangle(data))


def test_a_lying_uncompressed_size_is_refused():
    data = bytearray(xorb.serialize_xorb([b"abcd" * 3000], xorb.SCHEME_LZ4))
    data[5:8] = (11_999).to_bytes(3, "little")
    with pytest.raises(XetFormatError):
        xorb.parse_xorb(bytes(data))


def test_too_many_chunks_are_refused():
    data = xorb.serialize_xorb([b"x"] * 5, xorb.SCHEME_NONE)
    with pytest.raises(XetFormatError, match="more than 4"):
        xorb.parse_xorb(data, max_chunks=4)


def _sample_shard(with_footer: bool) -> shard.Shard:
    chunks = chunking.chunk_bytes(os.urandom(300_000))
    hashes = [hashing.chunk_hash(c) for c in chunks]
    xhash = hashing.xorb_hash([(h, len(c)) for h, c in zip(hashes, chunks)])
    data = b"".join(chunks)
    offsets = [0]
    for c in chunks[:-1]:
        offsets.append(offsets[-1] + xorb.HEADER_SIZE + len(c))
    files = [shard.FileInfo(
        hashing.file_hash([(h, len(c)) for h, c in zip(hashes, chunks)]),
        (shard.FileTerm(xhash, len(data), 0, len(chunks)),),
        (hashing.verification_hash(hashes),), hashlib.sha256(data).digest())]
    xorbs = [shard.XorbInfo(xhash, tuple(shard.ChunkInfo(h, o, len(c))
                                         for h, o, c in zip(hashes, offsets, chunks)),
                            len(data), len(data) + 8 * len(chunks))]
    footer = shard.ShardFooter(os.urandom(32), 1, 2) if with_footer else None
    return shard.Shard(files, xorbs, footer)


@pytest.mark.parametrize("with_footer", [False, True])
def test_shard_round_trip(with_footer):
    original = _sample_shard(with_footer)
    data = shard.serialize_shard(original)
    assert shard.parse_shard(data) == original


def test_shard_without_files_or_options():
    plain = shard.Shard([shard.FileInfo(b"\x01" * 32, (shard.FileTerm(b"\x02" * 32, 9, 0, 1),))],
                        [])
    assert shard.parse_shard(shard.serialize_shard(plain)) == plain
    assert shard.parse_shard(shard.serialize_shard(shard.Shard())) == shard.Shard()


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2000), st.binary(min_size=1, max_size=8))
def test_mangled_shards_parse_or_raise_format_errors(at, junk):
    data = shard.serialize_shard(_SHARD_BYTES_SAMPLE)
    mangled = data[:at] + junk + data[at + len(junk):]
    try:
        shard.parse_shard(mangled)
    except XetFormatError:
        pass


_SHARD_BYTES_SAMPLE = _sample_shard(True)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_never_a_crash(blob):
    for parse in (xorb.parse_xorb, shard.parse_shard):
        try:
            parse(blob)
        except XetFormatError:
            pass


def test_record_budget_is_enforced():
    data = shard.serialize_shard(_sample_shard(False))
    with pytest.raises(XetFormatError, match="more records"):
        shard.parse_shard(data, max_records=3)


def test_a_stored_file_is_rebuilt_exactly_for_any_range(tmp_path):
    from patcher.hub.store.xet_store import XetStore

    store = XetStore(tmp_path / "xet", tmp_path, tmp_path / "blobs")
    data = random.Random(3).randbytes(150_000) + bytes(250_000)
    chunks = chunking.chunk_bytes(data)
    terms = []
    for lo, hi in ((0, 2), (2, len(chunks))):
        part = xorb.serialize_xorb(chunks[lo:hi])
        records = xorb.parse_xorb(part)
        xorb_hex = hashing.hash_to_hex(xorb.records_hash(records))
        store.store_xorb(xorb_hex, part, records)
        terms.append([xorb_hex, 0, hi - lo, sum(map(len, chunks[lo:hi]))])
    record = {"size": len(data), "sha256": "", "terms": terms}
    rng = random.Random(4)
    for first, last in [(0, len(data) - 1), (0, 0), (len(data) - 1, len(data) - 1)] + [
            sorted(rng.sample(range(len(data)), 2)) for _ in range(20)]:
        got = b"".join(store.iter_file(record, first, last, batch_bytes=50_000))
        assert got == data[first:last + 1], (first, last)


def test_a_xorb_made_from_a_blob_reads_as_its_uncompressed_serialization(tmp_path):
    import hashlib

    from patcher.hub.store.xet_ingest import blob_xorbs
    from patcher.hub.store.xet_store import XetStore

    data = random.Random(5).randbytes(300_000)
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "blobs" / sha[:2]).mkdir(parents=True)
    (tmp_path / "blobs" / sha[:2] / sha).write_bytes(b"x" * 100 + data)
    store = XetStore(tmp_path / "xet", tmp_path, tmp_path / "blobs")
    chunks = chunking.chunk_bytes(data)
    [(base, records)] = list(blob_xorbs(chunks))
    xorb_hex = hashing.hash_to_hex(xorb.records_hash(records))
    store.store_blob_xorb(xorb_hex, sha, base + 100, records)
    expected = xorb.serialize_xorb(chunks, xorb.SCHEME_NONE)
    assert store.xorb_size(xorb_hex) == len(expected)
    rng = random.Random(6)
    for first, last in [(0, len(expected) - 1)] + [sorted(rng.sample(range(len(expected)), 2))
                                                  for _ in range(20)]:
        assert store.read_xorb(xorb_hex, first, last) == expected[first:last + 1]
    assert store.read_chunks(xorb_hex, 1, 3) == chunks[1:3]
