"""The executor: carries out a ``Plan`` as a new variant, atomically.

Steps (DESIGN.md section 2): staging directory beside the output; unchanged files linked
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

from . import faults
from .digest_cache import KnownDigests
from .errors import InputError, OperationFailed
from .fsops import link_or_copy, remove_tree, write_file
from .locking import lock_directory, lock_new_path
from .manifest import build_statement, read_manifest, write_manifest
from .model_dir import MANIFEST_NAME, STATE_DIR, ModelDir
from .patch_record import (PATCHES_DIR, RECORD_NAME, BaseFile, PatchRecord, encode_record,
                           next_sequence, patch_dirs)
from .output_dir import (commit, fsync_tree, make_staging_dir, refuse_to_replace_a_stranger,
                         remove_stale_staging, restore_replaced)
from .plan import Action, Plan

log = logging.getLogger("modelpatch")


@dataclass(frozen=True)
class ApplyResult:
    output: Path
    manifest_sha256: str
    files: int
    bytes_linked: int
    bytes_written: int
    bytes_hashed: int
    link_method: str | None


@dataclass(frozen=True)
class Progress:
    """Callbacks the CLI hooks progress bars to; all optional."""

    hashing: Callable[[int], None] | None = None
    writing: Callable[[int], None] | None = None
    hash_total: Callable[[int], None] | None = None


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
               force_copy: bool = False, jobs: int | None = None,
               progress: Progress | None = None) -> ApplyResult:
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
    if base in real_out.parents or real_out in base.parents:
        raise InputError(f"the output and the base {model.root} contain one another", where=out,
                         hint="write the variant beside the base")
    if not out.parent.is_dir():
        raise InputError("the output's parent directory does not exist", where=out.parent)
    untouched = "the base is untouched and no output was written"
    try:
        with lock_directory(model.root, exclusive=False), lock_new_path(out):
            restore_replaced(out)
            if (out.exists() or out.is_symlink()) and not force:
                raise InputError("output already exists", where=out,
                                 hint="force=True replaces it")
            refuse_to_replace_a_stranger(out)
            remove_stale_staging(out)
            staging = make_staging_dir(out)
            try:
                with _signals_raise_interrupt():
                    result = _build(plan, model, staging, force_copy, jobs,
                                    progress or Progress())
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

    def __init__(self, plan: Plan, model: ModelDir, *, jobs: int | None, progress: Progress):
        self.plan, self.model, self.jobs, self.progress = plan, model, jobs, progress
        self.known = KnownDigests()
        self.trusted = _base_manifest_digests(model)
        # base relpath -> sha256 of the bytes a rewrite read or a copy copied
        self.hashed_while_writing: dict[str, str] = {}
        self.sequence = next_sequence(model.root)
        self.started = _now()
        self.bytes_hashed = 0

    def _known_base_digest(self, rel: str) -> str | None:
        return (self.known.sha256(self.model.files[rel].path) or self.trusted.get(rel)
                or self.hashed_while_writing.get(rel))

    def write_new_files(self, dest: Path) -> dict[str, str]:
        """Write every file the plan creates (JSON, added files, shards) under ``dest``."""
        digests = {}
        for fp in self.plan.files:
            if fp.action in (Action.WRITE_JSON, Action.ADD):
                faults.point(f"file:{fp.path}")
                write_file(_prepare(dest, fp.path), fp.content)
                digests[fp.path] = hashlib.sha256(fp.content).hexdigest()
        shards = [fp for fp in self.plan.files if fp.action is Action.REWRITE_SHARD]
        if shards:
            digests.update(self._rewrite_shards(shards, dest))
        for rel, digest in digests.items():
            self.known.record(os.stat(dest / rel), digest, verified=True)
        return digests

    def copier(self, rel: str) -> Callable[[Path, Path], None]:
        """A ``link_or_copy`` copy function for base file ``rel`` that hashes what it copies:
        the base is then not read a second time to hash it, and a digest claimed for it (an HF
        blob name, the cache) that the bytes contradict is caught here."""
        from .hash_writer import copy_hashed

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
        the rewrite reads it (``patcher.source_digest``), not in a pass of its own."""
        from .shard_writer import run_shard_tasks

        for fp in shards:
            _prepare(dest, fp.path)
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

    def write_manifest(self, dest: Path, subjects: dict[str, tuple[str, int]],
                       base_digests: dict[str, str]) -> str:
        faults.point("manifest")
        model, plan = self.model, self.plan
        statement = build_statement(
            subjects=subjects,
            base_files={p: (base_digests[p], model.files[p].size) for p in base_digests},
            recipe={"name": plan.recipe.name, "sha256": plan.recipe.sha256,
                    "text": plan.recipe.text},
            options=plan.options, changes=list(plan.changes), started=self.started,
            finished=_now(), base_statement=_base_statement(model))
        return write_manifest(dest, statement)[0]


def _build(plan: Plan, model: ModelDir, staging: Path, force_copy: bool, jobs: int | None,
           progress: Progress) -> dict:
    """Lay out the whole variant in ``staging``."""
    builder = PatchBuilder(plan, model, jobs=jobs, progress=progress)
    methods: set[str] = set()
    for fp in plan.by_action(Action.LINK):
        faults.point(f"file:{fp.path}")
        methods.add(link_or_copy(model.files[fp.path].path, _prepare(staging, fp.path),
                                 force_copy=force_copy, copy=builder.copier(fp.source)))
    digests = builder.write_new_files(staging)
    base_digests = builder.base_digests()
    for fp in plan.by_action(Action.LINK):
        digests[fp.path] = base_digests[fp.source]
    record = builder.record(base_digests, mode="variant")
    subjects = {p: (d, (staging / p).stat().st_size) for p, d in digests.items()}
    manifest_sha = builder.write_manifest(staging, subjects, base_digests)
    record.manifest_sha256 = manifest_sha
    _write_revert_data(record, model, staging, force_copy)
    fsync_tree(staging)
    return {"manifest_sha256": manifest_sha, "files": len(subjects),
            "bytes_linked": plan.bytes_linked, "bytes_written": plan.bytes_written,
            "bytes_hashed": builder.bytes_hashed,
            "link_method": "/".join(sorted(methods)) or None}


def _prepare(staging: Path, rel: str) -> Path:
    target = staging / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _mode(path: Path) -> int:
    return path.lstat().st_mode & 0o7777


def _base_manifest_digests(model: ModelDir) -> dict[str, str]:
    """Digests from the base's own manifest, trusted for files unchanged since it was written
    (same size, not modified after the manifest)."""
    if not model.has(MANIFEST_NAME):
        return {}
    manifest = read_manifest(model.root)
    written = model.files[MANIFEST_NAME].path.stat().st_mtime_ns
    trusted = {}
    for rel, (digest, size) in manifest.subjects.items():  # DigestEntry(sha256, size)
        f = model.files.get(rel)
        if f is not None and f.size == size and f.path.stat().st_mtime_ns <= written:
            trusted[rel] = digest
    return trusted


def _base_statement(model: ModelDir) -> dict | None:
    return read_manifest(model.root).statement if model.has(MANIFEST_NAME) else None


def _write_revert_data(record: PatchRecord, model: ModelDir, staging: Path,
                       force_copy: bool) -> None:
    """Carry the base's patch stack over; add this patch's record and links to the originals."""
    for old in patch_dirs(model.root):
        _link_tree(old, staging / PATCHES_DIR / old.name, force_copy)
    patch_dir = staging / PATCHES_DIR / record.dirname
    originals = patch_dir / "originals"
    for rel in record.replaced + ([MANIFEST_NAME] if record.base_manifest else []):
        link_or_copy(model.files[rel].path, _prepare(originals, rel), force_copy=force_copy)
    write_file(_prepare(patch_dir, RECORD_NAME), encode_record(record))


def _link_tree(src: Path, dst: Path, force_copy: bool) -> None:
    for path in sorted(src.rglob("*")):
        if path.is_file():           # a symlinked original (in-place HF patch) links its blob
            link_or_copy(path, _prepare(dst, path.relative_to(src).as_posix()),
                         force_copy=force_copy)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


__all__ = ["apply_plan", "default_output", "ApplyResult", "Progress", "STATE_DIR"]
