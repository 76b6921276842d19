"""Which other paths share a modified file's inode: a hardlinked variant and its base are the same
file, so an edit of one is an edit of the other, and ``verify`` says where the twin is.

A variant knows its base (the path its patch records keep). A base does not know its variants,
so modelpatch remembers them: every apply that hardlinked a file appends one line, ``{"base",
"variant"}``, to ``variants.log`` beside the digest cache (``$MODELPATCH_CACHE_DIR``, else
``~/.cache/modelpatch``; up to 4 MiB, some 25,000 applies, then no more). Directories beside
the base named ``<base>-*`` (the default output) are looked at too, so variants written before
that log existed are found when they sit there.
A path is reported only if it shares the inode now; a file whose other hardlinks lie elsewhere
is reported with their count only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..fsops import read_capped
from .digests.digest_cache import default_cache_path

REGISTRY_NAME = "variants.log"
MAX_REGISTRY_BYTES = 4 << 20


def registry_path() -> Path:
    return default_cache_path().parent / REGISTRY_NAME


def remember_variant(base: Path, variant: Path) -> None:
    """Note that ``variant`` hardlinks files of ``base`` (best effort: a log that cannot be
    written only makes a later ``verify`` of the base less specific)."""
    line = json.dumps({"base": os.path.realpath(base), "variant": os.path.abspath(variant)})
    try:
        path = registry_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > MAX_REGISTRY_BYTES:
            return
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "ab", buffering=0) as f:        # one appending write: whole lines
            f.write((line + "\n").encode("utf-8"))
    except (OSError, RuntimeError, KeyError):
        pass


def _registered_variants(base: Path) -> list[Path]:
    try:
        data = read_capped(registry_path(), MAX_REGISTRY_BYTES)
    except (OSError, RuntimeError, KeyError):
        return []
    real, found = os.path.realpath(base), []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("base") == real \
                and isinstance(entry.get("variant"), str):
            found.append(Path(entry["variant"]))
    return found


def _recorded_bases(root: Path) -> list[Path]:
    from ..errors import PatchError
    from .patch_record import patch_dirs, read_record

    bases = []
    for patch in patch_dirs(root):
        try:
            base_path = read_record(patch).base_path
        except (PatchError, OSError):
            continue
        if base_path:
            bases.append(Path(base_path))
    return bases


def _candidates(root: Path) -> list[Path]:
    """Directories that may hold hardlinks of ``root``'s files: its bases and their registered
    variants, its own registered variants and ``<root>-*`` beside it."""
    siblings = []
    try:
        siblings = [p for p in root.parent.glob(f"{root.name}-*") if p.is_dir()]
    except OSError:
        pass
    real = os.path.realpath(root)
    seen, out = set(), []
    bases = _recorded_bases(root)
    for path in [*bases, *(v for b in bases for v in _registered_variants(b)),
                 *_registered_variants(root), *sorted(siblings)]:
        key = os.path.realpath(path)
        if key != real and key not in seen:
            seen.add(key)
            out.append(path)
    return out


def _same_file_paths(directory: Path, rel: str) -> list[Path]:
    """Where ``directory`` may hold file ``rel``: itself, and kept as an original for revert."""
    return [directory / rel, *sorted(directory.glob(f".modelpatch/patches/*/originals/{rel}"))]


def shared_with(root: Path, rels: list[str], listing: dict) -> dict[str, tuple[str, ...]]:
    """``{rel: (other paths sharing its inode, or "N other hardlinks")}`` for each of ``rels``
    (modified files of ``root``, ``listing`` their status) that has other hardlinks."""
    linked = [r for r in rels if listing.get(r) is not None and listing[r].st_nlink > 1]
    if not linked:
        return {}
    candidates = _candidates(root)
    out = {}
    for rel in linked:
        st = listing[rel]
        twins = []
        for directory in candidates:
            for path in _same_file_paths(directory, rel):
                try:
                    other = os.stat(path)
                except OSError:
                    continue
                if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                    twins.append(str(path))
        unknown = st.st_nlink - 1 - len(twins)
        out[rel] = tuple(twins) + ((f"{unknown} other hardlink{'s' if unknown > 1 else ''}",)
                                   if unknown > 0 else ())
    return out
