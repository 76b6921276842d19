"""The executor: carries out a ``Plan`` as a new variant, atomically.

Steps (docs/architecture.md §2): staging directory beside the output; unchanged files linked
(reflink, hardlink, else copy); changed files written read-only and hashed while written; every
output digest known or computed once; revert data and the provenance manifest written; fsync; one
atomic rename into place; fsync of the parent. On any error, signal or interrupt the staging
directory is removed and nothing appears at the output. The base is only read.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .. import faults
from ..changes import changes_json
from ..integrity.digests.digest_cache import KnownDigests
from ..errors import InputError, OperationFailed
from ..model import header_cache
from ..model.base_identity import identify
from ..integrity.shared_inodes import remember_variant
from ..fsops import link_or_copy, make_parents, remove_tree, write_file
from .locking import lock_directory, lock_new_path
from ..integrity.manifest import build_statement, read_manifest, write_manifest
from ..model.model_dir import MANIFEST_NAME, STATE_DIR, ModelDir
from ..integrity.patch_record import (PATCHES_DIR, RECORD_NAME, BaseFile, PatchRecord,
                                      encode_record, next_sequence, patch_dirs)
from .output_dir import (commit, fsync_tree, make_staging_dir, refuse_to_replace_a_stranger,
                         remove_stale_staging, restore_replaced)
from ..plan import Action, Plan, check_unchanged

log = logging.getLogger("modelpatch")


@dataclass(frozen=True)
class ApplyResult:
    output: Path
    manifest_sha256: str
    files: int
    bytes_linked: int
    """Bytes of base files (unchanged, and originals kept for revert) that share storage with
    the base: reflinked or hardlinked."""
    bytes_written: int
    bytes_hashed: int
    link_method: str | None
    """How base files were carried: ``reflink``, ``hardlink``, ``copy`` or several joined by
    ``/``; None when there was nothing to carry (or in place)."""
    bytes_copied: int = 0
    """Bytes of base files copied (``--link copy``, or another filesystem)."""


@dataclass(frozen=True)
class Progress:
    """Callbacks the CLI hooks progress meters to (``patcher.cli.progress``); all optional. Each
    step reports bytes done, and its total before it starts."""

    hashing: Callable[[int], None] | None = None
    writing: Callable[[int], None] | None = None
    hash_total: Callable[[int], None] | None = None
    copying: Callable[[int], None] | None = None
    write_total: Callable[[int], None] | None = None
    copy_total: Callable[[int], None] | None = None


def default_output(model_root: Path, recipe_name: str) -> Path:
    """``<model>-<recipe>`` beside the model; for a Hugging Face cache snapshot
    (``models--org--name/snapshots/<commit>``), ``<name>-<recipe>`` in the current directory:
    a directory beside the snapshot would pose as another revision inside the cache."""
    root = Path(os.path.abspath(model_root))
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        name = root.parent.parent.name.split("--")[-1]
        return Path.cwd() / f"{name}-{recipe_name}"
    return root.with_name(f"{root.name}-{recipe_name}")


def apply_plan(plan: Plan, model: ModelDir, out: Path, *, force: bool = False,
               link: str = "auto", jobs: int | None = None,
               progress: Progress | None = None, base_model: str | None = None) -> ApplyResult:
    """Write the variant described by ``plan`` to ``out``.

    Raises:
        InputError: ``out`` exists (without ``force``) or is the base itself.
        LockHeld: another modelpatch process holds the base or the output.
        OperationFailed: an I/O error; staging is removed and ``out`` is untouched.
    """
    out = Path(os.path.abspath(out))
    base = Path(os.path.realpath(model.root))
    real_out = Path(os.path.realpath(out))
    if real_out == base:
        raise InputError("the output is the base directory itself", where=out,
                         hint="use apply_in_place() to patch a directory in place")
    if (base in real_out.parents and not model.subset) or real_out in base.parents:
        raise InputError(f"the output and the base {model.root} contain one another", where=out,
                         hint="write the variant beside the base")
    if not out.parent.is_dir():
        raise InputError("the output's parent directory does not exist", where=out.parent)
    untouched = "the base is untouched and no output was written"
    try:
        with lock_directory(model.root, exclusive=False), lock_new_path(out):
            check_unchanged(plan)
            restore_replaced(out)
            if (out.exists() or out.is_symlink()) and not force:
                raise InputError("output already exists", where=out,
                                 hint="force=True replaces it")
            refuse_to_replace_a_stranger(out)
            remove_stale_staging(out)
            staging = make_staging_dir(out)
            try:
                with _signals_raise_interrupt():
                    result = _build(plan, model, staging, link, jobs,
                                    progress or Progress(), base_model)
                    commit(staging, out)
            finally:
                remove_tree(staging)        # gone already after a successful commit
    except OSError as exc:
        raise OperationFailed(f"{exc.strerror or exc}", where=exc.filename or out,
                              hint=untouched) from None
    except OperationFailed as exc:
        # Raised below us (a failed copy, a short write) without naming the output.
        if exc.where is None:
            exc.where, exc.hint = str(out), exc.hint or untouched
        raise
    if "hardlink" in (result["link_method"] or ""):
        remember_variant(model.root, out)      # so that a verify of the base can name it
    return ApplyResult(output=out, **{k: v for k, v in result.items()})


@contextlib.contextmanager
def _signals_raise_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so cleanup runs."""
    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):   # not the main thread: leave handlers alone
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class PatchBuilder:
    """The work both apply modes share: new files, digests, the patch record, the manifest."""

    def __init__(self, plan: Plan, model: ModelDir, *, jobs: int | None, progress: Progress,
                 base_model: str | None = None):
        self.plan, self.model, self.jobs, self.progress = plan, model, jobs, progress
        self.base_model = base_model     # ORG/NAME given by the user, else identified
        self.known = KnownDigests()
        self.trusted = _base_manifest_digests(model)
        # Known digests of the files this patch reads, looked up before anything is linked: a
        # link changes a file's ctime, and with it the digest cache's key.
        self.source_stats = {fp.source: os.stat(model.files[fp.source].path)
                             for fp in plan.files if fp.source is not None}
        self.known_before = {rel: known for rel, st in self.source_stats.items()
                             if (known := self.known.lookup(model.files[rel].path, st=st))}
        # base relpath -> sha256 of the bytes a rewrite read or a copy copied
        self.hashed_while_writing: dict[str, str] = {}
        self.sequence = next_sequence(model.root)
        self.started = _now()
        self.bytes_hashed = 0

    def _known_base_digest(self, rel: str) -> str | None:
        known = self.known_before.get(rel)
        return ((known.sha256 if known else None) or self.trusted.get(rel)
                or self.hashed_while_writing.get(rel))

    def rerecord_linked(self, base_digests: dict[str, str]) -> None:
        """Record again, under their new ctime, the digests of base files this patch linked
        (same inode, size and mtime as when looked up or hashed): the next apply finds them."""
        rows = []
        for rel, digest in base_digests.items():
            before, st = self.source_stats[rel], os.stat(self.model.files[rel].path)
            if (st.st_ino, st.st_size, st.st_mtime_ns) != (before.st_ino, before.st_size,
                                                           before.st_mtime_ns):
                continue
            known = self.known_before.get(rel)
            trusted = rel in self.trusted and known is None
            rows.append((st, digest, not trusted and (known is None or known.verified)))
        self.known.cache.put_many(rows)

    def write_new_files(self, dest: Path) -> dict[str, str]:
        """Write every file the plan creates (JSON, added files, shards) under ``dest``."""
        digests = {}
        for fp in self.plan.files:
            if fp.action in (Action.WRITE_JSON, Action.ADD):
                faults.point(f"file:{fp.path}")
                write_file(make_parents(dest, fp.path), fp.content)
                digests[fp.path] = hashlib.sha256(fp.content).hexdigest()
        shards = [fp for fp in self.plan.files if fp.action is Action.REWRITE_SHARD]
        if shards and self.progress.write_total:
            self.progress.write_total(sum(fp.size_after or 0 for fp in shards))
        if shards:
            digests.update(self._rewrite_shards(shards, dest))
        for rel, digest in digests.items():
            self.known.record(os.stat(dest / rel), digest, verified=True)
        return digests

    def copier(self, rel: str) -> Callable[[Path, Path], None]:
        """A ``link_or_copy`` copy function for base file ``rel`` that hashes what it copies:
        the base is then not read a second time to hash it, and a digest claimed for it (an HF
        blob name, the cache) that the bytes contradict is caught here."""
        from ..integrity.digests.hash_writer import copy_hashed

        def copy(src: Path, dst: Path) -> None:
            observed = time.time_ns()
            result = copy_hashed(src, dst)
            if not result.stable:
                return
            claimed = self._known_base_digest(rel)
            if claimed is not None and claimed != result.sha256:
                raise OperationFailed(f"the copied bytes have sha256 {result.sha256}, not the "
                                      f"{claimed} known for this file", where=src,
                                      hint="the file changed, or a digest claimed for it (an "
                                           "HF blob name) is wrong: run `modelpatch verify`")
            self.known.record_results([result], observed_ns=observed)
            self.hashed_while_writing[rel] = result.sha256

        return copy

    def _rewrite_shards(self, shards: list, dest: Path) -> dict[str, str]:
        """Write the rewritten shards; a base shard whose digest is not known yet is hashed as
        the rewrite reads it (``patcher.integrity.digests.source_digest``), not in a pass of its own."""
        from ..tensors.writing.shard_writer import run_shard_tasks

        for fp in shards:
            make_parents(dest, fp.path)
        model = self.model
        wanted = {str(model.files[fp.source].path): fp.source for fp in shards
                  if fp.source is not None and self._known_base_digest(fp.source) is None}
        observed = time.time_ns()
        results = run_shard_tasks([fp.shard_task for fp in shards], dest, jobs=self.jobs,
                                  on_progress=self.progress.writing,
                                  hash_sources=frozenset(wanted))
        stable = [r for r in results.sources.values() if r.stable]
        self.known.record_results(stable, observed_ns=observed)
        self.hashed_while_writing.update(
            {wanted[path]: r.sha256 for path, r in results.sources.items() if r.stable})
        return results.outputs

    def base_digests(self) -> dict[str, str]:
        """sha256 of every base file the output keeps or the revert data needs, each computed
        at most once: known digests (cache, HF blob names, the base's manifest, shards hashed
        while rewritten) first."""
        faults.point("hashing")
        model = self.model
        needed = [fp.source for fp in self.plan.files if fp.source is not None]
        digests, unknown = {}, []
        for rel in needed:
            digest = self._known_base_digest(rel)
            if digest:
                digests[rel] = digest
            else:
                unknown.append(rel)
        self.bytes_hashed = sum(model.files[r].size for r in unknown)
        if unknown:
            if self.progress.hash_total:
                self.progress.hash_total(self.bytes_hashed)
            paths = {model.files[r].path: r for r in unknown}
            hashed = self.known.digests(list(paths), jobs=self.jobs,
                                        on_progress=self.progress.hashing)
            digests.update({paths[p]: d for p, d in hashed.items()})
        return digests

    def record(self, base_digests: dict[str, str], mode: str) -> PatchRecord:
        model = self.model
        base_files = {rel: BaseFile(base_digests[rel], f.size, _mode(f.path), f.link_target)
                      for rel, f in model.files.items() if rel in base_digests}
        files = self.plan.files
        return PatchRecord(
            sequence=self.sequence,
            recipe={"name": self.plan.recipe.name, "sha256": self.plan.recipe.sha256},
            mode=mode, base_files=base_files,
            replaced=sorted(f.source for f in files if f.source and f.action is not Action.LINK),
            added=sorted(f.path for f in files
                         if f.source is None and f.action is not Action.DROP),
            base_manifest=model.has(MANIFEST_NAME), base_path=str(model.root))

    def subjects(self, staging: Path, digests: dict[str, str],
                 base_digests: dict[str, str]) -> dict[str, tuple[str, int]]:
        """The manifest's subjects, ``{path: (sha256, size)}`` of every output file: a carried
        file has its base file's digest and size, a new one the digest it was written with and
        its size in ``staging``."""
        subjects = {}
        for fp in self.plan.files:
            if fp.action is Action.LINK:
                subjects[fp.path] = (base_digests[fp.source], self.model.files[fp.source].size)
            elif fp.action is not Action.DROP:
                subjects[fp.path] = (digests[fp.path], os.path.getsize(staging / fp.path))
        return subjects

    def write_manifest(self, dest: Path, subjects: dict[str, tuple[str, int]],
                       base_digests: dict[str, str]) -> str:
        faults.point("manifest")
        model, plan = self.model, self.plan
        base_statement = _base_statement(model)
        base_model = self.base_model or identify(model.root, base_statement).repo_id
        statement = build_statement(
            subjects=subjects,
            base_files={p: (base_digests[p], model.files[p].size) for p in base_digests},
            recipe=plan.recipe.manifest_record(),
            options=plan.options.to_json(), changes=changes_json(plan.changes), started=self.started,
            finished=_now(), base_statement=base_statement, base_model=base_model)
        return write_manifest(dest, statement)[0]


def _build(plan: Plan, model: ModelDir, staging: Path, link: str, jobs: int | None,
           progress: Progress, base_model: str | None) -> dict:
    """Lay out the whole variant in ``staging``."""
    builder = PatchBuilder(plan, model, jobs=jobs, progress=progress, base_model=base_model)
    carried = _Carrier(link, progress.copying)
    if plan.link is not None and plan.link.method == "copy" and progress.copy_total:
        progress.copy_total(plan.link.carried_bytes)
    for fp in plan.by_action(Action.LINK):
        faults.point(f"file:{fp.path}")
        carried(model.files[fp.path].path, make_parents(staging, fp.path),
                copy=builder.copier(fp.source))
    digests = builder.write_new_files(staging)
    base_digests = builder.base_digests()
    record = builder.record(base_digests, mode="variant")
    subjects = builder.subjects(staging, digests, base_digests)
    manifest_sha = builder.write_manifest(staging, subjects, base_digests)
    record.manifest_sha256 = manifest_sha
    _write_revert_data(record, model, staging, carried)
    builder.rerecord_linked(base_digests)
    header_cache.refresh(model, list(builder.source_stats))
    fsync_tree(staging)
    copied = carried.bytes.get("copy", 0)
    return {"manifest_sha256": manifest_sha, "files": len(subjects),
            "bytes_linked": sum(carried.bytes.values()) - copied, "bytes_copied": copied,
            "bytes_written": plan.bytes_written, "bytes_hashed": builder.bytes_hashed,
            "link_method": "/".join(sorted(carried.bytes)) or None}


class _Carrier:
    """``link_or_copy`` in one ``--link`` mode, counting the bytes carried by each method."""

    def __init__(self, mode: str, on_copy: Callable[[int], None] | None = None):
        self.mode, self.on_copy = mode, on_copy
        self.bytes: dict[str, int] = {}

    def __call__(self, src: Path, dst: Path, copy: Callable[[Path, Path], None] | None = None):
        method = link_or_copy(src, dst, mode=self.mode, copy=copy)
        size = os.stat(dst).st_size
        self.bytes[method] = self.bytes.get(method, 0) + size
        if method == "copy" and self.on_copy is not None:
            self.on_copy(size)


def _mode(path: Path) -> int:
    return path.lstat().st_mode & 0o7777


def _base_manifest_digests(model: ModelDir) -> dict[str, str]:
    """Digests from the base's own manifest, trusted for files unchanged since it was written:
    same size, and neither modified nor changed in any way (ctime, which nobody can set back)
    after the manifest was written. A file linked since (its ctime moves) is left to the cache."""
    if not model.has(MANIFEST_NAME):
        return {}
    manifest = read_manifest(model.root)
    written = model.files[MANIFEST_NAME].path.stat().st_mtime_ns
    trusted = {}
    for rel, (digest, size) in manifest.subjects.items():  # DigestEntry(sha256, size)
        f = model.files.get(rel)
        if f is None or f.size != size:
            continue
        st = f.path.stat()
        if st.st_mtime_ns <= written and st.st_ctime_ns <= written:
            trusted[rel] = digest
    return trusted


def _base_statement(model: ModelDir) -> dict | None:
    return read_manifest(model.root).statement if model.has(MANIFEST_NAME) else None


def _write_revert_data(record: PatchRecord, model: ModelDir, staging: Path,
                       carry: _Carrier) -> None:
    """Carry the base's patch stack over; add this patch's record and links to the originals."""
    for old in patch_dirs(model.root):
        _link_tree(old, staging / PATCHES_DIR / old.name, carry)
    patch_dir = staging / PATCHES_DIR / record.dirname
    originals = patch_dir / "originals"
    for rel in record.replaced + ([MANIFEST_NAME] if record.base_manifest else []):
        carry(model.files[rel].path, make_parents(originals, rel))
    write_file(make_parents(patch_dir, RECORD_NAME), encode_record(record))


def _link_tree(src: Path, dst: Path, carry: _Carrier) -> None:
    for path in sorted(src.rglob("*")):
        if path.is_file():           # a symlinked original (in-place HF patch) links its blob
            carry(path, make_parents(dst, path.relative_to(src).as_posix()))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


__all__ = ["apply_plan", "default_output", "ApplyResult", "Progress", "STATE_DIR"]
