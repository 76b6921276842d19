"""The journal that makes in-place patching and reverting crash-safe.

Before the first file of a directory changes, ``.modelpatch/journal.json`` records the whole list
of steps. Every step is a rename (or a symlink creation or removal) inside one filesystem, so each
is either taken or not, and whether it was taken can be read back from the directory:

- phase ``preparing``: new files are being written to a staging directory and nothing the
  engine serves has changed yet; recovery **rolls back** (removes staging and the new patch dir).
- phase ``switching``: staging is complete and durable; recovery **rolls forward** by taking the
  remaining steps, then finishes.

If a step cannot be taken when recovery rolls forward (something now blocks it), recovery rolls
back instead: phase ``rolling-back`` undoes the steps taken, newest first, and never turns
forward again, so no command retries the failing step for ever.

Recovery replays only journals this machine wrote in this very directory. ``create`` writes a
random token to ``.modelpatch/journal.owner`` and records it in the journal with the device and
inode of the directory and of that file; a journal copied, downloaded or crafted with the
directory matches none of these and is refused, never replayed.

The journal also counts the steps taken (``done``, saved after each step). Recovery skips those
and retakes the one that may have been in flight, which is a no-op when its source is gone. The
count matters because a path can be the target of one step and the source of a later one
(``discard X`` then ``unstash X`` in a revert): a presence check alone would take the first again
and throw away what the second restored.

Steps (``rel`` is relative to the directory):

- ``["stash", rel]``: move ``rel`` into the patch's ``originals/``;
- ``["install", rel]``: move the staged new file to ``rel`` (atomically replacing a symlink there);
- ``["unlink", rel, target]``: remove ``rel`` if it is still the symlink to ``target`` (a dropped
  symlink; its original was recreated under ``originals/`` while preparing, see below);
- ``["unstash", rel]``: move an original back;
- ``["relink", rel, target]``: make ``rel`` the symlink to ``target`` again (atomically);
- ``["discard", rel]``: move ``rel`` into a trash directory;
- ``["rmdir", rel]``: remove the directory ``rel`` if it is empty;
- ``["header", rel, src, undo]``: write the bytes of ``src`` over the start of ``rel`` (a GGUF
  header rewritten in place, ``patcher.gguf.header_inplace``); undone by writing ``undo``'s.
  ``src`` and ``undo`` lie under ``.modelpatch/``. Writing the same bytes again is harmless, so
  the step is retaken (or undone) whole after a crash in the middle of it.

Symlinks (Hugging Face cache snapshots link every file into ``../../blobs/``) are never written
through. A symlink cannot be moved into ``originals/`` as is: its relative target would dangle
there, and ``huggingface_hub.scan_cache_dir()`` reports dangling links as a corrupted cache. So
while preparing, the patch records the exact link text and creates under ``originals/`` an
equivalent symlink (same blob, target relative to its new place); the switch then replaces or
removes the live link, and a revert recreates it with its original text.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from .. import faults
from ..config.jsonfile import parse_json
from ..errors import ModelDirError
from ..fsops import fsync_dir, remove_tree, write_file
from ..model.layout import STATE_DIR

JOURNAL_NAME = f"{STATE_DIR}/journal.json"
JOURNAL_TMP = f"{JOURNAL_NAME}.tmp"
JOURNAL_VERSION = 2
OWNER_NAME = f"{STATE_DIR}/journal.owner"
PATCHES_SUBDIR = f"{STATE_DIR}/patches"
_PATCH_IN_TRASH = ".patch-dir.modelpatch"
_ACTIONS = {"stash": 2, "install": 2, "unlink": 3, "unstash": 2, "relink": 3, "discard": 2,
            "rmdir": 2, "header": 4}


@dataclass
class Journal:
    op: str                        # "apply" or "revert"
    phase: str                     # "preparing", "switching" or "rolling-back"
    patch_dir: str                 # relpath of the patch directory
    staging: str                   # relpath of the staging directory (new files)
    trash: str                     # relpath of the trash directory (discarded files)
    steps: list[list[str]] = field(default_factory=list)
    remove_patch_dir: bool = False  # revert: the patch dir goes when done
    done: int = 0                  # steps taken so far (saved after each)
    owner: dict = field(default_factory=dict)  # what binds the journal to this directory

    def create(self, root: Path) -> None:
        """Save the journal for the first time (creating ``.modelpatch/`` if needed), bound to
        this directory by a fresh owner token."""
        state = root / STATE_DIR
        if not state.is_dir():
            state.mkdir()
            faults.point("journal:create")      # a kill here leaves an empty .modelpatch/
            fsync_dir(root)
        self.owner = _write_owner(root)
        self.save(root)

    def save(self, root: Path) -> None:
        data = dict(self.__dict__, version=JOURNAL_VERSION)
        tmp = root / JOURNAL_TMP
        remove_tree(tmp)                        # a killed save's leftover
        write_file(tmp, json.dumps(data, indent=1).encode(), mode=0o644)
        faults.point("journal:save")            # a kill here leaves journal.json.tmp
        os.replace(tmp, root / JOURNAL_NAME)
        fsync_dir(root / STATE_DIR)

    @classmethod
    def load(cls, root: Path) -> Journal | None:
        path = root / JOURNAL_NAME
        if not path.exists():
            return None
        data = parse_json(path.read_bytes(), str(path))
        try:
            if data.pop("version") != JOURNAL_VERSION:
                raise ValueError
            journal = cls(**data)
            for step in journal.steps:
                if _ACTIONS.get(step[0]) != len(step):
                    raise ValueError
            if journal.phase not in ("preparing", "switching", "rolling-back") or \
                    journal.op not in ("apply", "revert"):
                raise ValueError
            # Every path stays inside the directory; the work areas inside .modelpatch/.
            if not all(safe_relpath(step[1]) for step in journal.steps):
                raise ValueError
            if not all(safe_relpath(p) and p.startswith(STATE_DIR + "/")
                       for step in journal.steps if step[0] == "header" for p in step[2:]):
                raise ValueError
            if not (safe_relpath(journal.patch_dir)
                    and journal.patch_dir.startswith(PATCHES_SUBDIR + "/")
                    and all(safe_relpath(p) and p.startswith(STATE_DIR + "/")
                            for p in (journal.staging, journal.trash))):
                raise ValueError
            if not (isinstance(journal.done, int) and 0 <= journal.done <= len(journal.steps)):
                raise ValueError
        except (TypeError, KeyError, AttributeError, ValueError, IndexError):
            raise ModelDirError("unreadable journal; move it aside only if you know the "
                                "directory's state", where=path) from None
        owner = journal.owner if isinstance(journal.owner, dict) else {}
        if not owner or owner != _owner_of(root, owner.get("token")):
            raise ModelDirError("journal was not written in this directory by modelpatch on this "
                                "machine (copied, downloaded or crafted with it); refusing to "
                                "replay it", where=path,
                                hint="remove .modelpatch/journal.json only if you know the "
                                     "directory's state")
        return journal


def _write_owner(root: Path) -> dict:
    token = os.urandom(16).hex()
    path = root / OWNER_NAME
    remove_tree(path)
    write_file(path, token.encode(), mode=0o644)
    return _owner_of(root, token)


def _owner_of(root: Path, token: object) -> dict | None:
    """The binding a journal of ``root`` carrying ``token`` must record, or None if the owner
    file is missing or does not hold ``token``."""
    path = root / OWNER_NAME
    try:
        here, st = os.stat(root), os.lstat(path)
        held = b""
        if os.path.isfile(path) and not path.is_symlink():
            with open(path, "rb") as f:
                held = f.read(64)
    except OSError:
        return None
    if not isinstance(token, str) or not token or held != token.encode():
        return None
    return {"dev": here.st_dev, "ino": here.st_ino, "token": token, "owner_ino": st.st_ino}


def safe_relpath(rel: object) -> bool:
    """A relative POSIX path that stays inside the directory it is relative to."""
    return (isinstance(rel, str) and bool(rel) and not rel.startswith("/")
            and "\0" not in rel and posixpath.normpath(rel) == rel
            and rel != ".." and not rel.startswith("../"))


def take_step(root: Path, journal: Journal, step: list[str]) -> None:
    """Take one step unless it was taken already (its source is gone)."""
    action, rel = step[0], step[1]
    live = root / rel
    _refuse_escape(root, live, root / journal.patch_dir / "originals" / rel,
                   root / journal.staging / rel, root / journal.trash / rel)
    faults.point(f"journal:{action}:{rel}")
    if action == "stash":
        _move_if_present(live, root / journal.patch_dir / "originals" / rel)
    elif action == "install":
        _move_if_present(root / journal.staging / rel, live)
    elif action == "unlink":
        if live.is_symlink() and os.readlink(live) == step[2]:
            live.unlink()
            fsync_dir(live.parent)
    elif action == "unstash":
        _move_if_present(root / journal.patch_dir / "originals" / rel, live)
    elif action == "relink":
        _relink(root, journal, live, step[2])
    elif action == "discard":
        _move_if_present(live, root / journal.trash / rel)
    elif action == "rmdir":
        if live.is_dir() and not live.is_symlink() and not any(live.iterdir()):
            live.rmdir()
            fsync_dir(live.parent)
    elif action == "header":
        _write_header(root, live, step[2])
    else:
        raise ModelDirError(f"unknown journal step {action!r}", where=root / JOURNAL_NAME)
    faults.point(f"journal:{action}:{rel}:taken")


def _refuse_escape(root: Path, *paths: Path) -> None:
    """Refuse a step whose paths leave ``root`` through a symlinked directory (a crafted
    journal or a swapped-in link must never move files outside the model)."""
    real_root = os.path.realpath(root)
    for path in paths:
        parent = os.path.realpath(path.parent)
        if parent != real_root and not parent.startswith(real_root + os.sep):
            raise ModelDirError(f"journal step on {path.relative_to(root)} leads outside the "
                                f"directory through a symlink; refusing it",
                                where=root / JOURNAL_NAME)


def _write_header(root: Path, live: Path, src: str) -> None:
    from ..gguf.header_inplace import write_region

    _refuse_escape(root, root / src)
    write_region(live, root / src)


def _move_if_present(src: Path, dst: Path) -> None:
    if not os.path.lexists(src):
        return            # taken before a crash (the source is gone, the destination holds it)
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.rename(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)


def _relink(root: Path, journal: Journal, live: Path, target: str) -> None:
    if live.is_symlink() and os.readlink(live) == target:
        return
    tmp = root / journal.patch_dir / "relink.tmp"
    remove_tree(tmp)
    os.symlink(target, tmp)
    live.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, live)       # replaces whatever is there (the discard step moved it away)
    fsync_dir(live.parent)


def switch(root: Path, journal: Journal) -> None:
    """Record the switch, take every step, then clean up. Safe to call again after a crash."""
    if journal.phase != "switching":
        faults.point("journal:switch")
        journal.phase = "switching"
        journal.save(root)
    for index in range(journal.done, len(journal.steps)):
        take_step(root, journal, journal.steps[index])
        journal.done = index + 1
        journal.save(root)
    finish(root, journal)


def finish(root: Path, journal: Journal) -> None:
    faults.point("journal:finish")
    if journal.remove_patch_dir:
        patch_dir = root / journal.patch_dir
        if patch_dir.exists():
            # One rename takes the patch off the stack; the files go with the trash.
            (root / journal.trash).mkdir(parents=True, exist_ok=True)
            os.rename(patch_dir, root / journal.trash / _PATCH_IN_TRASH)
            fsync_dir(patch_dir.parent)
            faults.point("journal:finish:unlisted")
    remove_tree(root / journal.staging)
    remove_tree(root / journal.trash)
    faults.point("journal:finish:cleaned")
    _end(root)


def roll_back(root: Path, journal: Journal) -> None:
    """Undo a journal still in its ``preparing`` phase: nothing live has changed."""
    faults.point("journal:rollback")
    if journal.op == "apply":
        patch_dir = root / journal.patch_dir
        if patch_dir.exists():
            (root / journal.trash).mkdir(parents=True, exist_ok=True)
            os.rename(patch_dir, root / journal.trash / _PATCH_IN_TRASH)
    remove_tree(root / journal.staging)
    remove_tree(root / journal.trash)
    faults.point("journal:rollback:cleaned")
    _end(root)


def _end(root: Path) -> None:
    """Remove the journal, and the state directory if nothing else remains in it."""
    patches = root / PATCHES_SUBDIR
    if patches.is_dir() and not any(patches.iterdir()):
        patches.rmdir()
    remove_tree(root / JOURNAL_TMP)
    (root / JOURNAL_NAME).unlink(missing_ok=True)
    faults.point("journal:end")     # a kill here may leave an empty .modelpatch/
    remove_tree(root / OWNER_NAME)
    _remove_empty_state_dir(root)
    fsync_dir(root)


def _remove_empty_state_dir(root: Path) -> None:
    for rel in (PATCHES_SUBDIR, STATE_DIR):
        path = root / rel
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            path.rmdir()


def pending(root: Path) -> bool:
    """Whether ``recover`` has anything to do in ``root``: a journal, or the leftovers of a kill
    in the instant between creating ``.modelpatch/`` and its journal (or between removing the
    journal and the then empty ``.modelpatch/``)."""
    state = root / STATE_DIR
    if not state.is_dir():
        return False
    if any(os.path.lexists(root / n) for n in (JOURNAL_NAME, JOURNAL_TMP, OWNER_NAME)):
        return True
    patches = root / PATCHES_SUBDIR
    return not any(p for p in state.iterdir() if p != patches) and \
        not (patches.is_dir() and any(patches.iterdir()))


def recover(root: Path) -> str | None:
    """Finish or undo an interrupted in-place operation; returns what was done, or None.

    The caller holds the directory's exclusive lock.
    """
    journal = Journal.load(root)
    if journal is None:
        if pending(root):   # an empty .modelpatch/, a lone journal.json.tmp or journal.owner
            remove_tree(root / JOURNAL_TMP)
            remove_tree(root / OWNER_NAME)
            _remove_empty_state_dir(root)
        return None
    name = Path(journal.patch_dir).name
    if journal.phase == "switching":
        try:
            switch(root, journal)
            return f"completed the interrupted {journal.op} of {name}"
        except OSError as exc:
            why = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
            undo_switch(root, journal)
            return f"could not complete the interrupted {journal.op} of {name} ({why}); " \
                   f"rolled it back"
    if journal.phase == "rolling-back":
        undo_switch(root, journal)
    else:
        roll_back(root, journal)
    return f"rolled back the interrupted {journal.op} of {name}"


def undo_switch(root: Path, journal: Journal) -> None:
    """Undo the steps a switch took, newest first (the one in flight too, if it was taken),
    then clean up as ``roll_back`` does. Once begun it is recorded, so a crash here resumes the
    undoing: recovery never turns forward again."""
    if journal.phase != "rolling-back":
        journal.phase = "rolling-back"
        journal.save(root)
    for index in range(min(journal.done, len(journal.steps) - 1), -1, -1):
        _undo_step(root, journal, journal.steps[index])
        journal.done = index
        journal.save(root)
    roll_back(root, journal)


def _undo_step(root: Path, journal: Journal, step: list[str]) -> None:
    """Undo one step if it was taken: a move whose source is gone and destination present
    is moved back; a removed link or directory is made again; a made link removed."""
    action, rel = step[0], step[1]
    live = root / rel
    original = root / journal.patch_dir / "originals" / rel
    _refuse_escape(root, live, original, root / journal.staging / rel, root / journal.trash / rel)
    faults.point(f"journal:undo:{action}:{rel}")
    moves = {"stash": (live, original), "install": (root / journal.staging / rel, live),
             "unstash": (original, live), "discard": (live, root / journal.trash / rel)}
    if action in moves:
        src, dst = moves[action]
        if not os.path.lexists(src):
            _move_if_present(dst, src)
    elif action == "unlink" and not os.path.lexists(live):
        os.symlink(step[2], live)
        fsync_dir(live.parent)
    elif action == "relink" and live.is_symlink() and os.readlink(live) == step[2]:
        live.unlink()
        fsync_dir(live.parent)
    elif action == "rmdir" and not os.path.lexists(live):
        live.mkdir()
        fsync_dir(live.parent)
    elif action == "header":
        _write_header(root, live, step[3])
