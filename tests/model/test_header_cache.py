"""The validated-header cache (patcher.model.header_cache): a hit reads no header, any identity
change is a miss, nothing cached is trusted, and linking into a variant keeps the entries."""

from __future__ import annotations

import json
import os
import time

import pytest

from patcher import collector
from patcher.model import header_cache, model_dir
from patcher.model.model_dir import ModelDir
from patcher.model.safetensors_io import OutputTensor, encode_header


def _write_model(root, shards=3, per=4, age=3600, order="reversed"):
    root.mkdir()
    weight_map = {}
    total = 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = [OutputTensor(f"layers.{s}.t{i}", "F32", (2, i + 1)) for i in range(per)]
        header, layout = encode_header(tensors, {"format": "pt"})
        data = sum(t.nbytes for t in layout)
        (root / name).write_bytes(header + bytes(data))
        total += data
        weight_map.update({t.name: name for t in reversed(tensors)})   # not header order
    if order == "headers":
        weight_map = {k: weight_map[k] for k in sorted(weight_map, key=lambda k: (
            weight_map[k], int(k.rsplit("t", 1)[1])))}
    elif order == "sorted":
        weight_map = dict(sorted(weight_map.items()))
    (root / model_dir.INDEX_NAME).write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    (root / "config.json").write_text('{"model_type": "llama"}')
    _age(root, age)
    return root


def _age(root, seconds):
    then = time.time() - seconds
    for p in root.iterdir():
        os.utime(p, (then, then))


@pytest.fixture
def reads(monkeypatch):
    """Paths whose header ModelDir.open read from the file."""
    seen = []
    real = model_dir.read_raw_header

    def counting(path, display=None):
        seen.append(os.path.basename(path))
        return real(path, display)

    monkeypatch.setattr(model_dir, "read_raw_header", counting)
    return seen


def _same(a: ModelDir, b: ModelDir):
    assert list(a.shards) == list(b.shards)
    for rel in a.shards:
        assert dict(a.shards[rel].tensors.items()) == dict(b.shards[rel].tensors.items())
        assert list(a.shards[rel].tensors) == list(b.shards[rel].tensors)
        assert a.shards[rel].metadata == b.shards[rel].metadata
    assert list(a.index.weight_map.items()) == list(b.index.weight_map.items())
    assert a.index.total_size == b.index.total_size and a.tensor_shards == b.tensor_shards


@pytest.mark.parametrize("order", ["reversed", "headers", "sorted"])
def test_a_hit_reads_no_header_and_gives_the_same_model(tmp_path, reads, order):
    root = _write_model(tmp_path / "m", per=12, order=order)
    cold = ModelDir.open(root)
    assert len(reads) == 3
    stored = header_cache.HeaderCache(root).entries["index"][0]
    assert stored == order if order != "reversed" else isinstance(stored, bytes)
    warm = ModelDir.open(root)
    assert len(reads) == 3                       # nothing read the second time
    _same(cold, warm)


def test_any_identity_change_is_a_miss(tmp_path, reads):
    root = _write_model(tmp_path / "m")
    ModelDir.open(root)
    shard = root / "model-00002-of-00003.safetensors"
    before = os.stat(shard)
    # a same-size rewrite with the mtime put back: only the ctime tells
    shard.write_bytes(shard.read_bytes())
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    reads.clear()
    ModelDir.open(root)
    assert reads == ["model-00002-of-00003.safetensors"]


def test_a_changed_header_is_seen_and_a_bad_index_still_refused(tmp_path):
    root = _write_model(tmp_path / "m")
    ModelDir.open(root)
    shard = root / "model-00001-of-00003.safetensors"
    header, layout = encode_header([OutputTensor("other", "F32", (2, 1))], None)
    shard.write_bytes(header + bytes(8))
    _age(root, 3600)
    with pytest.raises(Exception, match="index"):
        ModelDir.open(root)


def test_a_corrupt_or_forged_cache_is_never_trusted(tmp_path, reads):
    root = _write_model(tmp_path / "m")
    cold = ModelDir.open(root)
    path, _ = header_cache._cache_file(root)
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0xFF                              # corrupt: the checksum fails, all re-read
    path.write_bytes(bytes(blob))
    reads.clear()
    _same(cold, ModelDir.open(root))
    assert len(reads) == 3
    # forged with a valid checksum: a table whose offsets do not tile the data is refused when
    # first used, and the file's own header is read instead
    cache = header_cache.HeaderCache(root)
    rel = "model-00001-of-00003.safetensors"
    ident, header_len, meta, _ = cache.entries["shards"][rel]
    bad = header_cache.marshal.dumps((["x"], bytes([0]), [[1]], [0], [4]))
    cache.entries["shards"][rel] = (ident, header_len, meta, bad)
    cache.dirty = True
    cache.save()
    reads.clear()
    model = ModelDir.open(root)
    assert reads == []                            # lazily...
    assert list(model.shards[rel].tensors) == list(cold.shards[rel].tensors)   # ...refused


def test_fresh_files_are_not_cached(tmp_path, reads):
    root = _write_model(tmp_path / "m", age=0)
    ModelDir.open(root)
    ModelDir.open(root)
    assert len(reads) == 6


def test_linking_into_a_variant_keeps_the_base_cached(tmp_path, reads):
    from patcher import api

    root = _write_model(tmp_path / "m")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("modelpatch: 1\nname: r\ndescription: d\nconfig:\n  config.json:\n"
                      "    - {set: /x, value: 1}\n")
    api.apply(str(recipe), str(root), out=str(tmp_path / "v"))
    reads.clear()
    ModelDir.open(root)
    assert reads == []


def test_the_cache_directory_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(header_cache, "MAX_FILES", 2)
    for i in range(4):
        ModelDir.open(_write_model(tmp_path / f"m{i}"))
    assert len(list(header_cache.cache_dir().glob("*.bin"))) == 2


def test_reading_headers_in_a_library_process_leaves_the_collector_unfrozen(tmp_path, monkeypatch):
    """gc.freeze after parsing is for the one-command CLI process only: in a long-running one
    (the hub server, a library user) a frozen cycle would never be collected."""
    import gc
    root = _write_model(tmp_path / "m")
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(collector, "ONE_COMMAND", False)
    # A spy, not gc.get_freeze_count(): that count also falls whenever an object some earlier
    # in-process CLI test froze is freed, so comparing it is not about this call.
    freezes = []
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(1))
    ModelDir.open(root)
    assert freezes == []
    assert gc.isenabled()
    monkeypatch.setattr(collector, "ONE_COMMAND", True)
    ModelDir.open(root)
    assert freezes == [1]


def test_a_cache_that_cannot_be_written_only_warns(tmp_path, monkeypatch, caplog):
    """The cache is best effort: a failing write (a full disk, EIO) is logged and the model is
    read as without a cache; the next open reads every header again."""
    import errno
    root = _write_model(tmp_path / "m")
    cache = tmp_path / "cache"
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(cache))
    real_replace = os.replace

    def failing_replace(src, dst, *args, **kwargs):
        if os.fspath(dst).startswith(str(cache)):
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    with caplog.at_level("WARNING", logger="patcher.model.header_cache"):
        model = ModelDir.open(root)
    assert len(list(model.tensors())) == 12
    assert any("not written" in r.getMessage() for r in caplog.records)
