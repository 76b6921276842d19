"""Check a variant directory against its provenance manifest.

Like huggingface_hub's ``verify_maps``, every mismatch is reported at once: modified files
(wrong size, wrong sha256, or not a regular file), missing files and extra files. Sizes are
compared first; a file of the wrong size is reported without being hashed.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import faults
from ..errors import InputError, OperationFailed, VerifyMismatch
from ..units import plural
from .digests.digest_cache import DigestCache, KnownDigests
from .digests.hashing import hash_files_stat
from .manifest import MANIFEST_NAME, read_manifest

__all__ = ["Mismatch", "VerifyReport", "compare_maps", "list_files", "verify_dir"]


@dataclass(frozen=True)
class Mismatch:
    """A file that is present but differs from the manifest.

    ``actual_size`` is None for an entry that is not a regular file (a directory, a dangling or
    looping symlink, a FIFO); ``actual_sha256`` is None when the file was not hashed (its size
    already differs, or it is not a regular file).
    """

    path: str
    expected_sha256: str
    expected_size: int
    actual_sha256: str | None
    actual_size: int | None
    digest: str = "sha256"
    """What ``expected_sha256`` holds: a sha256, or (a snapshot's blob name) a git blob sha1."""
    shared_with: tuple[str, ...] = ()
    """Other paths that are this same file (hardlinks): they changed with it
    (``patcher.integrity.shared_inodes``)."""

    @property
    def reason(self) -> str:
        if self.actual_size is None:
            return "not a regular file inside the directory"
        if self.actual_size != self.expected_size:
            return f"size {self.actual_size} != {self.expected_size}"
        if self.actual_sha256 is None:
            return "not hashed"
        return f"{self.digest} differs"


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of a verification. ``ok`` when nothing is modified, missing or extra, and the
    manifest itself is intact (``manifest_problems``)."""

    modified: list[Mismatch] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    manifest_problems: list[str] = field(default_factory=list)
    layout_problems: list[str] = field(default_factory=list)
    """``path: why`` for a file whose bytes match but whose layout readers read otherwise (a
    GGUF file: ``patcher.gguf.readback.layout_problem``)."""
    checked: int = 0
    """Manifest entries compared."""
    hashed_files: int = 0
    hashed_bytes: int = 0
    cached_files: int = 0
    """Files whose digest came from the digest cache (fast mode)."""
    against: str = "the manifest"
    """What the files were checked against (a snapshot without a manifest: its blob names)."""

    @property
    def ok(self) -> bool:
        return not (self.modified or self.missing or self.extra or self.manifest_problems
                    or self.layout_problems)

    def summary(self) -> str:
        """One line: ``2 modified, 1 missing, 0 extra (first: model.safetensors: sha256 differs)``.
        """
        if self.ok:
            return f"{plural(self.checked, 'file')} match" + ("es" if self.checked == 1 else "")
        if self.manifest_problems:
            return f"{MANIFEST_NAME}: {self.manifest_problems[0]}"
        if self.layout_problems and not (self.modified or self.missing or self.extra):
            return self.layout_problems[0]
        first = (f"{self.modified[0].path}: {self.modified[0].reason}" if self.modified
                 else f"{self.missing[0]}: missing" if self.missing
                 else f"{self.extra[0]}: not in the manifest")
        return (f"{len(self.modified)} modified, {len(self.missing)} missing, "
                f"{len(self.extra)} extra (first: {first})")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for ``verify --json``."""
        return {
            "ok": self.ok,
            "checked": self.checked,
            "modified": [dict(asdict(m), reason=m.reason) for m in self.modified],
            "missing": list(self.missing),
            "extra": list(self.extra),
            "manifest_problems": list(self.manifest_problems),
            "layout_problems": list(self.layout_problems),
            "hashed_files": self.hashed_files,
            "hashed_bytes": self.hashed_bytes,
            "cached_files": self.cached_files,
            "against": self.against,
        }

    def raise_for_mismatch(self, where: str | os.PathLike | None = None) -> None:
        """Raise :class:`VerifyMismatch` (exit code 1) with :meth:`summary` unless ``ok``."""
        if not self.ok:
            raise VerifyMismatch(self.summary(), where=where)


def _cached_or_to_hash(root: Path, expected: Mapping, listing: Mapping,
                       known: KnownDigests | None) -> tuple[dict[str, str], list[str]]:
    """Digests taken from verified cache rows (``known``, in fast mode), and the files left to
    hash. A missing file, or one of the wrong size, needs no hashing: it is already a mismatch."""
    digests: dict[str, str] = {}
    to_hash: list[str] = []
    for path, entry in expected.items():
        st = listing.get(path)
        if st is None or st.st_size != entry[1]:
            continue
        hit = known.lookup(root / path, st=st, require_verified=True) if known else None
        if hit is not None:
            digests[path] = hit.sha256
        else:
            to_hash.append(path)
    return digests, to_hash


def compare_maps(expected: Mapping[str, tuple[str, int]], actual_files: set[str] | Any,
                 actual_digests: Mapping[str, str],
                 actual_sizes: Mapping[str, int | None] | None = None) -> VerifyReport:
    """Compare a manifest's ``{path: (sha256, size)}`` with what a directory holds. Pure.

    Args:
        expected: the manifest's entries.
        actual_files: every path present (including entries that are not regular files).
        actual_digests: sha256 of the present files that were hashed.
        actual_sizes: sizes of the present files; None for an entry that is not a regular file.
            When given, a size difference is "modified" whatever the digest says.

    A present, expected file is modified if its size differs, if it has no size (not a regular
    file), if its sha256 differs, or if it was not hashed at all. Results are sorted by path.
    """
    present = set(actual_files)
    missing = sorted(set(expected) - present)
    extra = sorted(present - set(expected))
    modified: list[Mismatch] = []
    both = sorted(present & set(expected))
    for path in both:
        exp_sha, exp_size = expected[path]
        size = actual_sizes.get(path) if actual_sizes is not None else exp_size
        sha = actual_digests.get(path)
        if size is None or size != exp_size or sha != exp_sha:
            modified.append(Mismatch(path, exp_sha, exp_size,
                                     sha if size == exp_size else None, size))
    return VerifyReport(modified=modified, missing=missing, extra=extra, checked=len(expected))


def list_files(directory: str | os.PathLike) -> dict[str, os.stat_result | None]:
    """Every file of ``directory`` as ``{relative POSIX path: os.stat of its content}``.

    Symlinks are followed to what they point at and valued by the target's status, if it lies
    inside the directory (or, for a Hugging Face cache snapshot, inside its repository's folder,
    where its ``blobs/`` are); symlinked directories are not descended into. Entries that are not,
    or do not lead to, a regular file there (dangling symlinks, links out of the directory, FIFOs,
    symlinked directories) map to None. What ``is_model_path`` leaves out (the manifest,
    ``.modelpatch/``, ``.git``, ``.cache/``) is not listed.
    """
    from ..model.layout import cache_link_targets, is_model_path

    root = os.fspath(directory)
    out: dict[str, os.stat_result | None] = {}
    allowed = [os.path.realpath(root)] + cache_link_targets(Path(root))

    def inside(path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == a or real.startswith(a + os.sep) for a in allowed)

    def walk(dirpath: str, prefix: str) -> None:
        with os.scandir(dirpath) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = prefix + entry.name
            if prefix == "" and not is_model_path(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                walk(entry.path, rel + "/")
                continue
            try:
                st = os.stat(entry.path)  # follows symlinks
            except OSError:
                st = None  # dangling or looping symlink
            if st is not None and entry.is_symlink() and not inside(entry.path):
                st = None
            out[rel] = st if st is not None and stat.S_ISREG(st.st_mode) else None

    try:
        walk(root, "")
    except OSError as exc:
        raise OperationFailed(f"cannot list: {exc.strerror or exc}",
                              where=exc.filename or root) from exc
    return out


def verify_dir(directory: str | os.PathLike, *, jobs: int | None = None, fast: bool = False,
               on_progress: Callable[[int], None] | None = None,
               cache: DigestCache | None = None,
               on_total: Callable[[int], None] | None = None) -> VerifyReport:
    """Verify ``directory`` against its ``modelpatch.provenance.json`` (a Hugging Face cache
    snapshot without one: against its blob names, ``patcher.integrity.snapshot_verify``). A modified
    file
    that other paths hardlink names them (``patcher.integrity.shared_inodes``).

    Every present file whose size matches is rehashed in parallel (``jobs`` threads). With
    ``fast``, a file whose (device, inode, size, mtime_ns, ctime_ns) matches a *verified* row
    is not rehashed; rows taken on trust and Hugging Face blob names are never used. Every digest
    computed here is recorded in the cache as verified (it was computed from the bytes), so a
    passing full verification makes the next ``--fast`` one nearly free.

    Args:
        directory: a variant directory.
        jobs: hashing threads (default: the CPUs available).
        fast: trust verified digest-cache rows.
        on_progress: called with byte counts as files are hashed (from worker threads).
        on_total: called once, before hashing, with the bytes to hash.
        cache: the digest cache (default: the user's).

    Returns:
        A :class:`VerifyReport`; call ``raise_for_mismatch()`` to turn a mismatch into exit code 1.

    Raises:
        InputError: ``directory`` is not a directory, or its manifest is missing or invalid.
        OperationFailed: a file cannot be read.
    """
    root = Path(directory)
    if not root.is_dir():
        raise InputError("not a directory", where=root)
    if not os.path.lexists(root / MANIFEST_NAME) and _is_snapshot(root):
        from .snapshot_verify import verify_snapshot

        listing = list_files(root)
        report = verify_snapshot(root, listing, jobs=jobs, on_progress=on_progress,
                                 on_total=on_total)
        return _with_shared_inodes(root, report, listing)
    manifest = read_manifest(root)
    expected = manifest.subjects
    listing = list_files(root)
    known = KnownDigests(cache if cache is not None else DigestCache(), use_hf_blob_names=False)

    sizes = {p: (st.st_size if st is not None else None) for p, st in listing.items()}
    digests, to_hash = _cached_or_to_hash(root, expected, listing, known if fast else None)
    cached = len(digests)

    faults.point("verify:hashing")
    if on_total is not None:
        on_total(sum(listing[p].st_size for p in to_hash))
    observed = time.time_ns()
    results = hash_files_stat([root / p for p in to_hash], jobs=jobs, on_progress=on_progress)
    for path in to_hash:
        result = results[root / path]
        digests[path] = result.sha256
    known.record_results(results.values(), observed_ns=observed)

    report = compare_maps(expected, listing.keys(), digests, sizes)
    return _with_shared_inodes(root, listing=listing, report=VerifyReport(
                        modified=report.modified, missing=report.missing, extra=report.extra,
                        manifest_problems=manifest_problems(root, manifest),
                        checked=report.checked, hashed_files=len(results),
                        hashed_bytes=sum(r.size for r in results.values()), cached_files=cached))


def _is_snapshot(root: Path) -> bool:
    from ..model.layout import hf_cache_repo

    return hf_cache_repo(root) is not None


def _with_shared_inodes(root: Path, report: VerifyReport, listing: Mapping) -> VerifyReport:
    from dataclasses import replace

    from .shared_inodes import shared_with

    twins = shared_with(root, [m.path for m in report.modified], dict(listing))
    if not twins:
        return report
    return replace(report, modified=[replace(m, shared_with=twins.get(m.path, ()))
                                     for m in report.modified])


def manifest_problems(root: Path, manifest) -> list[str]:
    """What shows that the manifest itself was changed after modelpatch wrote it: digests inside
    it that no longer match what they describe, or a digest other than the one the last patch
    record (under ``.modelpatch/``) noted for it. (Without a signature a consistent forgery of
    both cannot be told; an edit of either can.) The change log's digest is checked even when the
    record's note matches: an edit of the manifest and of the note together is still an edit of
    the log that its digest tells."""
    import hashlib

    from .manifest import canonical_json
    from .patch_record import patch_dirs, read_record

    problems = []
    recipe = manifest.recipe
    text = recipe.get("text")
    if isinstance(text, str) and hashlib.sha256(
            text.encode("utf-8", "surrogatepass")).hexdigest() != recipe.get("sha256"):
        problems.append("the recipe text does not match the recipe sha256 recorded beside it")
    for item in manifest.predicate.get("runDetails", {}).get("byproducts", []):
        digest = (item.get("digest") or {}).get("sha256")
        changes = (item.get("annotations") or {}).get("changes")
        if digest and changes is not None and \
                hashlib.sha256(canonical_json(changes)).hexdigest() != digest:
            problems.append(f"the change log does not match its digest ({item.get('name')})")
    dirs = patch_dirs(root)
    if dirs:
        noted = read_record(dirs[-1]).manifest_sha256
        if noted is not None and noted != manifest.sha256:
            problems.append(f"sha256 {manifest.sha256[:12]}... differs from the "
                            f"{noted[:12]}... that patch {dirs[-1].name} wrote")
    return problems
