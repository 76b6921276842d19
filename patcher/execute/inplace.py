"""In-place patching: the directory itself changes, and stays revertible.

Under the directory's exclusive lock, any interrupted journal is recovered first
(``prepare_directory``); the plan is made there, under the lock (``api.apply_in_place``), and
carried out only if the directory is still what it read (``plan.check_unchanged``: a plan made
before another process patched the directory is refused, never applied twice). New files are
written to ``.modelpatch/staging-N/`` (same filesystem), the patch record to
``.modelpatch/patches/NNNN-name/``. Then the journal switches: each replaced or dropped file is
renamed into the patch's ``originals/``, each new file is renamed into place, and the provenance
manifest goes last. A crash at any instant is finished or undone by the next command
(``journal.recover``).

Hugging Face cache snapshots: a replaced file that is a symlink into ``../../blobs/`` is never
written through. Its original is kept as an equivalent symlink under ``originals/`` (same blob,
target relative to that place, created while preparing; the exact link text goes into the patch
record), and the switch replaces the live link by the new regular file with one rename. Unchanged
files stay symlinks.
"""

from __future__ import annotations

import logging
import os
import posixpath
from pathlib import Path

from .. import faults
from ..errors import ModelDirError, OperationFailed
from ..fsops import make_parents, write_file
from ..gguf.header_inplace import apply_steps as header_apply_steps
from ..gguf.header_inplace import header_rewrites, is_header_rewrite
from ..gguf.header_inplace import stage_apply as stage_header_rewrites
from ..integrity.patch_record import PATCHES_DIR, RECORD_NAME, encode_record
from ..model.model_dir import MANIFEST_NAME, SIGNATURE_NAME, STATE_DIR, ModelDir
from ..plan.build import check_unchanged
from ..plan.types import Action, Plan
from .engine import ApplyResult
from .journal import Journal, recover, roll_back, switch
from .locking import lock_directory
from .output_dir import fsync_tree
from .patch_builder import PatchBuilder, Progress

log = logging.getLogger("modelpatch")


def steps_for(plan: Plan, model: ModelDir) -> list[list[str]]:
    """The journal steps of an in-place apply, manifest last."""
    steps: list[list[str]] = []
    replaced = [(fp.source, None if fp.action is Action.DROP else fp.path)
                for fp in plan.files
                if fp.action is not Action.LINK and not is_header_rewrite(fp)]
    if model.has(SIGNATURE_NAME):       # stale once patched: kept for revert, not in place
        replaced.append((SIGNATURE_NAME, None))
    if model.has(MANIFEST_NAME):
        replaced.append((MANIFEST_NAME, MANIFEST_NAME))
    else:
        replaced.append((None, MANIFEST_NAME))
    for source, path in replaced:
        if source is not None:
            link = model.files[source].link_target
            if link is None:
                steps.append(["stash", source])
            elif path != source:
                # A symlink that is not replaced by a rename onto it must go; its original
                # was recreated under originals/ while preparing.
                steps.append(["unlink", source, link])
        if path is not None:
            steps.append(["install", path])
    return steps


def apply_in_place(plan: Plan, model: ModelDir, *, progress: Progress | None = None,
                   base_model: str | None = None) -> ApplyResult:
    """Patch ``model.root`` itself with ``plan``'s recipe and options (``base_model``: the hub
    repository ``ORG/NAME`` to record, when the directory does not say).

    Raises:
        LockHeld: another modelpatch process works on the directory.
        PlanError: the directory changed since ``plan`` was made (nothing is written).
        OperationFailed: an I/O error. Before the switch, everything is rolled back; during it,
            the journal is kept and the next modelpatch command completes the patch.
    """
    with lock_directory(model.root, exclusive=True):
        prepare_directory(model.root)
        return apply_locked(plan, model, progress=progress, base_model=base_model)


def prepare_directory(root: Path) -> None:
    """Under the exclusive lock, before planning: refuse a symlinked state directory, and
    finish or undo any interrupted journal."""
    _refuse_symlinked_state_dir(root)
    done = recover(root)
    if done:
        log.warning("%s: %s", root, done)


def apply_locked(plan: Plan, model: ModelDir, *, progress: Progress | None = None,
                 base_model: str | None = None) -> ApplyResult:
    """``apply_in_place`` for a caller that holds the exclusive lock and has called
    ``prepare_directory``: refuses ``plan`` if the directory changed since it was made."""
    root = model.root
    check_unchanged(plan)
    builder = PatchBuilder(plan, model, progress=progress or Progress(),
                           base_model=base_model)
    sequence = builder.sequence
    patch_dir = f"{PATCHES_DIR}/{sequence:04d}-{plan.recipe.name}"
    staging = f"{STATE_DIR}/staging-{sequence:04d}"
    journal = Journal(op="apply", phase="preparing", patch_dir=patch_dir, staging=staging,
                      trash=f"{STATE_DIR}/trash-{sequence:04d}",
                      steps=header_apply_steps(plan, patch_dir, staging) + steps_for(plan, model))
    faults.point("inplace:begin")
    try:
        subjects, manifest_sha = _stage_patch(root, plan, model, builder, journal)
    except BaseException as exc:
        _roll_back_or_warn(root, journal)
        if isinstance(exc, OSError):
            raise _failed(exc, root, "nothing was changed") from None
        raise
    try:
        switch(root, journal)
    except OSError as exc:
        raise _failed(exc, root, "the patch is half-switched; its journal is kept and the "
                                 "next modelpatch command on this directory completes it") \
            from None
    return ApplyResult(output=root, manifest_sha256=manifest_sha, files=len(subjects),
                       bytes_linked=0, bytes_written=plan.bytes_written,
                       bytes_hashed=builder.bytes_hashed, link_method=None)


def _stage_patch(root: Path, plan: Plan, model: ModelDir, builder: PatchBuilder,
                 journal: Journal) -> tuple[dict[str, tuple[str, int]], str]:
    """Everything before the switch: the journal, the new files in staging, the base's digests
    (shards the rewrite read are hashed by then), the kept original links, the patch record and
    the manifest, all fsynced. Returns the manifest's subjects and its sha256."""
    journal.create(root)
    faults.point("inplace:prepare")
    staging = root / journal.staging
    staging.mkdir()
    patch_dir = root / journal.patch_dir
    header_digests = stage_header_rewrites(root, plan, builder, staging, patch_dir)
    digests = builder.write_new_files(staging) | header_digests
    base_digests = builder.base_digests()
    record = builder.record(base_digests, mode="in-place")
    if patch_dir.name != record.dirname:
        raise OperationFailed(f"patch directory {patch_dir.name!r} is not the record's "
                              f"{record.dirname!r}", where=patch_dir)
    record.headers = {fp.path: len(fp.shard_task.header) for fp in header_rewrites(plan)}
    record.replaced = [rel for rel in record.replaced if rel not in record.headers]
    record.links = _link_originals(root, model, journal, patch_dir)
    record.made_dirs = _new_dirs(root, journal)
    subjects = builder.subjects(staging, digests, base_digests)
    manifest_sha = builder.write_manifest(staging, subjects, base_digests)
    record.manifest_sha256 = manifest_sha
    write_file(make_parents(patch_dir, RECORD_NAME), encode_record(record))
    fsync_tree(root / STATE_DIR)
    faults.point("inplace:prepared")
    return subjects, manifest_sha


def _roll_back_or_warn(root: Path, journal: Journal) -> None:
    try:
        roll_back(root, journal)
    except OSError as cleanup:
        log.warning("%s: could not roll back (%s); the next modelpatch command on "
                    "this directory retries", root, cleanup.strerror or cleanup)


def _failed(exc: OSError, root: Path, what: str) -> OperationFailed:
    return OperationFailed(exc.strerror or str(exc), where=exc.filename or root, hint=what)


def _refuse_symlinked_state_dir(root: Path) -> None:
    state = root / STATE_DIR
    if state.is_symlink() or (state.exists() and not state.is_dir()):
        raise ModelDirError(f"{STATE_DIR} is not a directory of its own", where=state,
                            hint="modelpatch keeps revert data there and never follows a link")


def _link_originals(root: Path, model: ModelDir, journal: Journal,
                    patch_dir: Path) -> dict[str, str]:
    """Recreate each symlink the switch will replace or remove under ``originals/``, pointing
    at the same file; return their exact link texts."""
    links = {}
    for step in journal.steps:
        rel = step[1]
        f = model.files.get(rel)
        if step[0] not in ("install", "unlink") or f is None or f.link_target is None:
            continue
        if rel in links:
            continue
        original = make_parents(patch_dir / "originals", rel)
        os.symlink(relocated_link(root, rel, f.link_target,
                                  original.relative_to(root).as_posix()), original)
        if os.path.realpath(original) != os.path.realpath(root / rel):
            raise ModelDirError(f"cannot keep the symlink to {f.link_target!r} under "
                                f"{STATE_DIR}/", where=root / rel)
        links[rel] = f.link_target
    return links


def _new_dirs(root: Path, journal: Journal) -> list[str]:
    """Directories the install steps will create (for added files), deepest first."""
    made = set()
    for step in journal.steps:
        if step[0] == "install":
            parent = posixpath.dirname(step[1])
            while parent and not (root / parent).is_dir():
                made.add(parent)
                parent = posixpath.dirname(parent)
    return sorted(made, key=lambda d: (-d.count("/"), d))


def relocated_link(root: Path, rel: str, target: str, new_rel: str) -> str:
    """The text of a symlink at ``new_rel`` that reaches what ``target`` reaches from ``rel``
    (both relative to ``root``). Absolute targets stay as they are."""
    if posixpath.isabs(target):
        return target
    base = os.path.abspath(root)
    where = posixpath.normpath(posixpath.join(base, posixpath.dirname(rel), target))
    return posixpath.relpath(where, posixpath.join(base, posixpath.dirname(new_rel)))
