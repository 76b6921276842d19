"""Helpers for the in-place, revert, crash and locking tests: exact tree snapshots, blob checks,
and running the CLI in a subprocess."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

MANIFEST = "modelpatch.provenance.json"
_SCRIPT = Path(sys.executable).with_name("modelpatch")


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def snapshot(root: str | os.PathLike, *, vary: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every entry under ``root`` (hidden ones included), never following symlinks:
    ``{relpath: ("d", mode) | ("f", mode, sha256) | ("l", link text)}``. Files named in
    ``vary`` (relpaths; their basename matches at any depth if it has no slash) keep their type
    and mode but not their content (the manifest holds timestamps)."""
    root = Path(root)
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode))
            else:
                varies = rel in vary or any("/" not in v and rel.rsplit("/", 1)[-1] == v
                                            for v in vary)
                out[rel] = ("f", stat.S_IMODE(st.st_mode), None if varies else sha256(path))
    return out


def diff(a: dict, b: dict) -> list[str]:
    """Human-readable differences between two snapshots (empty when equal)."""
    lines = []
    for rel in sorted(set(a) | set(b)):
        if a.get(rel) != b.get(rel):
            lines.append(f"{rel}: {a.get(rel)} != {b.get(rel)}")
    return lines


def blobs(cache_repo: str | os.PathLike) -> dict[str, tuple[str, int, int]]:
    """``{blob name: (sha256, inode, mode)}`` of a hub cache repo; asserts every name is still
    its content's etag (sha256 for LFS blobs, git blob sha1 for the others)."""
    out = {}
    for path in sorted((Path(cache_repo) / "blobs").iterdir()):
        data = path.read_bytes()
        if len(path.name) == 64:
            assert hashlib.sha256(data).hexdigest() == path.name, path
        else:
            git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            assert git == path.name, path
        st = path.lstat()
        out[path.name] = (hashlib.sha256(data).hexdigest(), st.st_ino, stat.S_IMODE(st.st_mode))
    return out


def scan_warnings(cache_root: str | os.PathLike) -> list[str]:
    from huggingface_hub import scan_cache_dir

    return sorted(str(w) for w in scan_cache_dir(cache_root).warnings)


def copy_tree(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """A copy keeping symlinks as symlinks and file modes."""
    shutil.copytree(src, dst, symlinks=True)
    return Path(dst)


def _command(args, env: dict | None) -> tuple[list[str], dict]:
    cmd = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c",
                                                     "from patcher.cli import main; main()"]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MODELPATCH_FAULT")}
    # Hundreds of short CLI runs: let them cache bytecode (outside the repository).
    full_env.pop("PYTHONDONTWRITEBYTECODE", None)
    full_env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(
        tempfile.gettempdir(), f"modelpatch-tests-pycache-{os.getuid()}"))
    full_env.update(env or {})
    return cmd + [str(a) for a in args], full_env


def cli(*args, env: dict | None = None, cwd: str | os.PathLike | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``modelpatch ARGS`` in a subprocess (text output captured). ``MODELPATCH_FAULT*``
    variables come from ``env`` only."""
    cmd, full_env = _command(args, env)
    return subprocess.run(cmd, env=full_env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def problem_lines(stderr: str) -> list[str]:
    """``stderr``'s lines without the line naming the recipe file, which ``apply`` writes
    there before it starts (what is left of a refused command is its one error line)."""
    return [line for line in stderr.strip().splitlines()
            if not line.startswith("modelpatch: recipe file ")]


def popen(*args, env: dict | None = None, stdout=subprocess.PIPE) -> subprocess.Popen:
    """Start ``modelpatch ARGS``; stdout and stderr go to ``stdout`` (default: pipes)."""
    cmd, full_env = _command(args, env)
    return subprocess.Popen(cmd, env=full_env, text=True, stdout=stdout,
                            stderr=subprocess.PIPE if stdout is subprocess.PIPE else stdout)
