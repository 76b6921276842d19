"""A variant as a revision of the Hugging Face cache repository its base snapshot lives in.

The cache keeps a repository as ``blobs/`` (one file per content: LFS files named by their
sha256, other files by their git blob id), ``snapshots/<commit>/`` (the files of one revision,
each a relative symlink to its blob) and ``refs/<name>`` (a revision name, holding its commit).
``commit_into_cache`` turns a finished, verified variant directory into one more revision:

- a file whose bytes equal the base's file of the same path links to the base's own blob, so
  the unchanged shards of a 540 GB model cost nothing;
- every other file is moved into ``blobs/`` under the name the cache would give it (an existing
  blob of that name is the same content, and is reused);
- the snapshot is built beside the cache and renamed into ``snapshots/<commit>`` whole, and only
  then is ``refs/<name>`` written (atomically), so a loader never sees half a revision.

``<commit>`` is the sha1 of the variant's provenance manifest: 40 hex digits like a git commit,
and different for every variant. ``huggingface_hub``'s loaders then resolve the revision name
offline (``snapshot_download(repo, revision=NAME, local_files_only=True)``,
``from_pretrained(repo, revision=NAME)``), ``hf cache`` lists it, and deleting it there leaves the
base's blobs to the base.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ..errors import InputError
from ..fsops import fsync_dir, replace_file
from ..integrity.manifest import MANIFEST_NAME, read_manifest
from ..model.model_dir import hf_cache_repo
from ..names import checked_revision

#: Suffixes the hub stores through LFS by default (its default ``.gitattributes``); a file with
#: one of them, or of ``LFS_SIZE`` bytes or more, is named by its sha256 in ``blobs/``.
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
                ".onnx", ".model", ".npy", ".npz", ".pkl", ".pickle", ".tflite", ".ot", ".zip",
                ".gz", ".tar", ".arrow", ".parquet")
LFS_SIZE = 10 * 1024 * 1024


def cache_repository(snapshot: str | os.PathLike) -> Path:
    """The ``models--ORG--NAME`` directory of the cache snapshot ``snapshot``; an InputError
    when ``snapshot`` is not one."""
    repo = hf_cache_repo(Path(snapshot))
    if repo is None:
        raise InputError("--into-cache needs the model as a Hugging Face cache snapshot "
                         "(.../models--ORG--NAME/snapshots/COMMIT) or hf://ORG/NAME",
                         where=str(snapshot))
    return repo


def ref_path(repo: Path, name: str, *, force: bool) -> Path:
    """``refs/<name>`` of ``repo``, checked: a revision name (``patcher.names``), and not an
    existing ref unless ``force``."""
    ref = repo / "refs" / checked_revision(name, what="--into-cache name")
    if ref.exists() and not force:
        raise InputError(f"the cache already has a revision {name!r}", where=str(ref),
                         hint="pass --force to point it at the new variant, or choose another "
                              "name")
    return ref


def git_blob_id(path: Path) -> str:
    """The git blob id of a file (sha1 of ``blob <size>\\0`` and its bytes): the name the cache
    gives a file the hub keeps in git, not LFS."""
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _blob_name(path: Path, relpath: str, sha256: str | None, base_blob: Path | None) -> str:
    """The cache's name for the file at ``path``: as the base names its file of that path, else
    by the hub's LFS rule."""
    lfs = (len(base_blob.name) == 64 if base_blob is not None
           else relpath.endswith(LFS_SUFFIXES) or path.stat().st_size >= LFS_SIZE)
    if not lfs:
        return git_blob_id(path)
    if sha256 is None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        sha256 = digest.hexdigest()
    return sha256


def _base_blob(base: Path, relpath: str, blobs: Path) -> Path | None:
    """The blob the base snapshot's file ``relpath`` links to, if it is one of ``blobs``."""
    entry = base / relpath
    if not entry.is_symlink():
        return None
    real = Path(os.path.realpath(entry))
    return real if real.parent == blobs and real.is_file() else None


def commit_into_cache(variant: Path, base: Path, ref: Path) -> Path:
    """Make the verified variant directory ``variant`` (on the cache's file system) the revision
    ``ref`` (``refs/<name>``) of the cache repository of the snapshot ``base``; returns the new
    snapshot. ``variant`` is consumed: its files become blobs or are dropped as duplicates."""
    repo = cache_repository(base)
    blobs, snapshots = repo / "blobs", repo / "snapshots"
    manifest = read_manifest(variant)
    commit = hashlib.sha1((variant / MANIFEST_NAME).read_bytes()).hexdigest()
    final = snapshots / commit
    staged = variant.parent / f"snapshot-{commit}"
    added: list[Path] = []
    made_snapshot = False
    try:
        for path in sorted(p for p in variant.rglob("*") if p.is_file() or p.is_symlink()):
            relpath = path.relative_to(variant).as_posix()
            base_blob = _base_blob(base, relpath, blobs)
            subject = manifest.subjects.get(relpath)
            base_file = manifest.base_files.get(relpath)
            if (base_blob is not None and subject is not None and base_file is not None
                    and subject[0] == base_file[0]):
                blob = base_blob
            else:
                blob = blobs / _blob_name(path, relpath, subject[0] if subject else None,
                                          base_blob)
                if not blob.exists():
                    os.chmod(path, 0o644)
                    os.rename(path, blob)
                    added.append(blob)
            link = staged / relpath
            link.parent.mkdir(parents=True, exist_ok=True)
            depth = len(Path(relpath).parts) + 1        # snapshots/<commit>/<relpath>
            os.symlink(os.path.join(*[".."] * depth, "blobs", blob.name), link)
        fsync_dir(blobs)
        if final.exists():      # the same manifest committed before: the same revision
            shutil.rmtree(staged)
        else:
            os.rename(staged, final)
            made_snapshot = True
            fsync_dir(snapshots)
        ref.parent.mkdir(parents=True, exist_ok=True)
        replace_file(ref, commit.encode(), mode=0o644)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        if made_snapshot:
            shutil.rmtree(final, ignore_errors=True)
        for blob in added:
            blob.unlink(missing_ok=True)
        raise
    return final
