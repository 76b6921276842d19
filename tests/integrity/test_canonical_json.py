"""The fast canonical JSON encoder gives the standard library's bytes, whatever the value."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.integrity.canonical_json import (
    EncodedArray,
    canonical_json,
    encode_array,
    reference_canonical_json,
)

_scalars = (st.none() | st.booleans() | st.integers() | st.text()
            | st.floats(allow_nan=False, allow_infinity=False))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=5)
                       | st.dictionaries(st.text(), inner, max_size=5)
                       | st.tuples(inner, inner), max_leaves=40)


@settings(max_examples=150, deadline=None)
@given(_values)
def test_same_bytes_as_the_standard_library(value):
    assert canonical_json(value) == reference_canonical_json(value)


@pytest.mark.parametrize("value", [
    {"ü-ключ": "naïve ✓ 😀", "tab\there": "line\nbreak \"quoted\" \\ \u2028 \x00 \x7f"},
    {"f": [0.1, -0.0, 1e300, 5e-324, 1.0, 123456789.125, -2.5e-8]},
    {"i": [0, -1, 2 ** 70, True, False, None]},
    {"deep": [[[{"a": [{}, [], {"b": ()}]}]]], "": {"": ""}},
    [], {}, "", 0, 1.5, None, [{"z": 1, "a": 2, "M": 3, "_": 4, "é": 5, "10": 6, "9": 7}],
])
def test_same_bytes_on_edge_cases(value):
    assert canonical_json(value) == reference_canonical_json(value)


class _Str(str):
    pass


class _Int(int):
    pass


class _Float(float):
    pass


def test_scalar_subclasses_encode_as_the_standard_library_on_the_fast_path(monkeypatch):
    import patcher.integrity.canonical_json as cj
    value = {"v": _Str("2.13.0+cpu"), "i": _Int(7), "f": _Float(0.5), "k": [_Str("é")]}
    monkeypatch.setattr(cj, "reference_canonical_json", None)    # never falls back
    assert canonical_json(value) == reference_canonical_json(value)


@pytest.mark.parametrize("value", [
    {1: "int key"}, {None: 1, "x": 2}, [_Str("subclass")], {"k": float("nan")},
    {"k": [float("inf")]}, {"k": {1, 2}}, {"k": b"bytes"}, {"k": object()},
])
def test_values_off_the_fast_path_behave_as_the_standard_library(value):
    try:
        expected = reference_canonical_json(value)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            canonical_json(value)
    else:
        assert canonical_json(value) == expected


def test_a_cycle_raises_as_the_standard_library():
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular"):
        canonical_json(cycle)


@settings(max_examples=50, deadline=None)
@given(st.lists(_values, max_size=6), st.integers(min_value=0, max_value=4))
def test_an_encoded_array_embeds_at_any_depth(items, depth):
    array, data = encode_array(items)
    assert data == reference_canonical_json(items)
    assert isinstance(array, EncodedArray) and array == items
    doc: object = {"changes": array, "other": [1, {"x": "y"}]}
    plain: object = {"changes": list(items), "other": [1, {"x": "y"}]}
    for _ in range(depth):
        doc, plain = [{"k": doc}], [{"k": plain}]
    assert canonical_json(doc) == reference_canonical_json(plain)
    assert json.loads(canonical_json(doc)) == json.loads(reference_canonical_json(plain))
