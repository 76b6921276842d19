"""``modelpatch hub gc``: reclaim the Xet storage no repository needs, safely while the hub serves.

Live is what a repository of the hub can still reach: the LFS objects of every commit of every
repository (deleted branches and tags leave their commits in place, so a file reachable from any
commit id stays live) and every object uploaded to a repository but not committed yet; through
their Xet reconstructions, the xorbs those files are made of. Xorbs are shared by the whole hub,
so a xorb another repository still uses is never removed, whoever deleted what.

Safety with a serving hub: the sweep holds ``gc.lock`` exclusively, while registering a shard or
chunking a blob holds it shared, so no file is half-registered during the sweep; and only xorbs,
file records and indexes older than a grace period go (a xorb uploaded moments ago, whose shard
has not arrived yet, is young; re-uploading an existing xorb makes it young again)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from .xet_store import XetStore

DEFAULT_GRACE_S = 3600


@dataclass
class GcReport:
    xorbs_removed: int = 0
    bytes_freed: int = 0
    xorbs_kept: int = 0
    files_removed: int = 0
    removed: list[str] = field(default_factory=list)


def live_lfs_objects(store: Any) -> set[str]:
    """The sha256 of every LFS object some repository of ``store`` references or holds."""
    live: set[str] = set()
    for kind_dir in sorted(store.repos.iterdir()):
        for repo_dir in sorted(p for ns in kind_dir.iterdir() if ns.is_dir()
                               for p in ns.iterdir() if p.is_dir()):
            with contextlib.suppress(FileNotFoundError):
                live.update(p.name for p in (repo_dir / "lfs").iterdir())
            with contextlib.suppress(FileNotFoundError):
                for path in (repo_dir / "commits").glob("*.json"):
                    record = json.loads(path.read_bytes())
                    live.update(e["sha256"] for e in record["tree"].values() if e["lfs"])
    return live


def _old(path: os.PathLike[str], cutoff: float) -> bool:
    try:
        return os.stat(path).st_mtime < cutoff
    except FileNotFoundError:
        return False


def collect_garbage(store: Any, grace_s: float = DEFAULT_GRACE_S,
                    now: float | None = None) -> GcReport:
    """Remove unreferenced xorbs (and file records, hash maps, index entries) older than
    ``grace_s`` seconds. ``store`` is the hub's ``Store``."""
    xet: XetStore = store.xet
    cutoff = (time.time() if now is None else now) - grace_s
    report = GcReport()
    with xet.gc_lock(exclusive=True):
        live_shas = live_lfs_objects(store)
        live_files = {f for f in map(xet.xet_hash_of, live_shas) if f is not None}
        live_xorbs = set().union(*map(xet.file_xorbs, live_files)) if live_files else set()
        stored = list(xet.iter_hex("xorbs")) + list(xet.iter_hex("xorbs", ".src"))
        for xorb_hex, path in stored:
            if xorb_hex in live_xorbs or not _old(path, cutoff):
                report.xorbs_kept += 1
                continue
            index = path.with_name(xorb_hex + ".idx")
            size = path.stat().st_size + (index.stat().st_size if index.exists() else 0)
            path.unlink()       # first: a xorb without its bytes (or blob) is never read
            index.unlink(missing_ok=True)
            for section in ("xorb-repos", "xorb-files"):
                shutil.rmtree(xet.root / section / xorb_hex[:2] / xorb_hex, ignore_errors=True)
            report.xorbs_removed += 1
            report.bytes_freed += size
            report.removed.append(xorb_hex)
        for file_hex, path in list(xet.iter_hex("files", ".json")):
            if file_hex in live_files:
                continue
            gone = any(not xet.has_xorb(x) for x in xet.file_xorbs(file_hex))
            if gone or _old(path, cutoff):
                path.unlink(missing_ok=True)
                report.files_removed += 1
        for sha, path in list(xet.iter_hex("sha256")):
            if sha not in live_shas and xet.xet_hash_of(sha) is None:
                path.unlink(missing_ok=True)
        for _, folder in list(xet.iter_hex("chunks")):
            for entry in list(folder.iterdir()):
                if not xet.has_xorb(entry.name):
                    entry.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()
    return report
