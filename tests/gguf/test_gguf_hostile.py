"""Hostile GGUF headers: each is refused with one line naming the file, before any allocation
its counts ask for; random mutations of a real file never raise anything else."""

from __future__ import annotations

import struct
import sys

import pytest
from click.testing import CliRunner
from gguf_fixtures import needs_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patcher.cli import main
from patcher.errors import InputError

U32, U64, STR, ARR = 4, 10, 8, 9


def s(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def tensor(name: str, dims=(32,), ggml_type=0, offset=0, n_dims=None) -> bytes:
    n = len(dims) if n_dims is None else n_dims
    return (s(name) + struct.pack("<I", n) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", ggml_type, offset))


def gguf_bytes(kvs=(), tensors=(), *, magic=b"GGUF", version=3, n_kv=None, n_tensors=None,
               data=b"\0" * 256, alignment=32) -> bytes:
    head = (magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                len(kvs) if n_kv is None else n_kv)
            + b"".join(kvs) + b"".join(tensors))
    head += b"\0" * (-len(head) % alignment)
    return head + data


ARCH = kv("general.architecture", STR, s("llama"))
CASES = {
    "bad magic": (gguf_bytes(magic=b"GGML"), "bad magic"),
    "version 1": (gguf_bytes(version=1), "unsupported GGUF version 1"),
    "version 4": (gguf_bytes(version=4), "unsupported GGUF version 4"),
    "truncated": (b"GGUF\3\0\0\0", "truncated header"),
    "kv count bomb": (gguf_bytes([ARCH], n_kv=2**62), f"{2**62} metadata keys"),
    "tensor count bomb": (gguf_bytes([ARCH], n_tensors=2**40), str(2**40)),
    "key length bomb": (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**63) + b"\0" * 64,
                        "limit is 65535"),
    "string length bomb": (gguf_bytes([s("k") + struct.pack("<IQ", STR, 2**60)]),
                           "truncated header"),
    "u32 array bomb": (gguf_bytes([kv("k", ARR, struct.pack("<IQ", U32, 2**61))]),
                       "truncated header"),
    "string array bomb": (gguf_bytes([kv("k", ARR, struct.pack("<IQ", STR, 2**61))]),
                          f"{2**61} strings in 'k'"),
    "nested array": (gguf_bytes([kv("k", ARR, struct.pack("<IQ", ARR, 1))]),
                     "arrays of arrays are refused"),
    "unknown value type": (gguf_bytes([kv("k", 13, b"")]), "unknown value type 13"),
    "duplicate key": (gguf_bytes([ARCH, ARCH]), "duplicate metadata key 'general.architecture'"),
    "duplicate tensor": (gguf_bytes([ARCH], [tensor("a"), tensor("a", offset=128)]),
                         "duplicate tensor 'a'"),
    "offset past the end": (gguf_bytes([ARCH], [tensor("a", offset=2**40)]),
                            "past the end of the file"),
    "misaligned": (gguf_bytes([ARCH], [tensor("a", offset=4)]), "not a multiple of the alignment"),
    "overlap": (gguf_bytes([ARCH], [tensor("a"), tensor("b", offset=96)]), "'b' overlaps 'a'"),
    "zero dims": (gguf_bytes([ARCH], [tensor("a", dims=(), n_dims=0)]), "0 dimensions"),
    "five dims": (gguf_bytes([ARCH], [tensor("a", dims=(1,) * 5)]), "5 dimensions"),
    "unknown ggml type": (gguf_bytes([ARCH], [tensor("a", ggml_type=999)]),
                          "unknown ggml type 999"),
    "shape not in blocks": (gguf_bytes([ARCH], [tensor("a", dims=(33,), ggml_type=8)]),
                            "does not fit type Q8_0"),
    "zero dimension": (gguf_bytes([ARCH], [tensor("a", dims=(32, 0))]), "does not fit"),
    "alignment not a power of two": (gguf_bytes([kv("general.alignment", U32,
                                                    struct.pack("<I", 24))]),
                                     "power of two"),
    "alignment past the budget": (gguf_bytes([ARCH, kv("general.alignment", U32,
                                                    struct.pack("<I", 2**31))], data=b""),
                                  "above modelpatch's alignment budget of 1048576 bytes"),
    "alignment of the wrong type": (gguf_bytes([kv("general.alignment", U64,
                                                   struct.pack("<Q", 32))]), "UINT32"),
    "key not utf-8": (gguf_bytes([struct.pack("<Q", 2) + b"\xff\xfe" + struct.pack("<I", U32)
                                  + b"\0" * 4]), "not UTF-8"),
}


@needs_gguf
@pytest.mark.parametrize("name", list(CASES))
def test_hostile_header_is_refused_in_one_line(tmp_path, name):
    data, message = CASES[name]
    root = tmp_path / "m"
    root.mkdir()
    (root / "model.gguf").write_bytes(data)
    result = CliRunner().invoke(main, ["inspect", str(root)])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.gguf" in lines[0], lines
    assert message in lines[0], lines[0]


@needs_gguf
def test_a_well_formed_handmade_header_is_accepted(tmp_path):
    from patcher.gguf.format import read_header

    path = tmp_path / "ok.gguf"
    path.write_bytes(gguf_bytes([ARCH], [tensor("a"), tensor("b", offset=128)]))
    header = read_header(path)
    assert list(header.tensors) == ["a", "b"] and header.tensors["b"].nbytes == 128


@needs_gguf
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_headers_raise_only_input_errors(data):
    from patcher.gguf.format import parse_header

    base = bytearray(gguf_bytes([ARCH, kv("k", ARR, struct.pack("<IQ", U32, 2) + b"\1" * 8)],
                                [tensor("a"), tensor("b", dims=(32, 2), ggml_type=8,
                                                     offset=128)], data=b"\0" * 400))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(base) - 1))
        base[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(base)))
    try:
        parse_header(bytes(base[:cut]), cut, "fuzz.gguf")
    except InputError as exc:
        assert "\n" not in str(exc)


def test_without_gguf_py_the_cli_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)      # import gguf raises ImportError
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes([ARCH]))
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install -e '.[gguf]'" in lines[0], lines


@needs_gguf
def test_a_header_past_the_cap_is_refused_after_reading_at_most_the_cap(tmp_path, monkeypatch):
    from patcher.gguf import format as fmt

    monkeypatch.setattr(fmt, "FIRST_READ", 1024)
    monkeypatch.setattr(fmt, "MAX_HEADER_BYTES", 4096)
    path = tmp_path / "big.gguf"
    path.write_bytes(gguf_bytes([ARCH, kv("general.description", STR, s("x" * 10000))]))
    with pytest.raises(fmt.GGUFFormatError, match="header is longer than 4096 bytes"):
        fmt.read_header(path)
    path.write_bytes(gguf_bytes([ARCH, kv("general.description", STR, s("x" * 3000))]))
    assert fmt.read_header(path).get("general.description") == "x" * 3000


@needs_gguf
def test_an_alignment_past_the_budget_is_refused_before_any_write(tmp_path):
    """A 256-byte file saying general.alignment = 2**31 would make any rewrite pad to 2 GiB."""
    root = tmp_path / "m"
    root.mkdir()
    (root / "model.gguf").write_bytes(gguf_bytes(
        [ARCH, kv("general.alignment", U32, struct.pack("<I", 2**31))], data=b""))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("modelpatch: 1\nname: r\ndescription: d\ngguf:\n  metadata:\n"
                      "    - {set: general.name, value: x}\n")
    result = CliRunner().invoke(main, ["apply", str(recipe), str(root), "-o",
                                       str(tmp_path / "out")])
    assert result.exit_code == 2, (result.output, result.exception)
    (line,) = result.stderr.strip().splitlines()
    assert "model.gguf" in line and "alignment budget of 1048576 bytes" in line
    assert not (tmp_path / "out").exists()
