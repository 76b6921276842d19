"""A model directory against a bundle's resources (spec 8.4, 8.5): every listed file present
with the listed sha256, and no unlisted file in the signing scope unless unsigned files are
ignored.

The scope is what OMS enumerates: every regular file under the root, less the default
exclusions (``.git``, ``.gitattributes``, ``.github``, ``.gitignore`` at the top), the bundle's
``ignore_paths`` and ``model.sig``. A symbolic link is followed only when the bundle says
``allow_symlinks: true`` (a Hugging Face cache snapshot's files are links to its blobs), else it
is a failure. Files are hashed in parallel by ``patcher.integrity.digests``; with ``fast`` a
*verified* digest-cache row stands for a file whose identity has not changed since it was
hashed, as for ``verify --fast``.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OperationFailed
from ..integrity.digests.digest_cache import DigestCache, KnownDigests
from ..integrity.digests.hashing import hash_files_stat
from .bundle import SIGNATURE_NAME, is_ignored
from .parse import Bundle


@dataclass(frozen=True)
class FilesReport:
    """What differs between the directory and the signed resources (sorted paths)."""

    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unsigned: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """``path: why`` for an entry that cannot be checked (a symlink not allowed, a FIFO)."""
    checked: int = 0
    hashed_bytes: int = 0
    digests: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.unsigned or self.problems)

    def summary(self) -> str:
        """One line naming the first failure."""
        if self.ok:
            return f"{self.checked} signed files match"
        first = (self.problems[0] if self.problems
                 else f"{self.changed[0]}: sha256 differs from the signed digest" if self.changed
                 else f"{self.missing[0]}: signed but missing" if self.missing
                 else f"{self.unsigned[0]}: not signed (added after signing?)")
        return (f"{len(self.changed)} changed, {len(self.missing)} missing, "
                f"{len(self.unsigned)} unsigned (first: {first})")


def scope(root: Path, bundle: Bundle, also_ignore: tuple[str, ...] = ()
          ) -> tuple[dict[str, str], list[str]]:
    """``({relpath: path to hash}, problems)``: the files in the signing scope of ``root``."""
    ignore = (*bundle.ignore_paths, SIGNATURE_NAME, *also_ignore)
    found: dict[str, str] = {}
    problems: list[str] = []

    def walk(dirpath: str, prefix: str) -> None:
        with os.scandir(dirpath) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = prefix + entry.name
            if is_ignored(rel, ignore):
                continue
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                problems.append(f"{rel.encode('utf-8', 'surrogateescape')!r}: name is not "
                                f"UTF-8")
                continue
            if entry.is_symlink():
                if not bundle.allow_symlinks:
                    problems.append(f"{rel}: a symbolic link, and the signature does not allow "
                                    f"them (allow_symlinks: false)")
                    continue
                try:
                    st = os.stat(entry.path)
                except OSError:
                    problems.append(f"{rel}: a dangling symbolic link")
                    continue
                if stat.S_ISDIR(st.st_mode):
                    walk(entry.path, rel + "/")
                elif stat.S_ISREG(st.st_mode):
                    found[rel] = entry.path
                else:
                    problems.append(f"{rel}: not a regular file")
            elif entry.is_dir(follow_symlinks=False):
                walk(entry.path, rel + "/")
            elif entry.is_file(follow_symlinks=False):
                found[rel] = entry.path
            else:
                problems.append(f"{rel}: not a regular file")

    try:
        walk(os.fspath(root), "")
    except OSError as exc:
        raise OperationFailed(f"cannot list: {exc.strerror or exc}",
                              where=exc.filename or root) from exc
    return found, problems


def check_files(root: Path, bundle: Bundle, *, ignore_unsigned: bool = False,
                fast: bool = False, jobs: int | None = None, on_progress=None,
                cache: DigestCache | None = None, also_ignore: tuple[str, ...] = ()
                ) -> FilesReport:
    """Compare ``root`` with ``bundle.resources``. Digests computed here are recorded in the
    digest cache as verified (they come from the bytes)."""
    found, problems = scope(root, bundle, also_ignore)
    expected = bundle.resources
    missing = sorted(set(expected) - set(found) - {p.split(": ", 1)[0] for p in problems})
    unsigned = [] if ignore_unsigned else sorted(set(found) - set(expected))
    wanted = sorted(set(found) & set(expected))
    known = KnownDigests(cache if cache is not None else DigestCache(), use_hf_blob_names=False)
    digests: dict[str, str] = {}
    to_hash = []
    for rel in wanted:
        hit = known.lookup(Path(found[rel]), require_verified=True) if fast else None
        if hit is not None:
            digests[rel] = hit.sha256
        else:
            to_hash.append(rel)
    observed = time.time_ns()
    results = hash_files_stat([Path(found[rel]) for rel in to_hash], jobs=jobs,
                              on_progress=on_progress)
    for rel in to_hash:
        digests[rel] = results[Path(found[rel])].sha256
    known.record_results(results.values(), observed_ns=observed)
    changed = [rel for rel in wanted if digests[rel] != expected[rel]]
    return FilesReport(changed=changed, missing=missing, unsigned=unsigned, problems=problems,
                       checked=len(expected), digests=digests,
                       hashed_bytes=sum(r.size for r in results.values()))
