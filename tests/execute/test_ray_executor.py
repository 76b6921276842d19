"""``--executor ray`` on a local Ray cluster (one for the module, two CPUs): variants bit-identical
to the local executor's, a worker killed mid-task retried, a path a node does not see refused,
Ctrl-C cancelling the cluster's tasks (``patcher.execute.ray_executor``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")

from patcher import api  # noqa: E402
from patcher.cli import main  # noqa: E402
from patcher.execute.engine import Progress  # noqa: E402
from patcher.execute.ray_executor import RayExecutor  # noqa: E402
from patcher.model.model_dir import MANIFEST_NAME  # noqa: E402

# A tensor in the middle of the DeepSeek FP8 example's second shard: a worker that dies there
# leaves a partial file behind.
KILL_AT = "tensor:model.layers.1.mlp.experts.2.gate_proj.weight"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster whose workers carry a fault point (``faults``: ``die-if``) that a
    test arms by creating the returned path."""
    arm = tmp_path_factory.mktemp("ray-faults") / "armed"
    with pytest.MonkeyPatch.context() as env:       # the workers inherit this environment
        env.setenv("MODELPATCH_FAULT", f"die-if:{arm}@{KILL_AT}")
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
    yield arm
    ray.shutdown()


def _files(root: Path) -> dict[str, bytes]:
    """Every file of a variant but its manifest (whose timestamps differ), by relpath."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME and p.name != "record.json"}


def _subjects(root: Path) -> dict:
    from patcher.integrity.manifest import read_manifest

    return read_manifest(root).subjects


def _same_variant(local: Path, on_ray: Path) -> None:
    assert _files(on_ray) == _files(local)
    assert _subjects(on_ray) == _subjects(local)
    assert not [p for p in on_ray.parent.iterdir() if ".modelpatch-staging-" in p.name]


@pytest.mark.parametrize("recipe, model, options", [
    ("fp8-block-to-bf16", "deepseek_fp8_dir", {}),
    ("drop-kv-scales", "kimi_fp16_kv", {}),
    ("sm120-fp16-kv", "kimi_dir", {"max_shard_size": 2 * 10**6}),      # a reshard
], ids=["fp8-block-dequant", "drop-kv-scales", "reshard"])
def test_variant_is_bit_identical_to_the_local_executor(cluster, request, tmp_path, recipe,
                                                        model, options):
    if model == "kimi_fp16_kv":     # drop-kv-scales needs the KV cache unquantized first
        base = api.apply("sm120-fp16-kv", request.getfixturevalue("kimi_dir"),
                         out=tmp_path / "fp16-kv").output
    else:
        base = request.getfixturevalue(model)
    shown = {"local": [], "ray": []}       # what the progress meters were told
    local = api.apply(recipe, base, out=tmp_path / "local", jobs=1,
                      progress=Progress(writing=shown["local"].append), **options).output
    on_ray = api.apply(recipe, base, out=tmp_path / "ray", executor="ray",
                       progress=Progress(writing=shown["ray"].append), **options).output
    _same_variant(local, on_ray)
    assert sum(shown["ray"]) == sum(shown["local"]) > 0
    assert api.verify(on_ray, executor="ray").ok


def test_revert_out_on_ray_rebuilds_the_base(cluster, deepseek_fp8_dir, tmp_path):
    variant = api.apply("fp8-block-to-bf16", deepseek_fp8_dir, out=tmp_path / "v",
                        executor="ray").output
    result = CliRunner().invoke(main, ["revert", str(variant), "-o", str(tmp_path / "base"),
                                       "--executor", "ray"])
    assert result.exit_code == 0, result.output
    assert _files(tmp_path / "base") == _files(deepseek_fp8_dir)


def test_a_worker_killed_mid_task_is_retried(cluster, deepseek_fp8_dir, tmp_path):
    local = api.apply("fp8-block-to-bf16", deepseek_fp8_dir, out=tmp_path / "local",
                      jobs=1).output
    cluster.touch()                      # the next worker to reach KILL_AT dies there
    on_ray = api.apply("fp8-block-to-bf16", deepseek_fp8_dir, out=tmp_path / "ray",
                       executor="ray").output
    assert not cluster.exists(), "no worker died: the fault point was not reached"
    _same_variant(local, on_ray)
    assert api.verify(on_ray).ok


def test_a_killed_driver_leaves_no_variant_and_the_next_run_cleans_up(cluster, kimi_dir,
                                                                      tmp_path):
    # Another driver, connected by address, killed once its shard tasks have run on the cluster.
    out = tmp_path / "v"
    env = {**os.environ, "MODELPATCH_FAULT": "kill@hashing"}
    killed = subprocess.run(
        [sys.executable, "-m", "patcher.cli", "apply", "sm120-fp16-kv", str(kimi_dir), "-o",
         str(out), "--max-shard-size", "2MB", "--executor", "ray", "--ray-address",
         ray.get_runtime_context().gcs_address], env=env, capture_output=True, text=True,
        timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if ".modelpatch-staging-" in p.name]
    api.apply("sm120-fp16-kv", kimi_dir, out=out, executor="ray", max_shard_size=2 * 10**6)
    assert api.verify(out).ok
    assert not [p for p in tmp_path.iterdir() if ".modelpatch-staging-" in p.name]


def test_a_path_a_node_does_not_see_is_refused(cluster, deepseek_fp8_dir, tmp_path,
                                               monkeypatch):
    # /proc/self/cwd is this process's directory here and the worker's own directory on the
    # node: the same path, another directory, as on a node without the shared mount.
    monkeypatch.chdir(tmp_path)
    out = "/proc/self/cwd/out"
    result = CliRunner().invoke(main, ["apply", "fp8-block-to-bf16", str(deepseek_fp8_dir),
                                       "-o", out, "--executor", "ray"])
    assert result.exit_code == 3, result.output
    line = result.output.strip().splitlines()[-1]
    assert "Ray node" in line and "cannot see the driver's staging directory" in line, line
    assert "/proc/self/cwd/.out.modelpatch-staging-" in line, line
    assert not [n for n in os.listdir(tmp_path) if n == "out" or "staging" in n]


def test_ctrl_c_cancels_the_cluster_tasks(cluster, tmp_path):
    """Ctrl-C while a long task runs on the cluster cancels it (and every task in flight) and
    waits until none runs. The interrupt comes once the long task has started, whatever order
    Ray starts tasks in: CI once ran the short task after the long one, on a loaded machine."""
    executor = RayExecutor()
    executor._connect()

    def nap(seconds: float, started: str, mark: str) -> None:   # nested: pickled by value
        Path(started).touch()
        time.sleep(seconds)
        Path(mark).touch()

    nap = ray.remote(num_cpus=1, max_retries=0)(nap)
    started = [tmp_path / f"started-{i}" for i in range(3)]
    marks = [tmp_path / f"done-{i}" for i in range(3)]
    seconds = [0.0, 60.0, 60.0]
    refs = []

    def submit(i):
        refs.append(nap.remote(seconds[i], str(started[i]), str(marks[i])))
        return refs[-1]

    def interrupt_once_the_long_task_runs(_in_flight):
        if started[1].exists():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        executor._run(list(range(3)), submit, lambda _item, _value: None, 2, str,
                      interrupt_once_the_long_task_runs)
    for ref in refs[1:]:                # the long ones: ended (cancelled) before _run returned
        ready, _ = ray.wait([ref], timeout=0)
        assert ready, "a running task was not cancelled"
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref)
    assert not marks[1].exists() and not marks[2].exists()
