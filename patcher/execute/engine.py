"""The executor: carries out a ``Plan`` as a new variant, atomically.

Steps (docs/architecture.md §2): staging directory beside the output; unchanged files linked
(reflink, hardlink, else copy); changed files written read-only and hashed while written; every
output digest known or computed once; revert data and the provenance manifest written; fsync; one
atomic rename into place; fsync of the parent. On any error, signal or interrupt the staging
directory is removed and nothing appears at the output. The base is only read.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import faults, interrupts
from ..errors import InputError, OperationFailed
from ..fsops import link_or_copy, make_parents, remove_tree, write_file
from ..integrity.patch_record import (
    PATCHES_DIR,
    RECORD_NAME,
    PatchRecord,
    encode_record,
    patch_dirs,
)
from ..integrity.shared_inodes import remember_variant
from ..model import header_cache
from ..model.model_dir import MANIFEST_NAME, SIGNATURE_NAME, STATE_DIR, ModelDir
from ..plan.build import check_unchanged
from ..plan.types import Action, Plan
from .executors import executing
from .locking import lock_directory, lock_new_path
from .output_dir import (
    commit,
    fsync_tree,
    make_staging_dir,
    refuse_to_replace_a_stranger,
    remove_stale_staging,
    restore_replaced,
)
from .patch_builder import PatchBuilder, Progress

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
               progress: Progress | None = None, base_model: str | None = None,
               signer=None, base_signature: dict | None = None) -> ApplyResult:
    """Write the variant described by ``plan`` to ``out``. How base files are carried, how many
    workers and which executor run the work come from ``plan.options`` and nowhere else, so
    the manifest records what was done. With ``signer`` (a
    ``patcher.signing.keys.KeySigner``, or ``"sigstore"``) its ``model.sig`` is written last in
    staging, so the variant appears signed or not at all; ``base_signature``: what the manifest
    records of the base's ``model.sig`` (``patcher.signing.verify.base_signature``).

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
    options = plan.options
    try:
        with lock_directory(model.root, exclusive=False), lock_new_path(out), \
                executing(options.executor, options.ray_address):
            check_unchanged(plan)
            restore_replaced(out)
            if (out.exists() or out.is_symlink()) and not force:
                raise InputError("output already exists", where=out,
                                 hint="force=True replaces it")
            refuse_to_replace_a_stranger(out)
            remove_stale_staging(out)
            staging = make_staging_dir(out)
            try:
                with interrupts.policy():
                    result, builder = _build(plan, model, staging, progress or Progress(),
                                             base_model, signer=signer,
                                             base_signature=base_signature, name=out.name)
                    with interrupts.deferred():     # renamed whole, or not at all
                        commit(staging, out)
                _refresh_caches(builder, result.pop("base_digests"))
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


def _build(plan: Plan, model: ModelDir, staging: Path, progress: Progress,
           base_model: str | None, *, signer=None, base_signature: dict | None = None,
           name: str = "") -> tuple[dict, PatchBuilder]:
    """Lay out the whole variant in ``staging``."""
    builder = PatchBuilder(plan, model, progress=progress, base_model=base_model,
                           base_signature=base_signature)
    carried = _Carrier(plan.options.link or "auto", progress.copying)
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
    if signer is not None:         # last: over the manifest's digests, nothing rehashed
        from ..signing.sign import resources_of, write_new_signature

        write_new_signature(staging, name, resources_of(subjects, manifest_sha), signer)
    fsync_tree(staging)
    copied = carried.bytes.get("copy", 0)
    return {"manifest_sha256": manifest_sha, "files": len(subjects),
            "bytes_linked": sum(carried.bytes.values()) - copied, "bytes_copied": copied,
            "bytes_written": plan.bytes_written, "bytes_hashed": builder.bytes_hashed,
            "link_method": "/".join(sorted(carried.bytes)) or None,
            "base_digests": base_digests}, builder


def _refresh_caches(builder: PatchBuilder, base_digests: dict[str, str]) -> None:
    """Keep the base's digest and header cache entries after the commit (replacing an output,
    --force, unlinks its links to the base: their ctime moves again). Best effort."""
    try:
        builder.rerecord_linked(base_digests)
        header_cache.refresh(builder.model, list(builder.source_stats))
    except OSError as exc:
        log.warning("could not refresh the caches of %s: %s", builder.model.root, exc)


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


def _write_revert_data(record: PatchRecord, model: ModelDir, staging: Path,
                       carry: _Carrier) -> None:
    """Carry the base's patch stack over; add this patch's record and links to the originals."""
    for old in patch_dirs(model.root):
        _link_tree(old, staging / PATCHES_DIR / old.name, carry)
    patch_dir = staging / PATCHES_DIR / record.dirname
    originals = patch_dir / "originals"
    for rel in record.replaced + ([MANIFEST_NAME] if record.base_manifest else []) + (
            [SIGNATURE_NAME] if record.base_signature else []):
        carry(model.files[rel].path, make_parents(originals, rel))
    write_file(make_parents(patch_dir, RECORD_NAME), encode_record(record))


def _link_tree(src: Path, dst: Path, carry: _Carrier) -> None:
    for path in sorted(src.rglob("*")):
        if path.is_file():           # a symlinked original (in-place HF patch) links its blob
            carry(path, make_parents(dst, path.relative_to(src).as_posix()))


__all__ = ["apply_plan", "default_output", "ApplyResult", "Progress", "STATE_DIR"]
