"""Base shards hashed while a rewrite reads them: the same sha256 as a separate pass, the pass
itself skipped, the file's digest whatever order its ranges arrive in, and no stable digest
where the file changed."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from fs_snapshot import copy_tree, diff, snapshot

from patcher import api
from patcher.integrity.digests.digest_cache import KnownDigests
from patcher.integrity.digests.source_digest import SourceDigest
from patcher.model.model_dir import ModelDir
from patcher.tensors.tasks import ShardTask, TensorJob, TensorSource, single_source_in_order

KV_SHARDS = {"model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors"}


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _file(tmp_path: Path, size: int = 3 * (8 << 20) + 12345) -> Path:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(size))
    return path


def test_ranges_fed_in_order_give_the_file_digest(tmp_path):
    path = _file(tmp_path)
    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        digest = SourceDigest(fd)
        # a header gap, two adjacent ranges, a gap larger than the read buffer, then the tail
        for start, end in [(100, 5000), (5000, 9000), (9000 + (9 << 20), 9000 + (10 << 20))]:
            digest.feed(start, data[start:end])
        result = digest.result()
    finally:
        os.close(fd)
    assert result.stable and result.size == len(data)
    assert result.sha256 == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("ranges", [
    [(1000, 2000), (500, 600)],          # behind the position: read as a gap already
    [(1000, 2000), (1500, 3000)],        # overlapping: only the new part counts
    [(3000, 4000), (0, 4096)],           # the whole file after its end was reached
], ids=["behind", "overlapping", "whole-after-end"])
def test_ranges_out_of_order_still_give_the_file_digest(tmp_path, ranges):
    """The reader and the writer threads of a shard rewrite both feed it; whichever arrives
    late, the digest is the file's."""
    path = _file(tmp_path, 4096)
    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        digest = SourceDigest(fd)
        for start, end in ranges:
            digest.feed(start, data[start:end])
        result = digest.result()
    finally:
        os.close(fd)
    assert result.sha256 == hashlib.sha256(data).hexdigest() and result.size == len(data)


def test_ranges_fed_from_two_threads_give_the_file_digest(tmp_path):
    path = _file(tmp_path, 1 << 20)
    data = path.read_bytes()
    pieces = [(i, min(i + 4096, len(data))) for i in range(0, len(data), 4096)]
    fd = os.open(path, os.O_RDONLY)
    try:
        digest = SourceDigest(fd)

        def feed(part):
            for start, end in part:
                digest.feed(start, data[start:end])

        threads = [threading.Thread(target=feed, args=(pieces[k::2],)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result = digest.result()
    finally:
        os.close(fd)
    assert result.sha256 == hashlib.sha256(data).hexdigest()


def test_a_file_changed_while_read_is_not_stable(tmp_path):
    path = _file(tmp_path, 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        digest = SourceDigest(fd)
        with open(path, "r+b") as f:
            f.write(b"x")
        os.utime(path, ns=(1, 1))
        assert digest.result().stable is False
    finally:
        os.close(fd)


def _job(path: str, offset: int, nbytes: int, name: str = "t") -> TensorJob:
    from patcher.model.safetensors_io import OutputTensor

    src = TensorSource(path=path, shard="s", name=name, dtype="U8", shape=(nbytes,),
                       offset=offset, nbytes=nbytes)
    return TensorJob(out=OutputTensor(name, "U8", (nbytes,)), op="copy", inputs=(src,))


def test_which_tasks_can_hash_their_source():
    def task(*jobs):
        return ShardTask(output="o", metadata={}, jobs=jobs)

    assert single_source_in_order(task(_job("a", 8, 10), _job("a", 30, 5))) == "a"
    assert single_source_in_order(task(_job("a", 30, 5), _job("a", 8, 10))) is None
    assert single_source_in_order(task(_job("a", 8, 10), _job("a", 12, 5))) is None   # overlap
    assert single_source_in_order(task(_job("a", 8, 10), _job("b", 30, 5))) is None
    # a weight's scale may lie anywhere in the file (safetensors groups tensors by dtype)
    scaled = TensorJob(out=_job("a", 30, 5).out, op="dequantize",
                       inputs=(_job("a", 30, 5).inputs[0], _job("a", 0, 4).inputs[0]))
    assert single_source_in_order(task(_job("a", 8, 10), scaled)) == "a"
    elsewhere = TensorJob(out=scaled.out, op="dequantize",
                          inputs=(scaled.inputs[0], _job("b", 0, 4).inputs[0]))
    assert single_source_in_order(task(_job("a", 8, 10), elsewhere)) is None


def test_a_range_ahead_fed_as_a_companion_reads_no_gap(tmp_path):
    """A scale past the digest's position is ignored (it is read as part of a later gap), not a
    reason to read the file up to it now; the digest is the file's all the same."""
    path = _file(tmp_path, 1 << 20)
    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        digest = SourceDigest(fd)
        digest.feed(0, data[:1000])
        digest.feed(900_000, data[900_000:900_016], ahead=False)
        assert digest.position == 1000
        digest.feed(1000, data[1000:2000], ahead=False)      # adjacent: taken
        assert digest.position == 2000
        result = digest.result()
    finally:
        os.close(fd)
    assert result.sha256 == hashlib.sha256(data).hexdigest()


DROP_KV = ("modelpatch: 1\nname: d\ndescription: x\ntensors:\n"
           "  - select: {glob: ['*.k_proj.k_scale', '*.v_proj.v_scale']}\n    drop: true\n")


def _recorded_base_digests(output: Path, base: Path, sizes: dict[str, int]) -> dict[str, str]:
    """The base files' sha256 as the variant's manifest records them, each checked against the
    file's true sha256."""
    statement = json.loads((output / "modelpatch.provenance.json").read_text())
    recorded = {d["name"]: d["digest"]["sha256"]
                for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]
                if d.get("name") in sizes}
    for rel in sizes:
        assert recorded[rel] == hashlib.sha256((base / rel).read_bytes()).hexdigest(), rel
    return recorded


@pytest.mark.parametrize("jobs", [1, 2])
def test_first_time_rewrite_hashes_its_shards_as_it_reads_them(kimi_dir, tmp_path, jobs):
    """Nothing known about the base (no manifest, empty digest cache, not an HF snapshot): only
    the files the rewrite does not read are hashed in a pass of their own, and the digests of
    the rewritten shards, recorded as the base's, are their true sha256."""
    base = copy_tree(kimi_dir, tmp_path / "base")
    recipe = tmp_path / "d.yaml"
    recipe.write_text(DROP_KV)
    result = api.apply(recipe, base, out=tmp_path / "v", jobs=jobs)
    sizes = {f.relpath: f.size for f in ModelDir.open(base).files.values()}
    assert result.bytes_hashed == sum(size for rel, size in sizes.items() if rel not in KV_SHARDS)
    recorded = _recorded_base_digests(result.output, base, sizes)
    cached = KnownDigests()
    for rel in KV_SHARDS:
        assert cached.sha256(base / rel) in (None, recorded[rel])     # None: too new to cache
    assert api.verify(result.output).ok
    back = api.revert(result.output, out=tmp_path / "back").output
    for rel in sizes:
        assert (back / rel).read_bytes() == (base / rel).read_bytes()


def test_a_dequantizing_rewrite_hashes_its_shard_though_scales_sit_before_weights(
        deepseek_fp8_dir, tmp_path):
    """save_file writes float32 scales before the float8 weights they scale, so a dequantize
    job reads behind the position its weight reached; a shard whose scales are all in it is
    still hashed as it is rewritten, not in a pass of its own."""
    base = copy_tree(deepseek_fp8_dir, tmp_path / "base")
    plan = api.plan("fp8-block-to-bf16", base)
    tasks = {fp.path: fp.shard_task for fp in plan.files if fp.shard_task is not None}
    hashed_inline = {rel for rel, t in tasks.items() if single_source_in_order(t)}
    assert hashed_inline
    for rel in hashed_inline:
        jobs = [j for j in tasks[rel].jobs if j.op == "dequantize"]
        assert any(j.inputs[1].offset < j.inputs[0].offset for j in jobs), rel
    result = api.apply("fp8-block-to-bf16", base, out=tmp_path / "v", jobs=1)
    sizes = {f.relpath: f.size for f in ModelDir.open(base).files.values()}
    assert result.bytes_hashed == sum(size for rel, size in sizes.items()
                                      if rel not in hashed_inline)
    _recorded_base_digests(result.output, base, sizes)
    assert api.verify(result.output).ok


def test_a_rewrite_that_only_copies_reads_each_shard_once(kimi_dir, tmp_path, monkeypatch):
    """drop-kv-scales computes nothing: every kept range is copied in the kernel and hashed from
    the page cache, and the base's digest takes the same mapped bytes, so it reads by itself only
    what is not copied (the header, the dropped scales), not the shard a second time."""
    base = copy_tree(kimi_dir, tmp_path / "base")
    read_by_digest: list[int] = []
    real = SourceDigest._read_to

    def counting(self, end):
        start = self.position
        real(self, end)
        read_by_digest.append(self.position - start)

    monkeypatch.setattr(SourceDigest, "_read_to", counting)
    recipe = tmp_path / "d.yaml"
    recipe.write_text(DROP_KV)
    result = api.apply(recipe, base, out=tmp_path / "v", jobs=1)
    shard_bytes = sum((base / rel).stat().st_size for rel in KV_SHARDS)
    assert read_by_digest and sum(read_by_digest) < shard_bytes // 20, (sum(read_by_digest),
                                                                        shard_bytes)
    assert api.verify(result.output).ok


def test_in_place_rewrite_hashes_its_shards_as_it_reads_them(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    before = snapshot(root)
    sizes = {f.relpath: f.size for f in ModelDir.open(root).files.values()}
    recipe = tmp_path / "d.yaml"
    recipe.write_text(DROP_KV)
    result = api.apply_in_place(recipe, root)
    assert result.bytes_hashed == sum(size for rel, size in sizes.items() if rel not in KV_SHARDS)
    api.revert(root)
    assert diff(snapshot(root), before) == []


def test_copies_are_hashed_as_they_are_copied(kimi_dir, tmp_path):
    """--copy (or a copy across file systems): each copied base file is hashed from the bytes
    copied, not read again; only the replaced JSON files are hashed in a pass."""
    base = copy_tree(kimi_dir, tmp_path / "base")
    result = api.apply("sm120-fp16-kv", base, out=tmp_path / "v", force_copy=True)
    assert result.link_method == "copy"
    replaced = ("config.json", "hf_quant_config.json")
    assert result.bytes_hashed == sum((base / rel).stat().st_size for rel in replaced)
    assert api.verify(result.output).ok
    for shard in base.glob("*.safetensors"):
        assert (result.output / shard.name).stat().st_ino != shard.stat().st_ino


def test_a_copy_contradicting_a_claimed_digest_is_refused(kimi_dir, tmp_path):
    """A Hugging Face blob whose bytes no longer match its name: the copy finds out."""
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(kimi_dir, tmp_path / "hf", "org/kimi")
    blob = (snap / "model-00001-of-00004.safetensors").resolve()
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    from patcher.errors import OperationFailed

    with pytest.raises(OperationFailed, match="known for this file"):
        api.apply("sm120-fp16-kv", snap, out=tmp_path / "v", force_copy=True)
    assert not (tmp_path / "v").exists()
