"""The names a model directory's layout is made of: the shard index, the provenance manifest,
the signature, the revert data's folder, the bookkeeping folders every listing skips.

Constants and two path rules only (``is_model_path``, ``hf_cache_repo``), so that the paths that
need the names (the journal, the manifest, verify, signing) do not import the header readers of
``model_dir``, which re-exports them."""

from __future__ import annotations

import os
from pathlib import Path

INDEX_NAME = "model.safetensors.index.json"
SINGLE_SHARD_NAME = "model.safetensors"
MANIFEST_NAME = "modelpatch.provenance.json"
# The OMS signature of the directory (``patcher.signing``): over the files, not one of them. A
# variant never carries its base's (it would not match the variant's files); the revert data
# keeps it.
SIGNATURE_NAME = "model.sig"
#: The digest record ``publish --base`` commits beside a base on a hub: the hub repository's,
#: never the model's (``pull`` sets it aside; a hub model is read and downloaded without it).
BASE_RECORD = "modelpatch.base.json"
STATE_DIR = ".modelpatch"
# Bookkeeping, not model content: our revert data, git (a directory, or the file a worktree or
# submodule has), and the huggingface_hub local-dir download cache. One rule for every command:
# see ``is_model_path``.
SKIPPED_DIRS = frozenset({STATE_DIR, ".git", ".cache"})


def is_model_path(relpath: str) -> bool:
    """Whether ``relpath`` (POSIX, relative to the model root) can belong to the model: not the
    manifest nor the signature, nothing under ``SKIPPED_DIRS``. Verify, manifests, revert and
    publish use it; the model listing skips the same directories (and keeps the manifest and
    the signature, as provenance)."""
    return (relpath not in (MANIFEST_NAME, SIGNATURE_NAME)
            and relpath.split("/", 1)[0] not in SKIPPED_DIRS)


def hf_cache_repo(root: Path) -> Path | None:
    """The ``models--org--name`` directory when ``root`` is a hub cache snapshot."""
    real = Path(os.path.realpath(root))
    if real.parent.name == "snapshots" and "--" in real.parent.parent.name:
        return real.parent.parent
    return None


#: huggingface_hub 2.x keeps files downloaded through Xet once per cache, in ``blobs/`` beside
#: the repository folders, marked by this file; a repository's ``blobs/<etag>`` links there.
SHARED_BLOBS_MARKER = ".huggingface-shared-blobs"


def cache_link_targets(root: Path) -> list[str]:
    """Where the symlinks of a hub cache snapshot ``root`` may lead, besides ``root``: its
    repository's folder, and the cache's shared blob store when huggingface_hub made one;
    nothing for another directory."""
    repo = hf_cache_repo(root)
    if repo is None:
        return []
    shared = repo.parent / "blobs"
    return [str(repo)] + ([str(shared)] if (shared / SHARED_BLOBS_MARKER).is_file() else [])
