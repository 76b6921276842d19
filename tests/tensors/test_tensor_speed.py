"""the thread budget, the pipelined shard writer, the overflow bound; outputs byte for
byte the same whatever the number of workers."""

from __future__ import annotations

import errno
import hashlib
import json

import pytest
import torch
from tensor_helpers import read_tensors, write_model
from test_tensor_cli import run

from patcher.integrity.digests.hash_writer import HashingWriter
from patcher.model.safetensors_io import OutputTensor
from patcher.tensors.compute import _cannot_overflow
from patcher.tensors.tasks import ShardTask, TensorJob, TensorSource
from patcher.tensors.writing import shard_writer
from patcher.tensors.writing.thread_budget import quiet_openmp, split


@pytest.mark.parametrize("jobs, tasks, cores, expected", [
    (None, 24, 16, (8, 2)),      # half as many workers as cores, two torch threads each
    (None, 4, 16, (4, 4)),       # fewer shards: the cores left over become torch threads
    (1, 24, 16, (1, 16)),        # -j 1: this process, every core through torch
    (8, 24, 16, (8, 2)),
    (16, 3, 16, (3, 5)),         # never more workers than shards
    (None, 24, 2, (1, 2)),       # 2 cores: this process, two torch threads
    (None, 24, 1, (1, 1)),
    (None, 0, 2, (1, 2)),
])
def test_workers_times_torch_threads_fit_the_cores(jobs, tasks, cores, expected):
    workers, threads = split(jobs, tasks, cores)
    assert (workers, threads) == expected
    assert workers * threads <= cores


def test_shards_that_are_only_copied_get_a_worker_per_core():
    assert split(None, 24, 16, computes=False)[0] == 16
    assert split(None, 24, 2, computes=False)[0] == 2
    assert split(3, 24, 16, computes=False)[0] == 3


def test_openmp_threads_sleep_unless_the_user_says_otherwise(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    quiet_openmp()
    import os
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    quiet_openmp()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def _same_outputs(outs) -> None:
    files = [sorted(p.relative_to(o).as_posix() for p in o.rglob("*") if p.is_file()
                    and ".modelpatch" not in p.parts) for o in outs]
    assert files[0] == files[-1]
    for rel in files[0]:
        if rel == "modelpatch.provenance.json":
            subjects = [json.loads((o / rel).read_text())["subject"] for o in outs]
            assert all(s == subjects[0] for s in subjects)
        else:
            data = [(o / rel).read_bytes() for o in outs]
            assert all(d == data[0] for d in data), rel


def test_fp8_block_to_bf16_writes_the_same_bytes_with_1_and_2_workers(deepseek_fp8_dir,
                                                                       tmp_path):
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}"
        result = run("apply", "fp8-block-to-bf16", deepseek_fp8_dir, "-o", out, "--jobs", jobs,
                     "-q")
        assert result.exit_code == 0, result.output
        outs.append(out)
    _same_outputs(outs)


# --- the pipeline, in this process ---------------------------------------------------------------

def _interleaved(tmp_path, count=9):
    """A shard whose tensors alternate between casts and copies of different sizes, as a task
    and the expected output tensors."""
    gen = torch.Generator().manual_seed(20)
    tensors = {f"t{i:02d}": torch.randn((i + 1) * 37, 64, generator=gen).to(torch.bfloat16)
               for i in range(count)}
    model = write_model(tmp_path / "base", {"m.safetensors": tensors})
    path = model / "m.safetensors"
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    jobs, expected = [], {}
    for name in sorted(tensors):
        start, end = header[name]["data_offsets"]
        shape = tuple(tensors[name].shape)
        src = TensorSource(str(path), "m.safetensors", name, "BF16", shape,
                           8 + header_len + start, end - start)
        cast = int(name[1:]) % 2 == 0
        dtype = "F16" if cast else "BF16"
        out = OutputTensor(name, dtype, shape)
        jobs.append(TensorJob(out, "cast" if cast else "copy", (src,),
                              (("to", "F16"),) if cast else ()))
        expected[name] = tensors[name].to(torch.float16) if cast else tensors[name]
    return ShardTask("out.safetensors", {"format": "pt"}, tuple(jobs)), expected, path


@pytest.mark.parametrize("batch_bytes", [0, 20_000, shard_writer.BATCH_BYTES])
def test_the_pipeline_writes_every_tensor_in_order_and_hashes_the_source(tmp_path, monkeypatch,
                                                                         batch_bytes):
    """One tensor per hand-over between the threads, a few, and the whole shard."""
    monkeypatch.setattr(shard_writer, "BATCH_BYTES", batch_bytes)
    task, expected, source = _interleaved(tmp_path)
    target = tmp_path / "out.safetensors"
    sha, hashed, digest = shard_writer.write_shard(task, target,
                                                   hash_sources=frozenset({str(source)}))
    assert sha == hashlib.sha256(target.read_bytes()).hexdigest()
    assert hashed == str(source)
    assert digest.sha256 == hashlib.sha256(source.read_bytes()).hexdigest() and digest.stable
    (tmp_path / "check").mkdir()
    target.rename(tmp_path / "check" / "out.safetensors")
    got = read_tensors(tmp_path / "check")
    assert list(got) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name].view(torch.int16), tensor.view(torch.int16)), name


def test_batches_end_after_the_computed_tensor_that_reaches_the_limit(tmp_path):
    task, _, _ = _interleaved(tmp_path)        # t00 cast, t01 copy, t02 cast...
    groups = list(shard_writer._groups(task.jobs))
    names = lambda batches: [[g[0].out.name for g in b] for b in batches]  # noqa: E731
    assert names(shard_writer._batches(groups, 0)) == [
        ["t00"], ["t01", "t02"], ["t03", "t04"], ["t05", "t06"], ["t07", "t08"]]
    # sources of t00, t02, t04: 4,736 + 14,208 + 23,680 bytes
    assert names(shard_writer._batches(groups, 18_944)) == [
        ["t00", "t01", "t02"], ["t03", "t04"], ["t05", "t06"], ["t07", "t08"]]
    assert names(shard_writer._batches(groups, 1 << 30)) == [
        ["t00", "t01", "t02", "t03", "t04", "t05", "t06", "t07", "t08"]]


@pytest.mark.parametrize("batch_bytes", [0, shard_writer.BATCH_BYTES])
def test_a_failed_write_in_the_writer_thread_is_raised_and_stops_the_shard(tmp_path,
                                                                          monkeypatch,
                                                                          batch_bytes):
    monkeypatch.setattr(shard_writer, "BATCH_BYTES", batch_bytes)
    task, _, _ = _interleaved(tmp_path)
    real = HashingWriter.write
    calls = []

    def failing(self, data):
        calls.append(1)
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(HashingWriter, "write", failing)
    with pytest.raises(OSError) as info:
        shard_writer.write_shard(task, tmp_path / "out.safetensors")
    assert info.value.errno == errno.ENOSPC
    assert len(calls) == 4           # nothing more was written after the failure


# --- the overflow bound ---------------------------------------------------------------------------

def _job(scheme: str, to: str) -> TensorJob:
    src = TensorSource("/x", "s", "w", "U8", (1,), 0, 1)
    return TensorJob(OutputTensor("w", to, (1,)), "dequantize", (src,),
                     (("scheme", scheme), ("to", to)))


def test_the_overflow_bound_skips_the_output_pass_only_when_no_value_can_overflow():
    fp8 = torch.zeros(4, dtype=torch.float8_e4m3fn)
    block = _job("fp8-block", "BF16")
    assert _cannot_overflow(block, [fp8, torch.tensor([1e-3, 2.0])], torch.bfloat16)
    f16 = _job("fp8-block", "F16")
    assert _cannot_overflow(f16, [fp8, torch.tensor([65504 / 448 / 2.01])], torch.float16)
    assert not _cannot_overflow(f16, [fp8, torch.tensor([65504 / 448 / 1.99])], torch.float16)
    for bad in (float("inf"), float("nan")):
        assert not _cannot_overflow(block, [fp8, torch.tensor([1.0, bad])], torch.bfloat16)
    e5m2 = torch.zeros(4, dtype=torch.float8_e5m2)     # has inf codes: no bound
    assert not _cannot_overflow(block, [e5m2, torch.tensor([1.0])], torch.bfloat16)
    packed = torch.zeros(4, dtype=torch.uint8)
    scale = torch.full((4,), 448.0).to(torch.float8_e4m3fn)
    modelopt = _job("nvfp4-modelopt", "F16")
    assert _cannot_overflow(modelopt, [packed, scale, torch.tensor(1.0)], torch.float16)
    assert not _cannot_overflow(modelopt, [packed, scale, torch.tensor(100.0)], torch.float16)
    ct = _job("nvfp4-compressed-tensors", "F16")
    assert _cannot_overflow(ct, [packed, scale, torch.tensor([1.0])], torch.float16)
    assert not _cannot_overflow(ct, [packed, scale, torch.tensor([0.01])], torch.float16)
    assert not _cannot_overflow(ct, [packed, scale, torch.tensor([0.0])], torch.float16)


@pytest.mark.parametrize("scheme, sources", [
    ("fp8-block", lambda: [torch.randn(256, 256).to(torch.float8_e4m3fn), torch.rand(2, 2) + 0.5]),
    ("nvfp4-compressed-tensors", lambda: [
        torch.randint(0, 256, (64, 32), dtype=torch.uint8),
        (torch.rand(64, 4) * 8).to(torch.float8_e4m3fn), torch.tensor([500.0])]),
    ("nvfp4-modelopt", lambda: [
        torch.randint(0, 256, (64, 32), dtype=torch.uint8),
        (torch.rand(64, 4) * 8).to(torch.float8_e4m3fn), torch.tensor(0.002)]),
])
def test_the_overflow_bound_reads_the_host_copies_of_sources_on_a_device(scheme, sources):
    """On CUDA the computing thread gets each job's sources on the GPU and their pinned host
    copies; the bound reads the host ones, so it never waits for the GPU. Meta tensors stand in
    for the GPU ones here: reading any value from them raises."""
    from patcher.tensors.compute import compute

    host = sources()
    rows, cols = host[0].shape[0], host[0].shape[1] * (1 if scheme == "fp8-block" else 2)
    src = TensorSource("/x", "s", "w", "U8", (1,), 0, 1)
    job = TensorJob(OutputTensor("w", "BF16", (rows, cols)), "dequantize", (src,) * len(host),
                    (("scheme", scheme), ("to", "BF16"), ("block", (128, 128))))
    on_device = [t.to("meta") for t in host]
    out = compute(job, lambda: on_device, {}, "meta", host_inputs=host)
    assert (out.device.type, out.shape, out.dtype) == ("meta", (rows, cols), torch.bfloat16)
    with pytest.raises((RuntimeError, NotImplementedError)):
        compute(job, lambda: on_device, {}, "meta")     # without them it reads the device's


@pytest.mark.parametrize("one_command", [True, False])
def test_torch_is_loaded_with_the_collector_paused_and_frozen_only_in_a_one_command_process(
        tmp_path, monkeypatch, one_command):
    """The command line freezes what importing torch made, so the tensor work's full collections
    do not rescan it; a library process (the hub server) never freezes."""
    import gc

    from patcher import collector
    from patcher.tensors.writing import shard_pool

    monkeypatch.setattr(collector, "ONE_COMMAND", one_command)
    seen = []
    monkeypatch.setattr(gc, "freeze", lambda: seen.append(gc.isenabled()))
    task, _, _ = _interleaved(tmp_path)
    (tmp_path / "out").mkdir()
    shard_pool.run_shard_tasks([task], tmp_path / "out", jobs=1)
    assert seen == ([False] if one_command else [])      # frozen while still paused
    assert gc.isenabled()
