"""How a variant carries the base's unchanged files: the ``--link`` modes, and the method an
apply will use for a given output path, predicted before anything is written.

``auto`` reflinks where the filesystem can (btrfs, XFS, bcachefs: the variant gets its own copy
on write), else hardlinks (the variant's file *is* the base's: editing one edits both), else
copies (another filesystem). ``reflink`` and ``hardlink`` refuse to fall back; ``copy`` always
copies.

The prediction compares the device of a base file with the device of the output's parent, and
probes reflink support by cloning a 4 KiB temporary file within the output's parent. It is exact
on the usual set-ups; two btrfs subvolumes (different devices, one filesystem) are predicted as
a copy although ``auto`` may still reflink between them.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import InputError
from ..fsops import reflink
from ..units import human_bytes

MODES = ("auto", "reflink", "hardlink", "copy")
COPY_WARN_BYTES = 1 << 30
"""``apply --link auto`` warns before copying more than this (``MODELPATCH_COPY_WARN_BYTES``)."""
log = logging.getLogger("modelpatch")


@dataclass(frozen=True)
class LinkPrediction:
    """The method an apply will use to carry the base's files into ``output``, and why."""

    mode: str                  # what was asked: one of MODES
    method: str                # what will happen: reflink, hardlink or copy
    reason: str
    output: str
    unchanged_bytes: int = 0   # unchanged files carried into the variant
    originals_bytes: int = 0   # base files a patch replaces, kept for revert

    @property
    def carried_bytes(self) -> int:
        return self.unchanged_bytes + self.originals_bytes

    def to_json(self) -> dict:
        return {"mode": self.mode, "method": self.method, "reason": self.reason,
                "output": self.output}


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise InputError(f"link mode {mode!r} is not one of {', '.join(MODES)}")
    return mode


def _existing_dir(path: Path) -> Path:
    """``path``'s nearest existing ancestor directory (a plan's output may not exist yet)."""
    path = Path(os.path.abspath(path))
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def can_reflink_in(directory: Path) -> bool:
    """Whether the filesystem of ``directory`` clones files: a 4 KiB temporary file is cloned
    within it and both are removed. False where ``directory`` is not writable."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".modelpatch-reflink-probe-", dir=directory)
    except OSError:
        return False
    clone = Path(probe + ".clone")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * 4096)
        return reflink(Path(probe), clone)
    except OSError:
        return False
    finally:
        for path in (Path(probe), clone):
            path.unlink(missing_ok=True)


def predict(base_file: Path | None, output: Path, mode: str) -> LinkPrediction:
    """The method an apply in ``mode`` will use to carry ``base_file`` (any file of the base;
    None: nothing to carry) into ``output``. Raises ``InputError`` when ``reflink`` or
    ``hardlink`` was asked and cannot be done there."""
    check_mode(mode)
    out = str(output)
    if mode == "copy":
        return LinkPrediction(mode, "copy", "--link copy", out)
    parent = _existing_dir(Path(output).parent)
    if base_file is None:
        return LinkPrediction(mode, "hardlink", "no unchanged file to carry", out)
    same_fs = os.stat(os.path.realpath(base_file)).st_dev == os.stat(parent).st_dev
    if not same_fs:
        why = f"{parent} is on another filesystem than the base"
        if mode != "auto":
            raise InputError(f"--link {mode}: {why}; {mode}s cannot cross filesystems",
                             where=output, hint="write the variant on the base's filesystem, "
                                                "or pass --link copy")
        return LinkPrediction(mode, "copy", why, out)
    if mode in ("auto", "reflink") and can_reflink_in(parent):
        return LinkPrediction(mode, "reflink", "the filesystem clones files", out)
    if mode == "reflink":
        raise InputError(f"--link reflink: the filesystem of {parent} cannot clone files",
                         where=output, hint="pass --link hardlink, copy or auto")
    return LinkPrediction(mode, "hardlink", "same filesystem, no reflink support", out)


def predict_for_plan(plan, output: Path, mode: str):
    """``plan`` with its ``link`` prediction for writing the variant at ``output``."""
    from ..plan.types import Action

    carried = plan.by_action(Action.LINK)
    originals = [f for f in plan.files if f.source and f.action is not Action.LINK]
    sample = next(iter(carried or originals), None)
    base_file = Path(plan.base) / sample.source if sample is not None else None
    prediction = predict(base_file, output, mode)
    prediction = replace(prediction, unchanged_bytes=plan.bytes_unchanged,
                         originals_bytes=sum(f.size_before or 0 for f in originals)
                         + _revert_data_bytes(Path(plan.base)))
    return replace(plan, link=prediction)


def _revert_data_bytes(base: Path) -> int:
    """The base's own manifest and patch stack, which a variant carries for revert."""
    from ..integrity.patch_record import patch_dirs
    from ..model.model_dir import MANIFEST_NAME

    files = [base / MANIFEST_NAME] + [p for d in patch_dirs(base) for p in d.rglob("*")]
    return sum(p.stat().st_size for p in files if p.is_file())


def copy_warn_bytes() -> int:
    value = os.environ.get("MODELPATCH_COPY_WARN_BYTES", "")
    return int(value) if value.isdigit() else COPY_WARN_BYTES


def warn_before_copying(prediction: LinkPrediction) -> None:
    """``--link auto`` that will copy more than ``copy_warn_bytes()``: say so, how much and why,
    before the copy starts (an explicit ``--link copy`` is not warned about)."""
    if prediction.mode != "auto" or prediction.method != "copy":
        return
    if prediction.carried_bytes <= copy_warn_bytes():
        return
    kept = (f", {human_bytes(prediction.originals_bytes)} of originals kept for revert"
            if prediction.originals_bytes else "")
    log.warning("warning: copying %s instead of linking: %s (%s of unchanged files%s); "
                "--link copy copies without this warning", human_bytes(prediction.carried_bytes),
                prediction.reason, human_bytes(prediction.unchanged_bytes), kept)
