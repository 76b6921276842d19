"""Reading model directories: safetensors header validation, the shard index, symlinks and the
Hugging Face cache layout.

Every defect is built by hand in a temporary directory and checked twice: through the library
(error type, ``where`` names the file, ``tensor`` names the tensor) and through
``modelpatch inspect`` (exit 2, exactly one ``modelpatch: error:`` line on stderr, no traceback).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from model_helpers import (
    SHARD1,
    SHARD2,
    F32x2,
    assert_cli_error,
    entry,
    expect_error,
    invoke,
    raw_bytes,
    save_shard,
    shard_tensors,
    sharded_model,
    st_bytes,
    tensor_bytes,
    write_index,
)
from safetensors import safe_open
from safetensors.torch import save_file

from patcher.errors import ModelDirError, SafetensorsFormatError, ShardIndexError
from patcher.model.model_dir import INDEX_NAME, ModelDir
from patcher.model.safetensors_io import (
    MAX_HEADER_SIZE,
    OutputTensor,
    encode_header,
    read_header,
    tensor_nbytes,
)

HEADER_DEFECTS = [
    ("header-length-past-eof", struct.pack("<Q", 64) + b"{}", "runs past the end of the 10-byte",
     None),
    ("header-length-2**64-1", struct.pack("<Q", 2**64 - 1) + b"{}" * 8, "absurd", None),
    ("header-length-over-limit", struct.pack("<Q", MAX_HEADER_SIZE + 1) + b"{}", "absurd", None),
    ("empty-file", b"", "file is 0 bytes", None),
    ("7-byte-file", b"\x02\0\0\0\0\0\0", "file is 7 bytes", None),
    ("not-json", st_bytes(b'{"w": {"dtype": '), "not valid JSON", None),
    ("empty-header", st_bytes(b""), "not valid JSON", None),
    ("not-utf8", st_bytes(b'{"w\xff": {}}'), "not UTF-8", None),
    ("latin1-metadata", st_bytes('{"__metadata__": {"a": "caf\u00e9"}}'.encode("latin-1")),
     "not UTF-8", None),
    ("array-header", st_bytes(b"[]"), "not a JSON object", None),
    ("string-header", st_bytes(b'"x"'), "not a JSON object", None),
    ("null-header", st_bytes(b"null"), "not a JSON object", None),
    ("duplicate-tensor", st_bytes(b'{"w": %s, "w": %s}' % ((json.dumps(F32x2).encode(),) * 2), 8),
     "duplicate key 'w'", None),
    ("duplicate-metadata-key", st_bytes(b'{"__metadata__": {"a": "1", "a": "2"}}'),
     "duplicate key 'a'", None),
    ("metadata-int-value", st_bytes({"__metadata__": {"format": 1}}),
     "__metadata__ must map strings to strings", None),
    ("metadata-list", st_bytes({"__metadata__": ["pt"]}),
     "__metadata__ must map strings to strings", None),
    ("metadata-string", st_bytes({"__metadata__": "pt"}),
     "__metadata__ must map strings to strings", None),
    ("entry-not-object", st_bytes({"w": [0, 8]}), "entry is not an object", "w"),
    ("unexpected-field", st_bytes({"w": {**F32x2, "offset": 0}}, 8), "unexpected field", "w"),
    ("unknown-dtype", st_bytes({"w": entry("F128", [2], 0, 32)}, 32), "unknown dtype 'F128'", "w"),
    ("torch-dtype-name", st_bytes({"w": entry("float32", [2], 0, 8)}, 8), "unknown dtype", "w"),
    ("missing-dtype", st_bytes({"w": {"shape": [2], "data_offsets": [0, 8]}}, 8),
     "unknown dtype None", "w"),
    ("size-mismatch", st_bytes({"w": entry("F32", [2, 3], 0, 20)}, 20),
     "shape [2, 3] x F32 needs 24 bytes but data_offsets span 20", "w"),
    ("size-mismatch-packed-f4", st_bytes({"w": entry("F4", [6], 0, 2)}, 2),
     "needs 3 bytes but data_offsets span 2", "w"),
    ("negative-dimension", st_bytes({"w": entry("F32", [-2, 4], 0, 0)}), "negative dimension",
     "w"),
    ("shape-float", st_bytes({"w": entry("F32", [2.0], 0, 8)}, 8),
     "shape must be a list of integers", "w"),
    ("shape-string-dim", st_bytes({"w": entry("F32", ["2"], 0, 8)}, 8),
     "shape must be a list of integers", "w"),
    ("shape-bool-dim", st_bytes({"w": entry("F32", [True, 2], 0, 8)}, 8),
     "shape must be a list of integers", "w"),
    ("shape-not-list", st_bytes({"w": entry("F32", "2", 0, 8)}, 8),
     "shape must be a list of integers", "w"),
    ("shape-nested", st_bytes({"w": entry("F32", [[2]], 0, 8)}, 8),
     "shape must be a list of integers", "w"),
    ("shape-missing", st_bytes({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, 8),
     "shape must be a list of integers", "w"),
    ("offsets-one-item", st_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8]}}, 8),
     "data_offsets must be [begin, end]", "w"),
    ("offsets-three-items",
     st_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}}, 8),
     "data_offsets must be [begin, end]", "w"),
    ("offsets-floats", st_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]}},
                                8),
     "data_offsets must be [begin, end]", "w"),
    ("offsets-bools", st_bytes({"w": {"dtype": "BOOL", "shape": [1],
                                      "data_offsets": [False, True]}}, 1),
     "data_offsets must be [begin, end]", "w"),
    ("offsets-missing", st_bytes({"w": {"dtype": "F32", "shape": [2]}}, 8),
     "data_offsets must be [begin, end]", "w"),
    ("offsets-decreasing", st_bytes({"w": entry("F32", [2], 8, 0)}, 8),
     "not an increasing non-negative range", "w"),
    ("offsets-negative", st_bytes({"w": entry("F32", [2], -8, 0)}, 8),
     "not an increasing non-negative range", "w"),
    ("offsets-overlap", st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, 12),
     "overlap tensor 'a'", "b"),
    ("offsets-identical", st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 0, 8)}, 8),
     "overlap tensor 'a'", "b"),
    ("truncated-file", st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 8, 16)}, 12),
     "run past the 12-byte data section", "b"),
    ("offsets-past-eof", st_bytes({"w": entry("U8", [8], 1 << 40, (1 << 40) + 8)}, 8),
     "run past the 8-byte data section", "w"),
    ("gap-between-tensors",
     st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, 20),
     "gap of 4 bytes before data_offsets [12, 20]", "b"),
    ("gap-at-start", st_bytes({"a": entry("F32", [2], 4, 12)}, 12), "gap of 4 bytes", "a"),
    ("trailing-bytes", st_bytes({"a": entry("F32", [2], 0, 8)}, 12),
     "4 trailing bytes after the last tensor", None),
    ("data-without-tensors", st_bytes({}, 8), "8 trailing bytes", None),
]


@pytest.mark.parametrize("content, message, tensor",
                         [pytest.param(*case[1:], id=case[0]) for case in HEADER_DEFECTS])
def test_header_defect(tmp_path: Path, content: bytes, message: str, tensor: str | None):
    model = tmp_path / "model"
    model.mkdir()
    shard = model / "model.safetensors"
    shard.write_bytes(content)

    with expect_error(SafetensorsFormatError, shard, message, tensor):
        read_header(shard)
    with expect_error(SafetensorsFormatError, shard, message, tensor):
        ModelDir.open(model)
    needles = [str(shard), message] + ([f"tensor {tensor!r}"] if tensor else [])
    assert_cli_error(model, *needles)


def test_header_defect_in_second_shard_of_indexed_model(tmp_path: Path):
    """A defect in one shard of many names that shard, also with --json."""
    model, _ = sharded_model(tmp_path)
    shard = model / SHARD2
    data = shard.read_bytes()
    shard.write_bytes(data[:-3])  # truncated download
    line = assert_cli_error(model, str(shard), "data section", "the file is truncated",
                            json_flag=True)
    assert str(model / SHARD1) not in line


def test_truncated_hint(tmp_path: Path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(st_bytes({"w": entry("F32", [4], 0, 16)}, 15))
    with pytest.raises(SafetensorsFormatError) as info:
        read_header(path, display="shown/name.safetensors")
    assert info.value.where == "shown/name.safetensors"
    assert info.value.hint == "the file is truncated"


def test_debug_flag_shows_the_exception(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"abc")
    result = invoke("--debug", "--debug", "inspect", str(model))   # twice: with the traceback
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and SafetensorsFormatError.__name__ in result.stderr


# --- valid safetensors -----------------------------------------------------------------------


def test_read_header_matches_the_safetensors_library(tmp_path: Path):
    tensors = {
        "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "bf16": torch.ones(3, 5, dtype=torch.bfloat16),
        "f16": torch.ones(7, dtype=torch.float16),
        "f8": torch.zeros(4, 16).to(torch.float8_e4m3fn),
        "f8e5": torch.zeros(3).to(torch.float8_e5m2),
        "u8": torch.zeros(4, 8, dtype=torch.uint8),
        "i8": torch.zeros(5, dtype=torch.int8),
        "i32": torch.zeros(2, 2, dtype=torch.int32),
        "i64": torch.zeros(3, dtype=torch.int64),
        "f64": torch.zeros(1, dtype=torch.float64),
        "bool": torch.zeros(9, dtype=torch.bool),
        "scalar": torch.tensor(0.5),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "note": "caf\u00e9"})
    header = read_header(path)

    assert header.metadata == {"format": "pt", "note": "caf\u00e9"}
    assert header.file_size == path.stat().st_size
    assert header.data_offset == 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert header.data_size == sum(tensor_bytes(t) for t in tensors.values())
    assert set(header.tensors) == set(tensors)
    raw = path.read_bytes()
    with safe_open(str(path), framework="pt") as f:
        for name, t in tensors.items():
            info = header.tensors[name]
            assert info.name == name
            assert list(info.shape) == list(f.get_slice(name).get_shape())
            assert info.dtype == f.get_slice(name).get_dtype()
            assert info.nbytes == tensor_bytes(t) == tensor_nbytes(info.dtype, info.shape)
            assert info.numel == t.numel()
            blob = raw[header.data_offset + info.start:header.data_offset + info.end]
            assert blob == raw_bytes(t)


def test_header_without_metadata_and_zero_sized_tensors(tmp_path: Path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(st_bytes({"e1": entry("F32", [0], 0, 0), "e2": entry("F16", [3, 0], 0, 0),
                               "w": entry("F4", [4], 0, 2), "s": entry("F8_E8M0", [], 2, 3)}, 3))
    header = read_header(path)
    assert header.metadata is None
    assert [header.tensors[n].nbytes for n in ("e1", "e2", "w", "s")] == [0, 0, 2, 1]
    assert header.tensors["s"].shape == ()


def test_encode_header_round_trips_through_the_safetensors_library(tmp_path: Path):
    tensors = {"b.weight": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4),
               "a.weight_scale": torch.ones(3, 1).to(torch.float8_e4m3fn),
               "a.weight_scale_2": torch.tensor(2.0),
               "a.weight": torch.arange(5, dtype=torch.uint8)}
    outs = [OutputTensor(n, {torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3",
                             torch.float32: "F32", torch.uint8: "U8"}[t.dtype], tuple(t.shape))
            for n, t in tensors.items()]
    prefix, layout = encode_header(outs, {"format": "pt"})
    assert len(prefix) % 8 == 0
    assert [info.name for info in layout] == list(tensors)
    path = tmp_path / "x.safetensors"
    path.write_bytes(prefix + b"".join(raw_bytes(t) for t in tensors.values()))
    header = read_header(path)
    assert header.data_offset == len(prefix)
    assert {n: (i.start, i.end) for n, i in header.tensors.items()} == \
        {i.name: (i.start, i.end) for i in layout}
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        for name, t in tensors.items():
            loaded = f.get_tensor(name)
            assert loaded.dtype == t.dtype and loaded.shape == t.shape
            assert raw_bytes(loaded) == raw_bytes(t)
    with pytest.raises(SafetensorsFormatError):
        encode_header([outs[0], outs[0]], None)


# --- model directory listing -----------------------------------------------------------------


def test_valid_sharded_model(tmp_path: Path):
    model, weight_map = sharded_model(tmp_path)
    md = ModelDir.open(model)
    assert set(md.files) == {SHARD1, SHARD2, INDEX_NAME, "config.json"}
    assert md.model_shards == [SHARD1, SHARD2]
    assert md.tensor_shards == weight_map
    assert md.index is not None and md.index.weight_map == weight_map
    assert md.index.total_size == sum(i.nbytes for _, i in md.tensors())
    assert md.warnings == []
    assert md.cache_repo is None
    assert md.tensor("lm_head.weight").dtype == "BF16"
    assert md.tensor("missing") is None
    assert md.config["model_type"] == "deepseek_v3"
    assert md.json("absent.json") is None


def test_single_file_model_and_bookkeeping_dirs(tmp_path: Path):
    model = tmp_path / "model"
    save_shard(model / "model.safetensors", {"w": torch.zeros(2)})
    (model / "sub").mkdir()
    (model / "sub" / "tokenizer.json").write_text("{}")
    for skipped in (".git", ".cache", ".modelpatch"):
        (model / skipped).mkdir()
        (model / skipped / "broken.safetensors").write_bytes(b"junk")  # never read
    md = ModelDir.open(model)
    assert set(md.files) == {"model.safetensors", "sub/tokenizer.json"}
    assert md.model_shards == ["model.safetensors"] and md.index is None


def test_unindexed_shard_is_a_warning(tmp_path: Path):
    model, _ = sharded_model(tmp_path)
    save_shard(model / "extra.safetensors", {"model.embed_tokens.weight": torch.zeros(1)})
    md = ModelDir.open(model)
    assert "extra.safetensors" not in md.model_shards
    assert any("extra.safetensors" in w for w in md.warnings)
    assert md.tensor_shards["model.embed_tokens.weight"] == SHARD1


@pytest.mark.parametrize("bad", ["missing", "file", "fifo"])
def test_not_a_model_directory(tmp_path: Path, bad: str):
    target = tmp_path / "m"
    if bad == "file":
        target.write_text("x")
        with pytest.raises(ModelDirError):
            ModelDir.open(target)
        return
    if bad == "missing":
        with expect_error(ModelDirError, target, "no such directory"):
            ModelDir.open(target)
        assert_cli_error(target, str(target), "no such directory")
        return
    target.mkdir()
    os.mkfifo(target / "pipe.safetensors")
    with expect_error(ModelDirError, target / "pipe.safetensors", "not a regular file"):
        ModelDir.open(target)
    assert_cli_error(target, str(target / "pipe.safetensors"))


# --- shard index defects ---------------------------------------------------------------------


def _mutate(kind: str, model: Path, weight_map: dict) -> tuple[type, str, str | None]:
    """Break the index of ``model`` in one way; return (error type, message, tensor)."""
    wm = dict(weight_map)
    if kind == "missing-shard":  # the index names a shard that was never downloaded
        (model / SHARD2).unlink()
        for name, shard in wm.items():
            if shard == SHARD2:
                wm[name] = "model-00003-of-00003.safetensors"
        write_index(model, wm)
        return ShardIndexError, "names shard 'model-00003-of-00003.safetensors', which does not " \
                                "exist", None
    if kind == "shard-not-safetensors":
        wm["lm_head.weight"] = "config.json"
        write_index(model, wm, total_size=None)
        return ShardIndexError, "names shard 'config.json'", None
    if kind == "tensor-not-in-shard":
        wm["model.layers.0.self_attn.k_proj.weight"] = SHARD1
        write_index(model, wm)
        return (ShardIndexError, f"index places it in {SHARD1}, which has no such tensor",
                "model.layers.0.self_attn.k_proj.weight")
    if kind == "tensor-missing-from-index":
        del wm["model.layers.0.mlp.down_proj.weight_scale_inv"]
        write_index(model, wm)
        return (ShardIndexError, f"in shard {SHARD2} but missing from the index",
                "model.layers.0.mlp.down_proj.weight_scale_inv")
    if kind == "tensor-in-two-shards":
        tensors = shard_tensors()[SHARD2]
        tensors["model.embed_tokens.weight"] = torch.zeros(8, 4, dtype=torch.bfloat16)
        save_shard(model / SHARD2, tensors)
        return (ShardIndexError, f"present in both {SHARD1} and {SHARD2}",
                "model.embed_tokens.weight")
    if kind == "tensor-in-wrong-shard":
        wm["lm_head.weight"] = SHARD1
        write_index(model, wm)
        return ShardIndexError, f"index places it in {SHARD1} but it is in {SHARD2}", \
            "lm_head.weight"
    if kind == "total-size-wrong":
        real = sum(tensor_bytes(t) for ts in shard_tensors().values() for t in ts.values())
        write_index(model, wm, total_size=real + 2)
        return (ShardIndexError,
                f"metadata.total_size is {real + 2} but the tensors hold {real} bytes", None)
    if kind == "total-size-not-int":
        write_index(model, wm, total_size="1234")
        return ShardIndexError, "metadata.total_size is not an integer", None
    if kind == "metadata-not-object":
        write_index(model, wm, total_size=None, extra={"metadata": [1]})
        return ShardIndexError, "metadata is not an object", None
    if kind == "index-not-json":
        (model / INDEX_NAME).write_text('{"weight_map": {')
        return ModelDirError, "invalid JSON at line 1", None
    if kind == "index-not-utf8":
        (model / INDEX_NAME).write_bytes(b'{"weight_map": {"\xe9": 1}}')
        return ModelDirError, "not valid UTF-8", None
    if kind == "index-duplicate-key":
        (model / INDEX_NAME).write_text(
            '{"weight_map": {"lm_head.weight": "%s", "lm_head.weight": "%s"}}' % (SHARD2, SHARD2))
        return ModelDirError, "duplicate key 'lm_head.weight'", None
    if kind == "weight-map-missing":
        (model / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 1}}))
        return ShardIndexError, "no weight_map object", None
    if kind == "weight-map-list":
        (model / INDEX_NAME).write_text(json.dumps({"weight_map": list(wm)}))
        return ShardIndexError, "no weight_map object", None
    if kind == "index-is-list":
        (model / INDEX_NAME).write_text("[]")
        return ShardIndexError, "no weight_map object", None
    raise AssertionError(kind)


INDEX_DEFECTS = ["missing-shard", "shard-not-safetensors", "tensor-not-in-shard",
                 "tensor-missing-from-index", "tensor-in-two-shards", "tensor-in-wrong-shard",
                 "total-size-wrong", "total-size-not-int", "metadata-not-object",
                 "index-not-json", "index-not-utf8", "index-duplicate-key", "weight-map-missing",
                 "weight-map-list", "index-is-list"]


@pytest.mark.parametrize("kind", INDEX_DEFECTS)
def test_index_defect(tmp_path: Path, kind: str):
    model, weight_map = sharded_model(tmp_path)
    exc_type, message, tensor = _mutate(kind, model, weight_map)
    index = model / INDEX_NAME
    with expect_error(exc_type, index, message, tensor):
        ModelDir.open(model)
    assert_cli_error(model, str(index), message, *([f"tensor {tensor!r}"] if tensor else []))


@pytest.mark.parametrize("shard", ["../other/model.safetensors", "..", "/abs/model.safetensors",
                                   "sub/../model.safetensors", "./model.safetensors",
                                   "sub\\model.safetensors", "", 7, None])
def test_index_shard_name_outside_the_model(tmp_path: Path, shard):
    model, weight_map = sharded_model(tmp_path)
    # The target exists, so only the name check can stop it.
    save_shard(tmp_path / "other" / "model.safetensors", {"lm_head.weight": torch.zeros(1)})
    weight_map["lm_head.weight"] = shard
    write_index(model, weight_map, total_size=None)
    index = model / INDEX_NAME
    with expect_error(ShardIndexError, index, "is not a relative path inside the model",
                      "lm_head.weight"):
        ModelDir.open(model)
    assert_cli_error(model, str(index), "tensor 'lm_head.weight'", "not a relative path")


def test_index_defects_are_all_collected(tmp_path: Path):
    model, weight_map = sharded_model(tmp_path)
    del weight_map["lm_head.weight"]
    weight_map["ghost.weight"] = SHARD1
    write_index(model, weight_map)
    with pytest.raises(ShardIndexError) as info:
        ModelDir.open(model)
    assert "(and 1 more index defects)" in info.value.message
    assert {d.tensor for d in info.value.defects} == {"lm_head.weight", "ghost.weight"}


def test_index_in_subdirectory_shards(tmp_path: Path):
    """Shard names may be relative paths into subdirectories."""
    model = tmp_path / "model"
    save_shard(model / "weights" / "a.safetensors", {"x": torch.zeros(3)})
    (model / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 12},
                                                "weight_map": {"x": "weights/a.safetensors"}}))
    md = ModelDir.open(model)
    assert md.model_shards == ["weights/a.safetensors"]


# --- symlinks --------------------------------------------------------------------------------


def test_symlink_within_the_model_is_followed(tmp_path: Path):
    model = tmp_path / "model"
    save_shard(model / "store" / "real.safetensors", {"w": torch.zeros(4)})
    (model / "model.safetensors").symlink_to("store/real.safetensors")
    md = ModelDir.open(model)
    f = md.files["model.safetensors"]
    assert f.is_symlink and f.link_target == "store/real.safetensors" and f.size == 8 + \
        read_header(model / "model.safetensors").header_len + 16
    assert md.model_shards == ["model.safetensors"]


@pytest.mark.parametrize("absolute", [False, True])
def test_symlink_escaping_the_model_is_refused(tmp_path: Path, absolute: bool):
    outside = tmp_path / "outside" / "real.safetensors"
    save_shard(outside, {"w": torch.zeros(4)})
    model = tmp_path / "model"
    model.mkdir()
    link = model / "model.safetensors"
    target = str(outside) if absolute else "../outside/real.safetensors"
    link.symlink_to(target)
    with expect_error(ModelDirError, link, f"symlink to {target!r} escapes the model directory"):
        ModelDir.open(model)
    assert_cli_error(model, str(link), "escapes the model directory")


def test_symlink_escaping_through_a_prefix_sibling_is_refused(tmp_path: Path):
    """``/x/model-evil`` starts with the text ``/x/model`` but is outside ``/x/model``."""
    model = tmp_path / "model"
    model.mkdir()
    evil = tmp_path / "model-evil"
    evil.mkdir()
    (evil / "config.json").write_text("{}")
    (model / "config.json").symlink_to("../model-evil/config.json")
    with pytest.raises(ModelDirError, match="escapes the model directory"):
        ModelDir.open(model)


def test_dangling_symlink_is_refused(tmp_path: Path):
    model = tmp_path / "model"
    save_shard(model / "model.safetensors", {"w": torch.zeros(4)})
    link = model / "config.json"
    link.symlink_to("gone.json")
    with expect_error(ModelDirError, link, "dangling symlink to 'gone.json'"):
        ModelDir.open(model)
    assert_cli_error(model, str(link), "dangling symlink")


def test_symlink_loop_is_refused(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "a.json").symlink_to("b.json")
    (model / "b.json").symlink_to("a.json")
    with pytest.raises(ModelDirError):
        ModelDir.open(model)
    assert_cli_error(model, str(model))


def test_symlinked_directory_is_refused(tmp_path: Path):
    model = tmp_path / "model"
    save_shard(model / "model.safetensors", {"w": torch.zeros(4)})
    (tmp_path / "elsewhere").mkdir()
    link = model / "extra"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with expect_error(ModelDirError, link, "symlinked directories are not supported"):
        ModelDir.open(model)
    assert_cli_error(model, str(link))


# --- Hugging Face cache snapshot -------------------------------------------------------------


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hf_cache_snapshot(plain: Path, cache_root: Path, repo: str = "models--org--name",
                      commit: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """Lay ``plain`` out as huggingface_hub does: snapshot files are relative symlinks into
    ``blobs/``, named by sha256 for LFS files (safetensors) and by the git blob sha1 otherwise."""
    repo_dir = cache_root / repo
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    snapshot = repo_dir / "snapshots" / commit
    for path in sorted(p for p in plain.rglob("*") if p.is_file()):
        rel = path.relative_to(plain)
        data = path.read_bytes()
        etag = (hashlib.sha256(data).hexdigest() if path.suffix == ".safetensors"
                else git_blob_sha1(data))
        (repo_dir / "blobs" / etag).write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(*[".."] * (len(rel.parts) + 1), "blobs", etag))
    return snapshot


def test_hf_cache_snapshot_reads_transparently(tmp_path: Path):
    from patcher.model.inspect_model import inspect_model

    plain, _ = sharded_model(tmp_path)
    (plain / "sub").mkdir()
    (plain / "sub" / "preprocessor.json").write_text('{"a": 1}')
    snapshot = hf_cache_snapshot(plain, tmp_path / "hub")
    assert os.readlink(snapshot / SHARD1).startswith("../../blobs/")
    assert os.readlink(snapshot / "sub" / "preprocessor.json").startswith("../../../blobs/")

    md = ModelDir.open(snapshot)
    base = ModelDir.open(plain)
    assert md.cache_repo == Path(os.path.realpath(tmp_path / "hub" / "models--org--name"))
    assert set(md.files) == set(base.files)
    assert all(f.is_symlink for f in md.files.values())
    assert {r: f.size for r, f in md.files.items()} == {r: f.size for r, f in base.files.items()}
    assert md.tensor_shards == base.tensor_shards
    assert md.json("sub/preprocessor.json") == {"a": 1}

    report, base_report = inspect_model(md), inspect_model(base)
    assert report["hf_cache_snapshot"] is True and base_report["hf_cache_snapshot"] is False
    for key in ("tensors", "architectures", "quantization", "kv_cache_tensors", "files"):
        assert report[key] == base_report[key]

    # Also when reached through a user's symlink to the snapshot.
    alias = tmp_path / "my-model"
    alias.symlink_to(snapshot, target_is_directory=True)
    assert ModelDir.open(alias).cache_repo == md.cache_repo

    result = invoke("inspect", str(snapshot))
    assert result.exit_code == 0, result.output
    assert "(HF cache snapshot)" in result.stdout


@pytest.mark.parametrize("target", ["../../../../outside.json",
                                    "../../../models--other--repo/blobs/deadbeef"])
def test_hf_cache_snapshot_symlink_leaving_the_repo_is_refused(tmp_path: Path, target: str):
    plain, _ = sharded_model(tmp_path)
    snapshot = hf_cache_snapshot(plain, tmp_path / "hub")
    (tmp_path / "outside.json").write_text("{}")
    other = tmp_path / "hub" / "models--other--repo" / "blobs"
    other.mkdir(parents=True)
    (other / "deadbeef").write_text("{}")
    link = snapshot / "tokenizer_config.json"
    link.symlink_to(target)
    assert link.exists()
    with expect_error(ModelDirError, link, "escapes the model directory"):
        ModelDir.open(snapshot)
    assert_cli_error(snapshot, str(link), "escapes the model directory")


def test_hf_cache_snapshot_dangling_blob(tmp_path: Path):
    plain, _ = sharded_model(tmp_path)
    snapshot = hf_cache_snapshot(plain, tmp_path / "hub")
    blob = Path(os.path.realpath(snapshot / "config.json"))
    blob.unlink()  # e.g. an interrupted `huggingface-cli delete-cache`
    with expect_error(ModelDirError, snapshot / "config.json", "dangling symlink"):
        ModelDir.open(snapshot)
    assert_cli_error(snapshot, str(snapshot / "config.json"), "dangling symlink")


def test_copy_of_a_snapshot_dir_outside_the_cache_is_not_a_cache(tmp_path: Path):
    plain, _ = sharded_model(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(plain, copy)
    assert ModelDir.open(copy).cache_repo is None
