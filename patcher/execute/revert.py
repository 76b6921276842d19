"""Undoing patches: in place (``revert DIR``) or by rebuilding the base elsewhere (``-o OUT``).

In place, the last patch's files are moved aside and its originals renamed back (a replaced
symlink is recreated with its original text), under the same journal as an in-place apply, so a
crash is finished by the next command. The restored files are then checked against the base
digests in the patch record, and ``.modelpatch/`` disappears with the last patch.

Rebuilding links each base file from the variant (unchanged files) or from the patch's
``originals/`` (replaced ones) into a staging directory beside OUT, checks every digest against
the patch record, and renames it into place. Links are reflinks or hardlinks where the
filesystem allows (else copies), so the rebuilt base costs no space either.

What the revert data costs, and what happens when the base is deleted: the originals of a variant
made without ``--in-place`` are hardlinks (or reflinks) to the base's files, made when the variant
was written. While the base exists they share its storage, so they cost nothing. Deleting the base
does not lose them: a hardlinked file lives as long as one name for it does, so ``revert VARIANT
-o OUT`` still rebuilds the base byte for byte; the originals' space is then simply charged to the
variant. Only where linking was impossible (``--copy``, or a variant on another filesystem than its
base) are the originals copies, which cost their size but are equally independent of the base.
"""

from __future__ import annotations

import logging
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from .. import faults
from ..errors import InputError, ModelDirError, OperationFailed, VerifyMismatch
from ..fsops import link_or_copy, make_parents, remove_tree
from ..gguf.header_inplace import HEADERS_DIR
from ..gguf.header_inplace import check_kept as check_kept_headers
from ..gguf.header_inplace import rebuild as rebuild_with_header
from ..gguf.header_inplace import revert_steps as header_revert_steps
from ..gguf.header_inplace import stage_revert as stage_current_headers
from ..integrity.digests.digest_cache import KnownDigests
from ..integrity.patch_record import PATCHES_DIR, PatchRecord, patch_dirs, read_record
from ..model.model_dir import MANIFEST_NAME, SIGNATURE_NAME, STATE_DIR
from .journal import JOURNAL_NAME, Journal, recover, switch
from .locking import lock_directory, lock_new_path
from .output_dir import commit, fsync_tree, make_staging_dir, remove_stale_staging

log = logging.getLogger("modelpatch")


@dataclass(frozen=True)
class RevertResult:
    output: Path
    reverted: list[str]          # patch directory names, last first


def last_patch(root: Path) -> tuple[Path, PatchRecord]:
    dirs = patch_dirs(root)
    if not dirs:
        raise InputError("nothing to revert: no modelpatch patch is recorded here", where=root)
    return dirs[-1], read_record(dirs[-1])


def _check_unmodified(root: Path, ignore_changes: bool, jobs: int | None) -> None:
    from ..integrity.verify import verify_dir

    anyway = "ignore_changes=True reverts anyway"
    try:
        report = verify_dir(root, jobs=jobs, fast=True)
    except InputError as exc:           # no manifest, or an unreadable one
        if not ignore_changes:
            raise VerifyMismatch(f"cannot check it is unchanged since the patch: {exc.message}",
                                 where=exc.where or root, hint=anyway) from None
        log.warning("%s: %s; reverting anyway (ignore_changes=True)", root, exc.one_line())
        return
    if not report.ok:
        if ignore_changes:
            log.warning("%s: changed since the patch (%s); reverting anyway "
                        "(ignore_changes=True)", root, report.summary())
            return
        raise VerifyMismatch(f"changed since the patch: {report.summary()}", where=root,
                             hint=f"verify() lists the differences; {anyway}")


def _check_restored(root: Path, record: PatchRecord, jobs: int | None, *,
                    ignore_changes: bool = False, links: dict[str, str] | None = None) -> None:
    """Every file of the base is back with its recorded digest (symlinks read through) and
    every symlink in ``links`` with its recorded target."""
    expected = record.base_files
    missing = [rel for rel in expected if not os.path.exists(root / rel)]
    paths = {root / rel: rel for rel in expected if rel not in missing}
    digests = KnownDigests().digests(list(paths), jobs=jobs)
    bad = sorted(paths[p] for p, d in digests.items() if d != expected[paths[p]].sha256)
    bad += sorted(rel for rel, target in (links or {}).items()
                  if rel not in missing and rel not in bad
                  and (not (root / rel).is_symlink() or os.readlink(root / rel) != target))
    if missing or bad:
        message = (f"restored base does not match the patch record: {len(bad)} differ, "
                   f"{len(missing)} missing (first: {(bad + missing)[0]})")
        if ignore_changes:
            log.warning("%s: %s", root, message)
            return
        raise VerifyMismatch(message, where=root)


def _check_originals(patch_dir: Path, record: PatchRecord, jobs: int | None,
                     ignore_changes: bool) -> None:
    """Before anything moves: the revert data still holds the base's bytes (a damaged original
    found after the switch could no longer be undone)."""
    originals = patch_dir / "originals"
    paths = {originals / rel: rel for rel in record.replaced
             if rel in record.base_files and os.path.exists(originals / rel)}
    digests = KnownDigests().digests(list(paths), jobs=jobs)
    bad = sorted(paths[p] for p, d in digests.items()
                 if d != record.base_files[paths[p]].sha256)
    if not bad:
        return
    message = (f"the revert data is damaged: {len(bad)} original(s) no longer match the base "
               f"(first: {bad[0]})")
    if ignore_changes:
        log.warning("%s: %s; reverting anyway (ignore_changes=True)", patch_dir, message)
        return
    raise VerifyMismatch(f"{message}; nothing was changed", where=originals / bad[0],
                         hint="ignore_changes=True reverts anyway, to the damaged bytes")


def _check_headers(root: Path, patch_dir: Path, record: PatchRecord,
                   ignore_changes: bool) -> None:
    """Before anything moves: each header kept for revert, followed by the live file's tail, is
    the base's recorded file (a GGUF header rewritten in place, ``patcher.gguf.header_inplace``).
    """
    bad = check_kept_headers(root, patch_dir, record)
    if not bad:
        return
    message = f"the revert data is damaged: the kept header of {bad[0]} no longer gives the base"
    if ignore_changes:
        log.warning("%s: %s; reverting anyway (ignore_changes=True)", patch_dir, message)
        return
    raise VerifyMismatch(f"{message}; nothing was changed", where=root / bad[0],
                         hint="ignore_changes=True reverts anyway, to the damaged bytes")


def revert_steps(patch_dir: Path, record: PatchRecord) -> list[list[str]]:
    """The journal steps that undo ``record`` in place: move the patch's files aside, then put
    the originals back (symlinks recreated with their original text), manifest last."""
    steps = [["discard", rel] for rel in sorted(set(record.replaced) | set(record.added))]
    steps.append(["discard", MANIFEST_NAME])
    steps += [["rmdir", d] for d in record.made_dirs]
    restore = list(record.replaced) + ([MANIFEST_NAME] if record.base_manifest else []) + (
        [SIGNATURE_NAME] if record.base_signature else [])
    for rel in restore:
        original = patch_dir / "originals" / rel
        link = record.links.get(rel)
        # The original is a symlink made by the apply, unless the revert data was carried to
        # another directory, where it became a link to the file itself.
        if link is not None and (original.is_symlink() or not original.exists()):
            steps.append(["relink", rel, link])
        else:
            steps.append(["unstash", rel])
    return steps


def revert_in_place(root: Path, *, ignore_changes: bool = False,
                    jobs: int | None = None) -> str:
    """Undo the last patch of ``root`` in place. The caller holds the exclusive lock and has
    recovered any interrupted journal. Returns the reverted patch's directory name."""
    patch_dir, record = last_patch(root)
    if record.mode != "in-place":
        raise InputError(
            f"the last patch ({patch_dir.name}) made this directory as a variant of "
            f"{record.base_path}; reverting it in place would turn the variant into a copy of "
            f"its base", where=root, hint="rebuild the base with `modelpatch revert DIR -o OUT`")
    _check_unmodified(root, ignore_changes, jobs)
    for rel in list(record.replaced) + ([MANIFEST_NAME] if record.base_manifest else []) + (
            [SIGNATURE_NAME] if record.base_signature else []):
        original = patch_dir / "originals" / rel
        if not os.path.lexists(original) and rel not in record.links:
            raise InputError(f"the original of {rel} is missing from the revert data",
                             where=original)
    _check_originals(patch_dir, record, jobs, ignore_changes)
    _check_headers(root, patch_dir, record, ignore_changes)
    steps = revert_steps(patch_dir, record)
    patch_rel, staging = patch_dir.relative_to(root).as_posix(), \
        f"{STATE_DIR}/staging-{record.sequence:04d}"
    journal = Journal(op="revert", phase="preparing", patch_dir=patch_rel, staging=staging,
                      trash=f"{STATE_DIR}/trash-{record.sequence:04d}",
                      steps=header_revert_steps(record, patch_rel, staging) + steps,
                      remove_patch_dir=True)
    faults.point("revert:begin")
    journal.create(root)
    stage_current_headers(root, record, root / staging)
    faults.point("revert:prepared")
    try:
        switch(root, journal)
    except OSError as exc:
        raise OperationFailed(exc.strerror or str(exc), where=exc.filename or root,
                              hint="the revert is half-done; its journal is kept and the next "
                                   "modelpatch command on this directory completes it") from None
    _check_restored(root, record, jobs, ignore_changes=ignore_changes,
                    links={step[1]: step[2] for step in steps if step[0] == "relink"})
    return patch_dir.name


def revert(root: str | os.PathLike, *, all_patches: bool = False,
           ignore_changes: bool = False, jobs: int | None = None) -> RevertResult:
    """Undo the last in-place patch of ``root`` (with ``all_patches``, every in-place patch, last
    first, down to the original or to the variant an out-of-place apply made)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError("no such directory", where=root)
    try:
        return _revert(root, all_patches, ignore_changes, jobs)
    except OSError as exc:
        raise OperationFailed(exc.strerror or str(exc), where=exc.filename or root) from None


def _revert(root: Path, all_patches: bool, ignore_changes: bool,
            jobs: int | None) -> RevertResult:
    reverted = []
    with lock_directory(root, exclusive=True):
        state = root / STATE_DIR
        if state.is_symlink():
            raise ModelDirError(f"{STATE_DIR} is a symlink", where=state)
        done = recover(root)
        if done:
            log.warning("%s: %s", root, done)
        while True:
            reverted.append(revert_in_place(root, ignore_changes=ignore_changes, jobs=jobs))
            if not all_patches or not patch_dirs(root):
                break
            if read_record(patch_dirs(root)[-1]).mode != "in-place":
                log.warning("%s: the remaining patches made this directory as a variant; "
                            "rebuild its base with `modelpatch revert DIR -o OUT`", root)
                break
    return RevertResult(output=root, reverted=reverted)


def rebuild_base(variant: str | os.PathLike, out: str | os.PathLike, *,
                 all_patches: bool = False, ignore_changes: bool = False,
                 force: bool = False, jobs: int | None = None) -> RevertResult:
    """Write the directory as it was before the last patch (or before all) to ``out``.

    ``variant`` is only read (under a shared lock). Works on a variant made without
    ``--in-place`` and on a directory patched in place alike. ``force`` replaces an existing
    ``out`` that is an earlier rebuild of the same base (the same files, each with the digest
    the patch record gives), never anything else.
    """
    variant, out = Path(variant), Path(os.path.abspath(out))
    if not variant.is_dir():
        raise InputError("no such directory", where=variant)
    if not out.parent.is_dir():
        raise InputError("the output's parent directory does not exist", where=out.parent)
    if out == Path(os.path.abspath(variant)):
        raise InputError("the output is the directory itself", where=out,
                         hint="to revert in place, leave out -o")
    try:
        return _rebuild(variant, out, all_patches, ignore_changes, force, jobs)
    except OSError as exc:
        raise OperationFailed(exc.strerror or str(exc), where=exc.filename or out,
                              hint="nothing was written") from None


def _rebuild(variant: Path, out: Path, all_patches: bool, ignore_changes: bool, force: bool,
             jobs: int | None) -> RevertResult:
    with lock_directory(variant, exclusive=False), lock_new_path(out):
        if (variant / JOURNAL_NAME).exists():
            raise OperationFailed("an interrupted in-place operation left a journal here",
                                  where=variant, hint="run `modelpatch verify` on it to recover, "
                                                      "then retry")
        if os.path.lexists(out) and not force:
            raise InputError("output already exists", where=out,
                             hint="revert -o writes a new directory: choose another, or "
                                  "force=True replaces an earlier rebuild of this base")
        last_patch(variant)                 # something to revert?
        _check_unmodified(variant, ignore_changes, jobs)
        remove_stale_staging(out)
        reverted, source, temps = [], variant, []
        try:
            while True:
                staging = make_staging_dir(out)
                temps.append(staging)
                record = last_patch(source)[1]
                reverted.append(_rebuild_one(source, staging, jobs, ignore_changes))
                source = staging
                if not all_patches or not patch_dirs(source):
                    break
            faults.point("revert:rebuilt")
            if os.path.lexists(out):
                _refuse_to_replace(out, source, record, jobs)
            fsync_tree(source)
            commit(source, out)
        finally:
            for temp in temps:
                if temp != out:
                    remove_tree(temp)
    return RevertResult(output=out, reverted=reverted)


def _refuse_to_replace(out: Path, rebuilt: Path, record: PatchRecord, jobs: int | None) -> None:
    """``force`` replaces ``out`` only when it is what this rebuild made again: the same files,
    the base's with the digests of the patch record; anything else could be the only copy."""
    def files(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*")
                if p.is_file() or p.is_symlink()}

    why = "not a directory" if out.is_symlink() or not out.is_dir() else None
    if why is None and files(out) != files(rebuilt):
        why = "other files than the rebuilt base"
    if why is None:
        try:
            _check_restored(out, record, jobs)
        except VerifyMismatch as exc:
            why = exc.message.replace("restored base", "its content")
    if why:
        raise InputError(f"output exists and is not an earlier rebuild of this base ({why}); "
                         f"force=True replaces only that", where=out,
                         hint="remove it yourself, or choose another -o")


def _original(path: Path, live: Path) -> Path:
    """What an original under ``originals/`` holds. An in-place original may be a symlink: one
    made by this version points at its file from where it is; one moved there as is by an older
    version holds a target relative to where it lived (``live``)."""
    if path.is_symlink() and not path.exists():
        return live.parent / os.readlink(path)
    return path


def _link(src: Path, dst: Path, mode: int | None) -> None:
    if link_or_copy(src, dst) == "copy" and mode is not None:
        os.chmod(dst, mode)       # a copy is ours alone; a link keeps the shared inode's mode


def _rebuild_one(source: Path, staging: Path, jobs: int | None, ignore_changes: bool) -> str:
    patch_dir, record = last_patch(source)
    faults.point(f"revert:rebuild:{patch_dir.name}")
    originals = patch_dir / "originals"
    restored = set(record.replaced) | ({MANIFEST_NAME} if record.base_manifest else set())
    for rel, base_file in record.base_files.items():
        src = _original(originals / rel, source / rel) if rel in restored else source / rel
        if rel in record.headers:       # the kept header, then the file's tail
            src = patch_dir / HEADERS_DIR / rel
        if not os.path.exists(src):
            raise InputError(f"the original of {rel} is missing from the revert data",
                             where=src)
        if rel in record.headers:
            rebuild_with_header(src, source / rel, make_parents(staging, rel), base_file.mode)
            continue
        # (A symlink's own mode says nothing: a copy of its file stays read-only.)
        _link(src, make_parents(staging, rel),
              base_file.mode if base_file.link_target is None else None)
    if record.base_manifest:
        src = _original(originals / MANIFEST_NAME, source / MANIFEST_NAME)
        _link(src, make_parents(staging, MANIFEST_NAME), None)
    if record.base_signature:           # the base's own model.sig, byte for byte
        _link(originals / SIGNATURE_NAME, make_parents(staging, SIGNATURE_NAME), None)
    for older in patch_dirs(source)[:-1]:
        # Older revert data comes along (symlinked originals as links to their files).
        for path in sorted(older.rglob("*")):
            rel = path.relative_to(older).as_posix()
            if path.is_dir() and not path.is_symlink():
                continue
            live = source / posixpath.relpath(rel, "originals") if rel.startswith(
                "originals/") else path
            src = _original(path, live)
            if os.path.isfile(src):
                link_or_copy(src, make_parents(staging / PATCHES_DIR / older.name, rel))
    _check_restored(staging, record, jobs, ignore_changes=ignore_changes)
    return patch_dir.name
