"""In-place patching: the directory itself changes, and stays revertible.

New files are written to ``.modelpatch/staging-N/`` (same filesystem), the patch record to
``.modelpatch/patches/NNNN-name/``. Then the journal switches: each replaced or dropped file is
renamed into the patch's ``originals/`` (a symlink moves as a symlink; a Hugging Face blob is never
written through), each new file is renamed into place, and the provenance manifest goes last.
A crash at any instant is finished or undone by the next command (``journal.recover``).
"""

from __future__ import annotations

import os
from pathlib import Path

from .engine import ApplyResult, PatchBuilder, Progress, _fsync_tree, _prepare
from .fsops import write_file
from .journal import Journal, roll_back, switch
from .locking import lock_directory
from .model_dir import MANIFEST_NAME, STATE_DIR, ModelDir
from .patch_record import PATCHES_DIR, RECORD_NAME, encode_record
from .plan import Action, Plan


def steps_for(plan: Plan, has_manifest: bool) -> list[list[str]]:
    """The journal steps of an in-place apply, manifest last."""
    steps: list[list[str]] = []
    for fp in plan.files:
        if fp.action is Action.LINK:
            continue
        if fp.source is not None:
            steps.append(["stash", fp.source])
        if fp.action is not Action.DROP:
            steps.append(["install", fp.path])
    if has_manifest:
        steps.append(["stash", MANIFEST_NAME])
    steps.append(["install", MANIFEST_NAME])
    return steps


def apply_in_place(plan: Plan, model: ModelDir, *, jobs: int | None = None,
                   progress: Progress | None = None) -> ApplyResult:
    """Patch ``model.root`` itself. The caller has recovered any earlier journal."""
    root = model.root
    with lock_directory(root, exclusive=True):
        builder = PatchBuilder(plan, model, jobs=jobs, progress=progress or Progress())
        base_digests = builder.base_digests()
        record = builder.record(base_digests, mode="in-place")
        journal = Journal(op="apply", phase="preparing",
                          patch_dir=f"{PATCHES_DIR}/{record.dirname}",
                          staging=f"{STATE_DIR}/staging-{record.sequence:04d}",
                          trash=f"{STATE_DIR}/trash-{record.sequence:04d}",
                          steps=steps_for(plan, model.has(MANIFEST_NAME)))
        (root / STATE_DIR).mkdir(exist_ok=True)
        journal.save(root)
        try:
            staging = root / journal.staging
            staging.mkdir()
            digests = builder.write_new_files(staging)
            write_file(_prepare(root / journal.patch_dir, RECORD_NAME), encode_record(record))
            subjects = _subjects(plan, model, staging, digests, base_digests)
            manifest_sha = builder.write_manifest(staging, subjects, base_digests, record)
            _fsync_tree(root / STATE_DIR)
        except BaseException:
            roll_back(root, journal)
            raise
        switch(root, journal)
    return ApplyResult(output=root, manifest_sha256=manifest_sha, files=len(subjects),
                       bytes_linked=0, bytes_written=plan.bytes_written,
                       bytes_hashed=builder.bytes_hashed, link_method=None)


def _subjects(plan: Plan, model: ModelDir, staging: Path, digests: dict[str, str],
              base_digests: dict[str, str]) -> dict[str, tuple[str, int]]:
    subjects = {}
    for fp in plan.files:
        if fp.action is Action.LINK:
            subjects[fp.path] = (base_digests[fp.source], model.files[fp.source].size)
        elif fp.action is not Action.DROP:
            subjects[fp.path] = (digests[fp.path], os.path.getsize(staging / fp.path))
    return subjects
