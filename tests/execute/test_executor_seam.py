"""The executor seam (``patcher.dispatch``) without Ray: the default executor is today's code and
never imports ray; an executor in effect receives the shard tasks and file hashes; the
``--executor`` options refuse what they cannot do in one line, exit 2."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from patcher import api, dispatch
from patcher.cli import main
from patcher.integrity.digests.hashing import hash_files_stat
from patcher.tensors.writing.shard_pool import run_shard_tasks

REPO = Path(__file__).resolve().parents[2]


def test_default_executor_and_config_only_paths_never_import_ray(kimi_dir, tmp_path):
    # Meaningful where ray is installed (CI installs the [ray] extra). The reshard runs shard
    # tasks (byte copies: no torch to wait for), the verify and the revert hash files.
    code = ("import sys\n"
            "from patcher import api\n"
            "from patcher.cli import main\n"
            "kimi, out = sys.argv[1:]\n"
            "api.plan('sm120-fp16-kv', kimi)\n"
            "api.apply('sm120-fp16-kv', kimi, out=out + '/config-only')\n"
            "v = api.apply('sm120-fp16-kv', kimi, out=out + '/v', max_shard_size=2 * 10**6)\n"
            "assert api.verify(v.output).ok\n"
            "api.revert(v.output, out=out + '/base')\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n")
    subprocess.run([sys.executable, "-c", code, str(kimi_dir), str(tmp_path)], check=True,
                   cwd=REPO)


class Recording:
    """An executor that runs the work here, as the default would, and notes what it got."""

    def __init__(self):
        self.shards, self.hashed = [], []

    def run_shard_tasks(self, tasks, staging, *, jobs, on_progress, hash_sources):
        self.shards += [t.output for t in tasks]
        with dispatch.using(None):
            return run_shard_tasks(tasks, staging, jobs=1, on_progress=on_progress,
                                   hash_sources=hash_sources)

    def hash_files_stat(self, paths, *, jobs, on_progress):
        paths = list(paths)
        self.hashed += [Path(p).name for p in paths]
        with dispatch.using(None):
            return hash_files_stat(paths, jobs=jobs, on_progress=on_progress)


def test_an_executor_in_effect_gets_every_shard_task_and_file_hash(deepseek_fp8_dir, tmp_path):
    executor = Recording()
    with dispatch.using(executor):
        variant = api.apply("fp8-block-to-bf16", deepseek_fp8_dir, out=tmp_path / "v").output
        assert api.verify(variant).ok
    shards = sorted(p.name for p in deepseek_fp8_dir.glob("*.safetensors"))
    assert sorted(executor.shards) == shards
    assert set(executor.hashed) >= set(shards)         # verify rehashes every file
    assert dispatch.current() is None


def _invoke(*args: str):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output.strip().splitlines()[-1]


def test_executor_options_refuse_in_one_line(deepseek_fp8_dir, tmp_path, monkeypatch):
    model = str(deepseek_fp8_dir)
    code, line = _invoke("apply", "fp8-block-to-bf16", model, "-o", str(tmp_path / "a"),
                         "--ray-address", "auto")
    assert code == 2 and "--ray-address needs --executor ray" in line
    code, line = _invoke("apply", "fp8-block-to-bf16", model, "--in-place", "--executor", "ray")
    assert code == 2 and "excludes --in-place" in line
    code, line = _invoke("revert", model, "--executor", "ray")
    assert code == 2 and "give -o" in line
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    code, line = _invoke("apply", "fp8-block-to-bf16", model, "-o", str(tmp_path / "b"),
                         "--executor", "ray")
    assert code == 2 and "needs the ray package" in line and "-e '.[ray]'" in line
    assert not (tmp_path / "b").exists()
