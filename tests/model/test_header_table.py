"""Whole-column header checks (patcher.model.tensor_table) and the duplicate-key proof
(patcher.config.unique_keys): the fast path either gives exactly what the per-entry path gives,
or leaves the header to it, so every defect is still named the same way."""

from __future__ import annotations

import json
import random
import struct

import pytest

from patcher.config.unique_keys import key_count, keys_all_distinct
from patcher.errors import SafetensorsFormatError
from patcher.model import safetensors_io as sio
from patcher.model.tensor_table import TensorTable


def _raw(entries: dict, metadata=None) -> bytes:
    doc = ({"__metadata__": metadata} if metadata is not None else {}) | entries
    return json.dumps(doc, separators=(",", ":")).encode()


def _slow(path, size, raw, where):
    """The per-entry path alone, as before the fast one existed."""
    tensors, metadata = sio._parse_header_json(raw, where)
    header = sio.ShardHeader(path=path, header_len=len(raw), file_size=size, tensors=tensors,
                             metadata=metadata)
    sio._check_layout(header, where)
    return header


def _random_header(rng: random.Random) -> tuple[dict, int]:
    entries, offset = {}, 0
    for i in range(rng.randint(1, 30)):
        dtype = rng.choice(["F32", "BF16", "U8", "F8_E4M3", "I64", "F4"])
        shape = [rng.randint(1, 5) for _ in range(rng.randint(0, 3))]
        if dtype == "F4":
            shape = shape + [2]
        n = sio.tensor_nbytes(dtype, shape)
        entries[f"model.layers.{i}.w{rng.randint(0, 9)}"] = {
            "dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    names = list(entries)
    rng.shuffle(names)                     # header order need not be data order
    return {n: entries[n] for n in names}, offset


@pytest.mark.parametrize("seed", range(40))
def test_fast_path_gives_what_the_per_entry_path_gives(tmp_path, seed):
    entries, data = _random_header(random.Random(seed))
    raw = _raw(entries, {"format": "pt"} if seed % 2 else None)
    size = 8 + len(raw) + data
    fast = sio.parse_header(tmp_path, size, raw, "x")
    assert isinstance(fast.tensors, TensorTable)
    slow = _slow(tmp_path, size, raw, "x")
    assert dict(fast.tensors.items()) == dict(slow.tensors.items())
    assert list(fast.tensors) == list(slow.tensors)
    assert fast.metadata == slow.metadata and fast == slow


def _defect(entries, data_size, metadata=None, raw=None):
    raw = raw if raw is not None else _raw(entries, metadata)
    with pytest.raises(SafetensorsFormatError) as fast:
        sio.parse_header(None, 8 + len(raw) + data_size, raw, "f.safetensors")
    with pytest.raises(SafetensorsFormatError) as slow:
        _slow(None, 8 + len(raw) + data_size, raw, "f.safetensors")
    assert str(fast.value) == str(slow.value)
    return str(fast.value)


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}}


@pytest.mark.parametrize("change, size, expect", [
    ({"b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, 12, "overlap"),
    ({"b": {"dtype": "U8", "shape": [4], "data_offsets": [9, 13]}}, 13, "gap"),
    ({}, 16, "trailing"),
    ({"b": {"dtype": "U8", "shape": [5], "data_offsets": [8, 12]}}, 12, "needs 5 bytes"),
    ({"b": {"dtype": "X9", "shape": [4], "data_offsets": [8, 12]}}, 12, "unknown dtype"),
    ({"b": {"dtype": "U8", "shape": [True, 4], "data_offsets": [8, 12]}}, 12, "list of integers"),
    ({"b": {"dtype": "U8", "shape": [-4], "data_offsets": [8, 12]}}, 12, "negative"),
    ({"b": {"dtype": "U8", "shape": [4], "data_offsets": [8]}}, 12, "begin, end"),
    ({"b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12], "x": 1}}, 12, "unexpected"),
    ({"b": {"dtype": "F4", "shape": [3], "data_offsets": [8, 10]}}, 10, "whole number"),
    ({"b": {"dtype": "U8", "shape": [2**40, 2**40], "data_offsets": [8, 12]}}, 12, "overflow"),
    # offsets columns are split with one strict zip: pairs only, of integers
    ({"b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12, 12]}}, 12, "begin, end"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]},
      "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12, 12]}}, 12, "begin, end"),
    ({"b": {"dtype": "U8", "shape": [4], "data_offsets": {"s": 8, "e": 12}}}, 12, "begin, end"),
    ({"b": {"dtype": "U8", "shape": [4], "data_offsets": "ab"}}, 12, "begin, end"),
    ({"b": {"dtype": "U8", "shape": [4], "data_offsets": [8.0, 12]}}, 12, "begin, end"),
    # in header order: tiled from 4, not 0 (the sorted check then names the gap)
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
      "b": {"dtype": "U8", "shape": [4], "data_offsets": [12, 16]}}, 16, "gap"),
])
def test_defects_are_named_as_by_the_per_entry_path(change, size, expect):
    assert expect in _defect(GOOD | change, size)


def test_a_duplicate_tensor_name_is_caught_without_the_hook():
    raw = (b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
           b'"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}')
    assert "duplicate key 'a'" in _defect(None, 4, raw=raw)
    inner = b'{"a":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
    assert "duplicate key 'dtype'" in _defect(None, 4, raw=inner)
    meta = b'{"__metadata__":{"k":"v","k":"w"},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
    assert "duplicate key 'k'" in _defect(None, 4, raw=meta)


def test_empty_tensors_and_escapes_take_the_exact_path(tmp_path):
    entries = {"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
               "a\\u00e9": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}
    raw = json.dumps(entries, separators=(",", ":")).replace("\\\\", "\\").encode()
    header = sio.parse_header(tmp_path, 8 + len(raw) + 2, raw, "x")
    assert not isinstance(header.tensors, TensorTable)
    assert set(header.tensors) == {"e", "a\u00e9"}
    assert header == _slow(tmp_path, 8 + len(raw) + 2, raw, "x")


def test_unique_keys_proof():
    assert keys_all_distinct(b'{"a":1,"b":{"c":[{"d":2}]}}', {"a": 1, "b": {"c": [{"d": 2}]}})
    assert key_count({"a": [{"b": 1}, {"c": {"d": 1}}], "e": "x"}) == 5
    # a duplicate: json.loads kept one key of two
    assert not keys_all_distinct(b'{"a":1,"a":2}', json.loads('{"a":1,"a":2}'))
    # a colon inside a string is counted as one (test_colons_inside_strings_are_accounted_for)
    assert keys_all_distinct(b'{"a":"x:y"}', {"a": "x:y"})


def test_a_real_file_reads_the_same(tmp_path):
    header, layout = sio.encode_header([sio.OutputTensor("w", "BF16", (3, 4)),
                                        sio.OutputTensor("s", "F32", ())], {"format": "pt"})
    path = tmp_path / "m.safetensors"
    path.write_bytes(header + bytes(sum(t.nbytes for t in layout)))
    read = sio.read_header(path)
    assert isinstance(read.tensors, TensorTable)
    assert read.tensors["w"] == sio.TensorInfo("w", "BF16", (3, 4), 0, 24)
    assert "s" in read.tensors and "x" not in read.tensors and len(read.tensors) == 2
    assert struct.unpack("<Q", header[:8])[0] == read.header_len


@pytest.mark.parametrize(("raw", "proven"), [
    (b'{"t":"2026-12-03T22:37:01Z","r":{"text":"a: b"}}', True),   # colons in strings, kept
    (b'{"k:x":1}', True),                                          # a colon in a key
    (b'{"a":"x:y","a":"z"}', False),               # a duplicate whose value held a colon
    (b'{"a":1,"a":2,"b":"\\u003a"}', False),       # an escaped colon hides the lost key
    (b'{"a":1,"a":2,"b":"\\u003A:"}', False),
    (b'{"a":"\\u003a"}', True),                    # no colon byte but the key's
])
def test_colons_inside_strings_are_accounted_for(raw, proven):
    assert keys_all_distinct(raw, json.loads(raw)) is proven


def test_a_u_escape_that_only_the_pure_python_scanner_decodes_is_not_trusted():
    """json's pure-Python fallback decodes ``\\u+03a`` to a colon with int(x, 16); where it
    parses, the lost key would hide behind that colon."""
    assert not keys_all_distinct(b'{"a":1,"a":"\\u+03a"}', {"a": ":"})
