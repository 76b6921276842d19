"""on a GPU, shards are written by threads of the apply's own process (``--jobs``);
the bytes do not depend on how many, and a failure or Ctrl-C in one stops the others at their
next tensor. Here on the CPU, with the CPU made a threaded device (the CUDA comparison in
test_tensor_cli runs the same path on a GPU)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import pytest
from test_tensor_speed import _interleaved

from patcher.tensors import compute as compute_module
from patcher.tensors.writing import shard_pool, shard_writer


def _tasks(tmp_path, counts=(9, 5, 7)):
    tasks = []
    for i, count in enumerate(counts):
        task, _, _ = _interleaved(tmp_path / f"src{i}", count)
        tasks.append(dataclasses.replace(task, output=f"s{i}.safetensors"))
    return tasks


def _no_processes(*args, **kwargs):
    raise AssertionError("a worker process was started for shards of a threaded device")


@pytest.fixture(autouse=True)
def _cpu_threaded(monkeypatch):
    monkeypatch.setattr(shard_pool, "THREADED_DEVICES", ("cpu",))


def test_threads_write_the_same_bytes_whatever_their_number(tmp_path, monkeypatch):
    tasks = _tasks(tmp_path)
    outputs = {}
    for jobs in (1, 2, 3):
        staging = tmp_path / f"j{jobs}"
        staging.mkdir()
        monkeypatch.setattr(shard_pool, "ProcessPoolExecutor", _no_processes)
        result = shard_pool.run_shard_tasks(tasks, staging, jobs=jobs)
        files = {p.name: p.read_bytes() for p in sorted(staging.iterdir())}
        assert result.outputs == {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}
        outputs[jobs] = files
    assert len(outputs[1]) == 3
    assert outputs[1] == outputs[2] == outputs[3]


@pytest.mark.parametrize("how", ["error in another shard", "Ctrl-C"])
def test_a_failure_or_ctrl_c_stops_the_other_threads_at_their_next_tensor(tmp_path, monkeypatch,
                                                                           how):
    """The long shard computes its first tensor, then holds until the apply is told to stop; it
    must then compute nothing more (the old worker processes wrote their shard to the end)."""
    long, short = _tasks(tmp_path, counts=(9, 3))
    stops: list[threading.Event] = []
    real_write = shard_writer.write_shard

    def write_shard(*args, stop=None, **kwargs):
        stops.append(stop)
        return real_write(*args, stop=stop, **kwargs)

    computed: list[str] = []
    real_compute = compute_module.compute

    def compute(job, read_inputs, cache, device, **kwargs):
        name = job.out.name
        computed.append(name)
        if name == "t00" and job.inputs[0].path.endswith("src0/base/m.safetensors"):
            assert stops[0].wait(30), "the long shard was never told to stop"
        if how == "error in another shard" and "src1" in job.inputs[0].path and name == "t02":
            raise OSError(28, "No space left on device")
        return real_compute(job, read_inputs, cache, device, **kwargs)

    def progress(_):
        if how == "Ctrl-C":
            raise KeyboardInterrupt

    monkeypatch.setattr(shard_writer, "write_shard", write_shard)
    monkeypatch.setattr(compute_module, "compute", compute)
    staging = tmp_path / "staging"
    staging.mkdir()
    expected = KeyboardInterrupt if how == "Ctrl-C" else OSError
    with pytest.raises(expected):
        shard_pool.run_shard_tasks([long, short], staging, jobs=2, on_progress=progress)
    assert stops[0] is stops[1] and stops[0].is_set()
    long_computed = [n for n in computed if n in {"t00", "t02", "t04", "t06", "t08"}]
    assert long_computed.count("t00") >= 1
    assert "t04" not in computed and "t06" not in computed and "t08" not in computed


def test_the_gil_changes_hands_often_while_threads_write_shards_and_as_before_after(
        tmp_path, monkeypatch):
    import sys

    seen = []
    real_compute = compute_module.compute

    def compute(*args, **kwargs):
        seen.append(sys.getswitchinterval())
        return real_compute(*args, **kwargs)

    monkeypatch.setattr(compute_module, "compute", compute)
    before = sys.getswitchinterval()
    (tmp_path / "out").mkdir()
    shard_pool.run_shard_tasks(_tasks(tmp_path), tmp_path / "out", jobs=2)
    assert seen and set(seen) == {shard_pool.SWITCH_INTERVAL} and before > max(seen)
    assert sys.getswitchinterval() == before


def test_shards_written_in_turn_are_each_fsynced_beside_the_next_one(tmp_path, monkeypatch):
    """-j 1: a shard's fsync runs in a thread of its own while the next shard is written (here
    each fsync waits until the next shard has started: done in the writing thread, it would
    never see that), and every shard is durable and read-only before run_shard_tasks returns."""
    tasks = _tasks(tmp_path)
    staging = tmp_path / "out"
    staging.mkdir()
    started = {t.output: threading.Event() for t in tasks}
    following = {a.output: b.output for a, b in zip(tasks, tasks[1:])}
    synced = []
    real_write = shard_writer.write_shard

    def recording_write(task, target, *args, **kwargs):
        started[target.name].set()
        return real_write(task, target, *args, **kwargs)

    def recording_fsync(path):
        nxt = following.get(path.name)
        overlapped = started[nxt].wait(timeout=30) if nxt else True     # a hang guard only
        synced.append((path.name, threading.current_thread().name, overlapped))

    monkeypatch.setattr(shard_writer, "write_shard", recording_write)
    monkeypatch.setattr(shard_pool, "fsync_path", recording_fsync)
    result = shard_pool.run_shard_tasks(tasks, staging, jobs=1)
    assert sorted(name for name, _, _ in synced) == sorted(result.outputs) and len(synced) == 3
    assert all(thread.startswith("shard-fsync") and overlapped for _, thread, overlapped in synced)
    assert all(not (staging / name).stat().st_mode & 0o222 for name in result.outputs)


def test_a_failed_fsync_of_a_shard_written_in_turn_is_raised(tmp_path, monkeypatch):
    import errno

    tasks = _tasks(tmp_path)
    staging = tmp_path / "out"
    staging.mkdir()

    def failing(path):
        if path.name == "s1.safetensors":
            raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(shard_pool, "fsync_path", failing)
    with pytest.raises(OSError) as info:
        shard_pool.run_shard_tasks(tasks, staging, jobs=1)
    assert info.value.errno == errno.EIO
