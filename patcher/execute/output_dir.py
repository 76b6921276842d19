"""An output directory put in place atomically: built in a staging directory beside it (same
file system), then renamed into place; a previous output (``--force``) is moved aside first and
put back if anything fails; leftovers of a killed process are cleaned up by the next one, which
holds the output's lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

from .. import faults
from ..errors import InputError
from ..fsops import fsync_dir, remove_tree
from ..model.model_dir import MANIFEST_NAME, STATE_DIR
from .locking import lock_directory

STAGING_MARK = ".modelpatch-staging-"
REPLACED_MARK = ".modelpatch-replaced-"
log = logging.getLogger("modelpatch")


def refuse_to_replace_a_stranger(out: Path, stacked_on: Path | None = None) -> None:
    """``--force`` replaces an earlier variant, never a directory modelpatch did not write (or a
    file, or a link): that could be anything, and it would be deleted. ``stacked_on``: a base;
    a variant of it with in-place patches stacked on it (``api.apply_stacked``'s output) is
    replaceable too: whatever its revert data holds was made from that base."""
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        raise InputError("output exists and is not a directory; force=True replaces only an "
                         "earlier modelpatch variant", where=out)
    if not (out / MANIFEST_NAME).is_file() and any(out.iterdir()):
        raise InputError(f"output exists and is not a modelpatch variant (no {MANIFEST_NAME}); "
                         f"force=True replaces only an earlier variant", where=out,
                         hint="remove it yourself, or choose another -o")
    own = _own_revert_data(out, stacked_on)
    if own:
        raise InputError(f"output holds revert data of its own ({own}); --force replaces only "
                         f"an out-of-place variant, never a directory patched in place",
                         where=out, hint="revert it first, or choose another -o")


def _own_revert_data(out: Path, stacked_on: Path | None = None) -> str | None:
    """Why ``out/.modelpatch/`` may hold the only copy of something: an in-place patch (its
    originals were moved there) unless all sit on a variant of ``stacked_on``, an interrupted
    operation, or records that cannot be read."""
    from ..errors import PatchError
    from ..integrity.patch_record import patch_dirs, read_record
    from .journal import JOURNAL_NAME, JOURNAL_TMP

    state = out / STATE_DIR
    if not os.path.lexists(state):
        return None
    if state.is_symlink() or not state.is_dir():
        return f"{STATE_DIR} is not a directory"
    if os.path.lexists(out / JOURNAL_NAME) or os.path.lexists(out / JOURNAL_TMP):
        return "an interrupted in-place operation"
    try:
        records = [read_record(d) for d in patch_dirs(out)]
    except (PatchError, OSError):
        return "a patch record that cannot be read"
    if not {r.mode for r in records} - {"variant"}:
        return None
    first = records[0]
    if stacked_on is not None and first.mode == "variant" and first.base_path is not None \
            and Path(first.base_path).resolve() == stacked_on.resolve():
        return None
    return "an in-place patch"


def scratch_beside(out: Path) -> Path:
    """A path (not created) beside ``out`` for a tree built there and then renamed to ``out``;
    a killed process's one is removed by the next command that writes ``out``
    (``remove_stale_staging``)."""
    return out.with_name(f".{out.name}{STAGING_MARK}stack-{os.getpid()}")


def make_staging_dir(out: Path) -> Path:
    """A fresh staging directory beside ``out`` (same filesystem, so the commit is a rename),
    with the mode a plain mkdir would give (mkdtemp's 0700 would otherwise become the output's)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}{STAGING_MARK}", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)
    return staging


def remove_stale_staging(out: Path) -> None:
    """Staging dirs for ``out`` left by a killed process (we hold ``out``'s lock, so no live
    process owns them), and previous outputs a ``--force`` run moved aside, once ``out`` is in
    place (without ``out``, one of them may be the only copy: see ``restore_replaced``)."""
    patterns = [f".{out.name}{STAGING_MARK}*"]
    if os.path.lexists(out):
        patterns.append(f".{out.name}{REPLACED_MARK}*")
    for pattern in patterns:
        for entry in out.parent.glob(pattern):
            remove_tree(entry)


def restore_replaced(out: Path) -> None:
    """Put back a previous output that a ``--force`` run killed between moving it aside and
    renaming its new output into place had left hidden (the caller holds ``out``'s lock)."""
    if os.path.lexists(out):
        return
    replaced = sorted(out.parent.glob(f".{out.name}{REPLACED_MARK}*"),
                      key=lambda p: p.lstat().st_mtime_ns)
    if replaced:
        os.rename(replaced[-1], out)
        log.warning("%s: put back the previous output, which an interrupted force=True run had "
                    "moved aside", out)


def fsync_tree(root: Path) -> None:
    """fsync every directory under ``root`` (files were fsynced as written)."""
    for dirpath, _dirs, _files in os.walk(root):
        fsync_dir(Path(dirpath))


def commit(staging: Path, out: Path) -> None:
    """Rename ``staging`` to ``out`` (moving a previous ``out`` aside first, for --force).

    On failure nothing has changed: the new tree is back at ``staging`` for the caller to remove,
    and a previous ``out`` is back in place."""
    faults.point("commit")
    old = None
    if out.exists() or out.is_symlink():
        with lock_directory(out, exclusive=True) if out.is_dir() else contextlib.nullcontext():
            old = out.with_name(f".{out.name}{REPLACED_MARK}{os.getpid()}")
            os.rename(out, old)
    try:
        os.rename(staging, out)
        try:
            fsync_dir(out.parent)
        except BaseException:
            os.rename(out, staging)     # not durable: take it back
            raise
    except BaseException:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        try:
            remove_tree(old)
        except OSError as exc:          # the new output is in place; this is only clutter
            log.warning("%s: could not remove the replaced output: %s", old,
                        exc.strerror or exc)
