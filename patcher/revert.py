"""Undoing patches: in place (``revert DIR``) or by rebuilding the base elsewhere (``-o OUT``).

In place, the last patch's files are moved aside and its originals renamed back, under the same
journal as an in-place apply, so a crash is finished by the next command. Rebuilding links each
base file from the variant (unchanged files) or from the patch's ``originals/`` (replaced ones)
into a staging directory, checks every digest against the patch record, and renames it into place.

Originals of a variant are hardlinks to the base's files: deleting the base does not lose them,
it only makes the variant the files' last owner (their space is then charged to it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .digest_cache import KnownDigests
from .engine import make_staging_dir, _commit, _fsync_tree, _prepare, _remove_stale_staging
from .errors import InputError, OperationFailed, VerifyMismatch
from .fsops import link_or_copy, remove_tree
from .journal import Journal, switch
from .locking import lock_directory, lock_new_path
from .model_dir import MANIFEST_NAME, STATE_DIR
from .patch_record import PATCHES_DIR, PatchRecord, patch_dirs, read_record


@dataclass(frozen=True)
class RevertResult:
    output: Path
    reverted: list[str]          # patch directory names, last first


def last_patch(root: Path) -> tuple[Path, PatchRecord]:
    dirs = patch_dirs(root)
    if not dirs:
        raise InputError("nothing to revert: no modelpatch patch is recorded here", where=root)
    return dirs[-1], read_record(dirs[-1])


def _check_unmodified(root: Path, force: bool, jobs: int | None) -> None:
    from .verify import verify_dir

    report = verify_dir(root, jobs=jobs, fast=True)
    if not report.ok and not force:
        raise VerifyMismatch(f"changed since the patch: {report.summary()}", where=root,
                             hint="run `modelpatch verify` for the list; --force reverts anyway")


def _check_restored(root: Path, record: PatchRecord, jobs: int | None) -> None:
    """Every file of the base is back with its recorded digest (symlinks read through)."""
    expected = record.base_files
    missing = [rel for rel in expected if not os.path.exists(root / rel)]
    paths = {root / rel: rel for rel in expected if rel not in missing}
    digests = KnownDigests().digests(list(paths), jobs=jobs)
    bad = sorted(paths[p] for p, d in digests.items() if d != expected[paths[p]].sha256)
    if missing or bad:
        raise VerifyMismatch(f"restored base does not match the patch record: "
                             f"{len(bad)} differ, {len(missing)} missing (first: "
                             f"{(bad + missing)[0]})", where=root)


def revert_in_place(root: Path, *, force: bool = False, jobs: int | None = None) -> str:
    """Undo the last patch of ``root`` in place. The caller holds the exclusive lock and has
    recovered any interrupted journal. Returns the reverted patch's directory name."""
    patch_dir, record = last_patch(root)
    if record.mode != "in-place":
        raise InputError(
            f"the last patch ({patch_dir.name}) made this directory as a variant of "
            f"{record.base_path}; reverting it in place would turn the variant into a copy of "
            f"its base", where=root, hint="rebuild the base with `modelpatch revert DIR -o OUT`")
    _check_unmodified(root, force, jobs)
    steps = [["discard", rel] for rel in sorted(set(record.replaced) | set(record.added))]
    steps.append(["discard", MANIFEST_NAME])
    steps += [["unstash", rel] for rel in record.replaced]
    if record.base_manifest:
        steps.append(["unstash", MANIFEST_NAME])
    journal = Journal(op="revert", phase="preparing",
                      patch_dir=patch_dir.relative_to(root).as_posix(),
                      staging=f"{STATE_DIR}/staging-{record.sequence:04d}",
                      trash=f"{STATE_DIR}/trash-{record.sequence:04d}", steps=steps,
                      remove_patch_dir=True)
    journal.save(root)
    switch(root, journal)
    _check_restored(root, record, jobs)
    return patch_dir.name


def revert(root: str | os.PathLike, *, all_patches: bool = False, force: bool = False,
           jobs: int | None = None) -> RevertResult:
    root = Path(root)
    reverted = []
    with lock_directory(root, exclusive=True):
        while True:
            reverted.append(revert_in_place(root, force=force, jobs=jobs))
            if not all_patches or not patch_dirs(root):
                break
            if read_record(patch_dirs(root)[-1]).mode != "in-place":
                break
    return RevertResult(output=root, reverted=reverted)


def rebuild_base(variant: str | os.PathLike, out: str | os.PathLike, *,
                 all_patches: bool = False, force: bool = False,
                 jobs: int | None = None) -> RevertResult:
    """Write the directory as it was before the last patch (or before all) to ``out``."""
    variant, out = Path(variant), Path(os.path.abspath(out))
    with lock_directory(variant, exclusive=False), lock_new_path(out):
        if os.path.lexists(out):
            raise InputError("output already exists", where=out)
        _check_unmodified(variant, force, jobs)
        _remove_stale_staging(out)
        reverted, source, temps = [], variant, []
        try:
            while True:
                staging = make_staging_dir(out)
                temps.append(staging)
                reverted.append(_rebuild_one(source, staging, jobs))
                source = staging
                if not all_patches or not patch_dirs(source):
                    break
            _fsync_tree(source)
            _commit(source, out)
        except OSError as exc:
            raise OperationFailed(exc.strerror or str(exc), where=exc.filename or out) from None
        finally:
            for temp in temps:
                if temp != out:
                    remove_tree(temp)
    return RevertResult(output=out, reverted=reverted)


def _rebuild_one(source: Path, staging: Path, jobs: int | None) -> str:
    patch_dir, record = last_patch(source)
    originals = patch_dir / "originals"
    restored = set(record.replaced) | ({MANIFEST_NAME} if record.base_manifest else set())
    for rel, base_file in record.base_files.items():
        src = originals / rel if rel in restored else source / rel
        if src.is_symlink() and base_file.link_target is not None:
            # An in-place original moved as a symlink: its relative target is relative to
            # where the file lived, not to originals/.
            src = (source / rel).parent / base_file.link_target
        if not os.path.lexists(src):
            raise InputError(f"the original of {rel} is missing from the revert data",
                             where=src)
        link_or_copy(src, _prepare(staging, rel))
    if record.base_manifest:
        link_or_copy(originals / MANIFEST_NAME, _prepare(staging, MANIFEST_NAME))
    for older in patch_dirs(source)[:-1]:
        for path in sorted(older.rglob("*")):
            if path.is_file() and not path.is_symlink():
                link_or_copy(path, _prepare(staging / PATCHES_DIR / older.name,
                                            path.relative_to(older).as_posix()))
    _check_restored(staging, record, jobs)
    return patch_dir.name
