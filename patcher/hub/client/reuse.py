"""Local bytes ``pull`` can use instead of downloading: files with the sha256 of an LFS file of
the repository.

Where it looks, for each wanted sha256:

1. the Hugging Face cache's blob stores, ``<HF_HUB_CACHE>/<repo folder>/blobs/<sha256>`` (an
   LFS blob is named by its sha256): the base of a variant is usually there, whichever way it
   was downloaded;
2. the directories given with ``--reuse DIR``: every regular file of a wanted size, hashed.

A name is only a claim: a match is linked (reflink, else hardlink, else copy) into the staging
directory and hashed there (a file this user does not own is reflinked or copied, never
hard-linked: its owner's later edits would change the pulled variant); a file whose bytes do
not have the sha256 is removed and downloaded instead. Pull then checks the reused files
against the hub's digests and the manifest like every downloaded one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import PatchError
from ...fsops import link_or_copy
from ...integrity.digests.hashing import hash_files, sha256_file
from ...names import checked_digest, checked_name

log = logging.getLogger("modelpatch")


@dataclass
class Reuse:
    """``linked``: ``{path: (source, size)}`` placed in the staging directory and verified."""

    linked: dict[str, tuple[Path, int]] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)     # a source whose bytes did not match

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.linked.values())


def cache_blob_dirs() -> list[Path]:
    """The ``blobs`` directories of the Hugging Face cache (``HF_HUB_CACHE``)."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE)
    try:
        folders = sorted(root.iterdir())
    except OSError:
        return []
    return [f / "blobs" for f in folders if (f / "blobs").is_dir()]


def find_local(wanted: dict[str, tuple[str, int]], reuse_dirs: list[Path]) -> dict[str, Path]:
    """For the sha256 of ``wanted`` (``{path: (sha256, size)}``), a local file claimed or found
    to hold it: ``{sha256: file}``."""
    sizes = {checked_digest(sha, what="the hub's LFS sha256", lengths=(64,)): size
             for sha, size in wanted.values()}
    found: dict[str, Path] = {}
    blob_dirs = cache_blob_dirs()
    for sha, size in sizes.items():
        for blobs in blob_dirs:
            candidate = blobs / sha
            if _size(candidate) == size:
                found[sha] = candidate
                break
    missing = {size for sha, size in sizes.items() if sha not in found}
    if missing:
        by_size = [p for d in reuse_dirs for p in _files(d) if _size(p) in missing]
        for path, sha in _hash_readable(by_size).items():
            if sha in sizes and sha not in found:
                found[sha] = path
    return found


def _hash_readable(paths: list[Path]) -> dict[Path, str]:
    """sha256 of ``paths`` (in parallel); a file that cannot be read is left out, with a
    warning, rather than failing the pull: it was only a candidate."""
    try:
        return hash_files(paths) if paths else {}
    except (OSError, PatchError):
        pass
    out = {}
    for path in paths:
        try:
            out[path] = sha256_file(path)
        except (OSError, PatchError) as exc:
            log.warning("pull: cannot read %s to compare it (%s): not reused", path,
                        getattr(exc, "strerror", None) or exc)
    return out


def link_into(staging: Path, wanted: dict[str, tuple[str, int]], found: dict[str, Path]) -> Reuse:
    """Link each wanted file a local match exists for into ``staging``; keep it only if its
    bytes hash to the wanted sha256."""
    for rel in wanted:      # every name checked before the first link is made
        checked_name(rel, what="the hub's file listing entry", allow_dot_dirs=True)
    reuse = Reuse()
    for rel, (sha, size) in sorted(wanted.items()):
        source = found.get(sha)
        if source is None:
            continue
        dest = staging / rel
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            _link_own_or_copy(source, dest)
        except OSError as exc:
            log.warning("pull: cannot reuse %s (%s): downloading %s", source,
                        exc.strerror or exc, rel)
            continue
        if sha256_file(dest) != sha:
            dest.unlink()
            reuse.rejected.append(str(source))
            log.warning("pull: %s does not hold the bytes of %s (another sha256): downloading it",
                        source, rel)
            continue
        reuse.linked[rel] = (source, size)
    return reuse


def _link_own_or_copy(source: Path, dest: Path) -> None:
    """``link_or_copy``, except that an inode this user does not own is never shared by a hard
    link: the inode actually linked is checked, then replaced by a copy."""
    if link_or_copy(source, dest) == "hardlink" and os.stat(dest).st_uid != os.getuid():
        os.unlink(dest)
        link_or_copy(source, dest, mode="copy")


def _size(path: Path) -> int | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size if os.path.isfile(path) else None


def _files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".modelpatch")]
        out += [Path(dirpath) / name for name in filenames]
    return out
