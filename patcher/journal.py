"""The journal that makes in-place patching and reverting crash-safe.

Before the first file of a directory changes, ``.modelpatch/journal.json`` records the whole list
of steps. Every step is a rename inside one filesystem, so each is either taken or not, and whether
it was taken can be read back from the directory. That makes both directions idempotent:

- phase ``preparing``: new files are being written to a staging directory and nothing the
  engine serves has changed yet; recovery **rolls back** (removes staging and the new patch dir).
- phase ``switching``: staging is complete and durable; recovery **rolls forward** by taking the
  remaining steps, then finishes.

Steps: ``["stash", rel]`` moves ``rel`` into the patch's ``originals/``; ``["install", rel]``
moves the staged file to ``rel``; ``["unstash", rel]`` moves an original back; ``["discard", rel]``
moves ``rel`` into a trash directory. Each is taken with a check that makes a retaken step a no-op.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import faults
from .errors import ModelDirError
from .fsops import fsync_dir, remove_tree
from .jsonfile import parse_json
from .model_dir import STATE_DIR

JOURNAL_NAME = f"{STATE_DIR}/journal.json"
JOURNAL_VERSION = 1


@dataclass
class Journal:
    op: str                        # "apply" or "revert"
    phase: str                     # "preparing" or "switching"
    patch_dir: str                 # relpath of the patch directory
    staging: str                   # relpath of the staging directory (new files)
    trash: str                     # relpath of the trash directory (discarded files)
    steps: list[list[str]] = field(default_factory=list)
    remove_patch_dir: bool = False  # revert: the patch dir goes when done

    def save(self, root: Path) -> None:
        data = dict(self.__dict__, version=JOURNAL_VERSION)
        tmp = root / f"{JOURNAL_NAME}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / JOURNAL_NAME)
        fsync_dir(root / STATE_DIR)

    @classmethod
    def load(cls, root: Path) -> "Journal | None":
        path = root / JOURNAL_NAME
        if not path.exists():
            return None
        data = parse_json(path.read_bytes(), str(path))
        try:
            data.pop("version")
            return cls(**data)
        except (TypeError, KeyError, AttributeError):
            raise ModelDirError("unreadable journal; move it aside only if you know the "
                                "directory's state", where=path) from None


def take_step(root: Path, journal: Journal, step: list[str]) -> None:
    """Take one step if it has not been taken yet."""
    action, rel = step
    live = root / rel
    original = root / journal.patch_dir / "originals" / rel
    staged = root / journal.staging / rel
    trashed = root / journal.trash / rel
    faults.point(f"journal:{action}:{rel}")
    if action == "stash":
        _move_if_present(live, original, done_if=original)
    elif action == "install":
        _move_if_present(staged, live, done_if=None)
    elif action == "unstash":
        _move_if_present(original, live, done_if=None)
    elif action == "discard":
        _move_if_present(live, trashed, done_if=trashed)
    else:
        raise ModelDirError(f"unknown journal step {action!r}", where=root / JOURNAL_NAME)


def _move_if_present(src: Path, dst: Path, done_if: Path | None) -> None:
    if done_if is not None and os.path.lexists(done_if):
        return
    if not os.path.lexists(src):
        return            # taken before a crash (the source is gone, the destination holds it)
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.rename(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)


def switch(root: Path, journal: Journal) -> None:
    """Record the switch, take every step, then clean up. Safe to call again after a crash."""
    if journal.phase != "switching":
        journal.phase = "switching"
        journal.save(root)
    for step in journal.steps:
        take_step(root, journal, step)
    finish(root, journal)


def finish(root: Path, journal: Journal) -> None:
    faults.point("journal:finish")
    remove_tree(root / journal.staging)
    remove_tree(root / journal.trash)
    if journal.remove_patch_dir:
        remove_tree(root / journal.patch_dir)
    (root / JOURNAL_NAME).unlink()
    _remove_empty_state_dir(root)
    fsync_dir(root)


def roll_back(root: Path, journal: Journal) -> None:
    """Undo a journal still in its ``preparing`` phase: nothing live has changed."""
    remove_tree(root / journal.staging)
    remove_tree(root / journal.trash)
    if journal.op == "apply":
        remove_tree(root / journal.patch_dir)
    (root / JOURNAL_NAME).unlink()
    _remove_empty_state_dir(root)
    fsync_dir(root)


def _remove_empty_state_dir(root: Path) -> None:
    for rel in (f"{STATE_DIR}/patches", STATE_DIR):
        path = root / rel
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def recover(root: Path) -> str | None:
    """Finish or undo an interrupted in-place operation; returns what was done, or None.

    The caller holds the directory's exclusive lock.
    """
    journal = Journal.load(root)
    if journal is None:
        return None
    if journal.phase == "switching":
        switch(root, journal)
        return f"completed the interrupted {journal.op} of {journal.patch_dir}"
    roll_back(root, journal)
    return f"rolled back the interrupted {journal.op} of {journal.patch_dir}"
