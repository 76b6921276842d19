"""Two modelpatch processes never work on one directory at once: the second fails fast with a
one-line error (exit 3) and nothing is corrupted. A ``wait`` fault holds the first process at a
known instant, with its lock held, until the test releases it."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fs_snapshot import MANIFEST, cli, copy_tree, diff, popen, problem_lines, snapshot

from patcher import api
from patcher.errors import LockHeld
from patcher.execute.locking import lock_directory, lock_new_path

BUSY = "another modelpatch process is working on"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _hold(tmp_path: Path, point: str, *args):
    """Start ``modelpatch ARGS`` and return it once it waits at ``point`` (lock held)."""
    tag = point.replace(":", "_").replace("/", "_")
    trace, release = tmp_path / f"trace-{tag}.txt", tmp_path / f"release-{tag}"
    proc = popen(*args, env={"MODELPATCH_FAULT": f"wait:{release}@{point}",
                             "MODELPATCH_FAULT_TRACE": str(trace)})
    proc.release = release
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if trace.exists() and point in trace.read_text().splitlines():
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"ended before {point}: {proc.communicate()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"never reached {point}")


def _refused(result):
    assert result.returncode == 3, (result.returncode, result.stderr)
    lines = problem_lines(result.stderr)
    assert len(lines) == 1 and BUSY in lines[0] and "Traceback" not in result.stderr
    return lines[0]


def _finish(proc, expect_rc: int = 0):
    """Let the held process go on, and wait for it."""
    proc.release.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == expect_rc, err
    return out, err


def test_revert_is_refused_while_an_in_place_apply_runs(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    holder = _hold(tmp_path, "inplace:prepared", "apply", "sm120-fp16-kv", root, "--in-place",
                   "-q")
    line = _refused(cli("revert", root))
    assert str(root) in line
    _refused(cli("apply", "drop-kv-scales", root, "--in-place"))   # nor a second apply
    _finish(holder)
    assert cli("verify", root).returncode == 0
    assert (root / ".modelpatch/patches/0001-sm120-fp16-kv").is_dir()
    assert not (root / ".modelpatch/journal.json").exists()


def test_apply_is_refused_while_a_revert_runs(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    original = snapshot(root)
    api.apply_in_place("sm120-fp16-kv", root)
    holder = _hold(tmp_path, "journal:finish", "revert", root)
    _refused(cli("apply", "sm120-fp16-kv", root, "--in-place"))
    _refused(cli("verify", root))          # its recovery would need the lock: it waits for no one
    _finish(holder)
    assert diff(snapshot(root), original) == []


def test_an_out_of_place_apply_reading_the_base_blocks_an_in_place_apply(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    holder = _hold(tmp_path, "manifest", "apply", "sm120-fp16-kv", root, "-o",
                   tmp_path / "v", "-q")
    _refused(cli("apply", "sm120-fp16-kv", root, "--in-place"))
    _finish(holder)
    assert cli("verify", tmp_path / "v").returncode == 0
    assert not (root / MANIFEST).exists()


def test_a_running_verify_blocks_in_place_changes(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    api.apply_in_place("sm120-fp16-kv", root)
    before = snapshot(root)
    holder = _hold(tmp_path, "verify:hashing", "verify", root)
    _refused(cli("revert", root))
    _refused(cli("apply", "drop-kv-scales", root, "--in-place"))
    assert cli("verify", root).returncode == 0          # readers share the lock
    out, _ = _finish(holder)
    assert out.startswith("OK")
    assert diff(snapshot(root), before) == []


def test_two_applies_to_one_output(kimi_dir, tmp_path):
    base = copy_tree(kimi_dir, tmp_path / "base")
    out = tmp_path / "out"
    holder = _hold(tmp_path, "manifest", "apply", "sm120-fp16-kv", base, "-o", out, "-q")
    line = _refused(cli("apply", "sm120-fp16-kv", base, "-o", out))
    assert str(out) in line
    _finish(holder)
    assert cli("verify", out).returncode == 0
    second = cli("apply", "sm120-fp16-kv", base, "-o", out)
    assert second.returncode == 2 and "already exists" in second.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_two_reverts_to_one_output(kimi_dir, tmp_path):
    base = copy_tree(kimi_dir, tmp_path / "base")
    api.apply("sm120-fp16-kv", base, out=tmp_path / "v")
    out = tmp_path / "back"
    holder = _hold(tmp_path, "revert:rebuilt", "revert", tmp_path / "v", "-o", out)
    _refused(cli("revert", tmp_path / "v", "-o", out))
    _refused(cli("apply", "drop-kv-scales", tmp_path / "v", "--in-place"))  # shared lock held
    _finish(holder)
    assert diff(snapshot(out), snapshot(base)) == []


def test_racing_processes_never_corrupt(kimi_dir, tmp_path):
    """Processes applying and reverting in a loop on one directory, unsynchronised: each run
    succeeds or is refused cleanly, and the directory always ends original or patched."""
    root = copy_tree(kimi_dir, tmp_path / "m")
    original = snapshot(root)

    def loop(n: int) -> list[int]:
        codes = []
        for i in range(n):
            args = (["apply", "sm120-fp16-kv", root, "--in-place", "-q"] if i % 2 == 0
                    else ["revert", root])
            r = cli(*args)
            assert "Traceback" not in r.stderr, r.stderr
            assert r.returncode in (0, 1, 2, 3), r.stderr
            if r.returncode == 3:
                assert BUSY in r.stderr
            codes.append(r.returncode)
        return codes

    with ThreadPoolExecutor(2) as pool:
        codes = [c for f in [pool.submit(loop, 6) for _ in range(2)] for c in f.result()]
    assert 0 in codes
    assert not (root / ".modelpatch/journal.json").exists()
    if (root / MANIFEST).exists():
        assert cli("verify", root).returncode == 0
        api.revert(root, all_patches=True)
    assert diff(snapshot(root), original) == []


def test_lock_primitives(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    with lock_directory(d, exclusive=False):
        with lock_directory(d, exclusive=False):         # readers share
            pass
        with pytest.raises(LockHeld, match=BUSY), lock_directory(d, exclusive=True):
            pass
    with lock_directory(d, exclusive=True), pytest.raises(LockHeld), \
            lock_directory(d, exclusive=False):
        pass
    out = tmp_path / "new"
    with lock_new_path(out):
        assert (tmp_path / ".new.modelpatch.lock").exists()
        with pytest.raises(LockHeld, match=BUSY), lock_new_path(out):
            pass
    assert not (tmp_path / ".new.modelpatch.lock").exists()
    # A lock file left by a killed process is taken over.
    (tmp_path / ".new.modelpatch.lock").write_text("")
    with lock_new_path(out):
        pass
    assert not (tmp_path / ".new.modelpatch.lock").exists()


def test_a_killed_holder_releases_its_lock(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    holder = _hold(tmp_path, "inplace:prepared", "apply", "sm120-fp16-kv", root, "--in-place")
    holder.kill()
    holder.communicate()
    r = cli("verify", root)
    assert "rolled back the interrupted apply" in r.stderr
    assert cli("apply", "sm120-fp16-kv", root, "--in-place", "-q").returncode == 0
    assert os.path.exists(root / MANIFEST)


def test_a_forked_child_does_not_keep_a_dead_holders_lock(tmp_path):
    """A child forked while the lock is held (a shard-writing pool worker) does not hold it:
    when the holder dies, the directory is free even though the child lives on."""
    import signal
    import subprocess
    import sys

    d = tmp_path / "d"
    d.mkdir()
    script = (
        "import os, time\n"
        "from pathlib import Path\n"
        "from patcher.execute.locking import lock_directory, lock_new_path\n"
        f"with lock_directory(Path({str(d)!r}), exclusive=True), "
        f"lock_new_path(Path({str(tmp_path / 'out')!r})):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    print(pid, flush=True)\n"
        "    os.kill(os.getpid(), 9)\n")
    with open(tmp_path / "pid.txt", "w") as out:        # not a pipe: the child keeps it open
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=out, cwd=os.getcwd())
        assert proc.wait(timeout=60) == -signal.SIGKILL
    child = int((tmp_path / "pid.txt").read_text())
    try:
        with lock_directory(d, exclusive=True):
            pass
        with lock_new_path(tmp_path / "out"):
            pass
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_a_signal_unwinds_cleanly_with_the_shells_exit_code(kimi_dir, tmp_path, sig, code):
    import signal

    root = copy_tree(kimi_dir, tmp_path / "m")
    before = snapshot(root)
    holder = _hold(tmp_path, "manifest", "apply", "sm120-fp16-kv", root, "-o", tmp_path / "v",
                   "-q")
    holder.send_signal(getattr(signal, sig))
    _out, err = holder.communicate(timeout=60)
    assert holder.returncode == code and err.strip() == "modelpatch: interrupted"
    assert not (tmp_path / "v").exists()
    assert not [p for p in tmp_path.iterdir()
                if ".modelpatch-" in p.name or p.name.endswith(".lock")]
    assert diff(snapshot(root), before) == []
