"""Helpers for the I/O-fault, hostile-input, fuzz and secrets suites: exact tree states (bytes,
modes, inodes), leftovers beside an output, and CLI runs checked for one clean error line."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(sys.executable).with_name("modelpatch")
ERROR_PREFIX = "modelpatch: error: "


def tree_state(root: str | os.PathLike, *, inodes: bool = True,
               vary: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every entry under ``root`` (hidden ones included, symlinks not followed):
    ``{relpath: ("d", mode) | ("f", mode, sha256, inode, mtime_ns) | ("l", text)}``.

    ``inodes=False`` leaves out inode and mtime (to compare trees built in different places).
    Files whose basename is in ``vary`` keep their type and mode only (manifests hold times).
    """
    root = Path(root)
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", mode)
            elif not stat.S_ISREG(st.st_mode):
                out[rel] = ("other", mode)
            else:
                digest = None if name in vary else _sha256(path)
                out[rel] = ("f", mode, digest) + ((st.st_ino, st.st_mtime_ns) if inodes else ())
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def state_diff(a: dict, b: dict) -> list[str]:
    return [f"{rel}: {a.get(rel)} != {b.get(rel)}" for rel in sorted(set(a) | set(b))
            if a.get(rel) != b.get(rel)]


def leftovers(out: str | os.PathLike) -> list[str]:
    """Entries beside ``out`` that a modelpatch run on ``out`` may leave behind: staging
    directories, lock files, replaced outputs."""
    out = Path(out)
    prefix = f".{out.name}.modelpatch"
    return sorted(n for n in os.listdir(out.parent) if n.startswith(prefix))


def run_cli(*args, env: dict | None = None, timeout: float = 60, preexec_fn=None,
            cwd=None) -> subprocess.CompletedProcess:
    """``modelpatch ARGS`` in a subprocess; fault variables come only from ``env``."""
    cmd = [str(_SCRIPT)] if _SCRIPT.exists() else [
        sys.executable, "-c", "from patcher.cli import main; main()"]
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("MODELPATCH_FAULT") and k != "MODELPATCH_DEBUG"}
    full.update(env or {})
    return subprocess.run(cmd + [str(a) for a in args], env=full, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec_fn, cwd=cwd)


def error_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """``proc`` failed with exit ``code`` and exactly one ``modelpatch: error:`` line (its last
    stderr line), no traceback, and nothing on stdout; the line holds every needle."""
    what = f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert proc.returncode == code, what
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, what
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1 and lines[-1] == errors[0], what
    assert proc.stdout == "", what
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]
