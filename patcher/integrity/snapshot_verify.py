"""``verify`` of a Hugging Face cache snapshot that has no modelpatch manifest: each file is
checked against the name of the blob its symlink points at, which the Hub chose for its content
(the sha256 for an LFS file, the git blob sha1 for another). A file that is not a link to a blob
of the repository is reported as extra; which files the snapshot should hold is not known here,
so none can be reported missing.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path
from typing import Callable

from ..errors import OperationFailed
from .digests.digest_cache import DigestCache, KnownDigests

_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")
AGAINST = "their Hugging Face blob names"


def blob_claim(path: Path) -> tuple[str, str] | None:
    """(``"sha256"`` or ``"git blob sha1"``, hex) that the blob name behind the snapshot symlink
    ``path`` claims, or None if ``path`` is not a link to a blob of a hub cache repository."""
    try:
        target = os.readlink(path)
    except (OSError, ValueError):
        return None
    blob = os.path.normpath(os.path.join(os.path.realpath(path.parent), target))
    if os.path.basename(os.path.dirname(blob)) != "blobs":
        return None
    name = os.path.basename(blob)
    if _SHA256.fullmatch(name):
        return "sha256", name
    if _SHA1.fullmatch(name):
        return "git blob sha1", name
    return None


def git_blob_sha1(path: Path, on_progress: Callable[[int], None] | None = None) -> str:
    """The git blob id of the file at ``path`` (``huggingface_hub.utils.sha.git_hash`` of its
    bytes), read in chunks: a file the Hub stores as a regular one may still be of any size."""
    size = os.stat(path).st_size
    digest = hashlib.sha1(b"blob %d\0" % size)
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
                if on_progress is not None:
                    on_progress(len(chunk))
    except OSError as exc:
        raise OperationFailed(f"cannot read: {exc.strerror or exc}", where=path) from exc
    return digest.hexdigest()


def verify_snapshot(root: Path, listing: dict, *, jobs: int | None = None,
                    on_progress: Callable[[int], None] | None = None,
                    on_total: Callable[[int], None] | None = None):
    """A ``VerifyReport`` of the snapshot ``root`` (``listing``: ``verify.list_files``)."""
    from .digests.hashing import hash_files_stat
    from .verify import Mismatch, VerifyReport

    claims = {rel: blob_claim(root / rel) for rel, st in listing.items() if st is not None}
    claims = {rel: claim for rel, claim in claims.items() if claim is not None}
    extra = sorted(set(listing) - set(claims))
    if on_total is not None:
        on_total(sum(listing[rel].st_size for rel in claims))
    lfs = [rel for rel, (kind, _) in claims.items() if kind == "sha256"]
    observed = time.time_ns()
    results = hash_files_stat([root / rel for rel in lfs], jobs=jobs, on_progress=on_progress)
    KnownDigests(DigestCache(), use_hf_blob_names=False).record_results(
        results.values(), observed_ns=observed)
    actual = {rel: results[root / rel].sha256 for rel in lfs}
    actual.update({rel: git_blob_sha1(root / rel, on_progress)
                   for rel, (kind, _) in claims.items() if kind != "sha256"})
    modified = [Mismatch(rel, claims[rel][1], listing[rel].st_size, actual[rel],
                         listing[rel].st_size, digest=claims[rel][0])
                for rel in sorted(claims) if actual[rel] != claims[rel][1]]
    return VerifyReport(modified=modified, extra=extra, checked=len(claims),
                        hashed_files=len(claims),
                        hashed_bytes=sum(listing[rel].st_size for rel in claims),
                        against=AGAINST)
