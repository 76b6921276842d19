"""Tensor sizes as the safetensors library computes them: the element count multiplies the
dimensions left to right in checked 64-bit arithmetic, then the bit count (element count x dtype
bits) is checked too, and must be a whole number of bytes (sub-byte dtypes F4, F6_*).

Each case is checked three ways: ``read_header`` (and ``ModelDir.open``), ``modelpatch inspect``
(exit 2, one line), and the safetensors library itself, which must agree on what it refuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from model_helpers import assert_cli_error, entry, expect_error, st_bytes
from safetensors import safe_open

from patcher.errors import SafetensorsFormatError
from patcher.model.model_dir import ModelDir
from patcher.model.safetensors_io import read_header, size_defect

OVERFLOW = "the product of its dimensions overflows 64 bits"
BITS_OVERFLOW = "overflow a 64-bit bit count"
NOT_BYTES = "not a whole number of bytes"

# (id, dtype, shape, data bytes, message fragment)
REFUSED = [
    ("dims-overflow-before-zero", "F32", [2**62, 2**62, 0], 0,
     f"shape [{2**62}, {2**62}, 0]: {OVERFLOW}"),
    ("dims-overflow-then-nonzero", "U8", [2, 2**63, 0], 0, OVERFLOW),
    ("one-dim-2**64", "U8", [2**64, 0], 0, OVERFLOW),
    ("f4-dims-overflow", "F4", [3, 2**63, 2**63], 0, OVERFLOW),
    ("u8-bits-overflow", "U8", [2**63], 0,
     f"shape [{2**63}] x U8: {2**63} elements of 8 bits {BITS_OVERFLOW}"),
    ("f32-bits-overflow", "F32", [2**60], 0, BITS_OVERFLOW),
    ("u8-max-elements", "U8", [2**64 - 1], 0, BITS_OVERFLOW),
    ("f4-odd-count", "F4", [3], 2,
     "shape [3] x F4: 3 elements of 4 bits are 12 bits, " + NOT_BYTES),
    ("f4-odd-count-span-1", "F4", [3], 1, NOT_BYTES),
    ("f4-scalar", "F4", [], 1, "shape [] x F4: 1 elements of 4 bits are 4 bits"),
    ("f6-e2m3-five", "F6_E2M3", [5], 4, "30 bits, " + NOT_BYTES),
    ("f6-e3m2-two", "F6_E3M2", [2, 1], 2, "12 bits, " + NOT_BYTES),
    ("f6-scalar", "F6_E3M2", [], 1, NOT_BYTES),
]

# (id, dtype, shape, data bytes): sizes the library accepts, and so must we.
ACCEPTED = [
    ("zero-first", "F32", [0, 2**62, 2**62], 0),
    ("zero-last-no-overflow", "U8", [2, 2**62, 0], 0),
    ("zero-with-huge-dim", "F32", [2**61, 0], 0),
    ("zero-with-u64-max-dim", "U8", [2**64 - 1, 0], 0),
    ("f4-even", "F4", [4], 2),
    ("f4-empty", "F4", [0, 3], 0),
    ("f6-four", "F6_E2M3", [4], 3),
    ("f6-e3m2-eight", "F6_E3M2", [2, 4], 6),
]


def _library_refuses(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="numpy") as f:
            f.get_slice("w").get_shape()
    except Exception:  # the library raises SafetensorError (and others) for a bad header
        return True
    return False


def _model(tmp_path: Path, dtype: str, shape: list, nbytes: int) -> tuple[Path, Path]:
    model = tmp_path / "m"
    model.mkdir()
    shard = model / "model.safetensors"
    shard.write_bytes(st_bytes({"w": entry(dtype, shape, 0, nbytes)}, nbytes))
    return model, shard


@pytest.mark.parametrize("dtype, shape, nbytes, message",
                         [pytest.param(*c[1:], id=c[0]) for c in REFUSED])
def test_size_defect_is_refused_like_the_library(tmp_path: Path, dtype, shape, nbytes, message):
    model, shard = _model(tmp_path, dtype, shape, nbytes)
    assert _library_refuses(shard)
    with expect_error(SafetensorsFormatError, shard, message, "w"):
        read_header(shard)
    with expect_error(SafetensorsFormatError, shard, message, "w"):
        ModelDir.open(model)
    assert_cli_error(model, str(shard), "tensor 'w'", message)


@pytest.mark.parametrize("dtype, shape, nbytes",
                         [pytest.param(*c[1:], id=c[0]) for c in ACCEPTED])
def test_sizes_the_library_accepts_are_accepted(tmp_path: Path, dtype, shape, nbytes):
    model, shard = _model(tmp_path, dtype, shape, nbytes)
    assert not _library_refuses(shard)
    info = read_header(shard).tensors["w"]
    assert (info.dtype, list(info.shape), info.nbytes) == (dtype, shape, nbytes)
    assert size_defect(dtype, shape) is None
    assert ModelDir.open(model).tensor("w") == info


def test_size_defect_is_checked_before_the_span(tmp_path: Path):
    """A span that would match the rounded-up size does not make an odd F4 count valid."""
    model, shard = _model(tmp_path, "F4", [5], 3)      # ceil(20 bits / 8) = 3
    with expect_error(SafetensorsFormatError, shard, "20 bits, " + NOT_BYTES, "w"):
        read_header(shard)


def test_a_defect_in_one_of_many_tensors_names_that_tensor(tmp_path: Path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(st_bytes({"a": entry("F32", [2], 0, 8),
                               "bad": entry("F32", [2**62, 2**62, 0], 8, 8),
                               "c": entry("F4", [2], 8, 9)}, 9))
    with expect_error(SafetensorsFormatError, path, OVERFLOW, "bad"):
        read_header(path)


def test_amd_float8_variants_are_read_and_copied(tmp_path):
    """F8_E4M3FNUZ / F8_E5M2FNUZ (torch's *_fnuz, written by AMD's quantizers): read like any
    dtype, and carried through a rewrite byte for byte."""
    import torch
    from safetensors.torch import load_file, save_file

    from patcher import api

    model = tmp_path / "m"
    model.mkdir()
    tensors = {"a.weight": torch.arange(16, dtype=torch.uint8).view(torch.float8_e4m3fnuz),
               "b.weight": torch.arange(8, dtype=torch.uint8).view(torch.float8_e5m2fnuz),
               "c.k_scale": torch.ones(())}
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    (model / "config.json").write_text("{}")
    report = api.inspect(model)
    assert {"F8_E4M3FNUZ", "F8_E5M2FNUZ"} <= set(report.tensors["per_dtype"])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("modelpatch: 1\nname: r\ndescription: x\ntensors:\n"
                      "  - select: {glob: '*.k_scale'}\n    drop: true\n")
    out = api.apply(recipe, model, out=tmp_path / "v").output
    back = load_file(out / "model.safetensors")
    assert sorted(back) == ["a.weight", "b.weight"]
    for name in back:
        assert back[name].dtype == tensors[name].dtype
        assert back[name].view(torch.uint8).equal(tensors[name].view(torch.uint8))
