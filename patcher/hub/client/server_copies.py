"""Which files of a variant ``publish`` copies server-side from its base repository, and which it
uploads.

A variant's unchanged files are byte-identical to files of its base. When the base came from a
hub repository, the hub already has them: ``publish`` then commits a cross-repository
``CommitOperationCopy`` (the hub duplicates the LFS object, no bytes travel) instead of an upload.

Where the base repository and revision come from (``base_source``), in order:

1. the base directory was a Hugging Face cache snapshot ``models--ORG--NAME/snapshots/<commit>``
   (also what ``apply hf://ORG/NAME`` resolves to): that repository at that commit;
2. the base was a variant ``pull`` fetched: the repository and commit ``pull`` recorded in it;
3. the base's hub repository is known otherwise (``--base-model`` given to ``apply`` and recorded
   in the manifest, or to ``publish``; a base that is itself a variant): that repository at the
   commit a ``--local-dir`` download of the base records, else at ``main``.

Nothing is trusted by name: before copying, the base repository's file at that revision must be
an LFS file with the sha256 the variant's manifest records (``paths-info``). Each file that
fails this, and every file when the token cannot read the base repository, is uploaded
instead, and the plan says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ...model.base_identity import from_cache_path, local_dir_commit
from ...units import human_bytes, plural
from .pull import read_pulled_source
from .xet_upload import XetSent

PATHS_INFO_BATCH = 500                 # what huggingface_hub itself asks for at a time


@dataclass(frozen=True)
class BaseSource:
    repo_id: str
    revision: str
    found_by: str


@dataclass
class TransferPlan:
    """Per file: ``copies`` ``{path_in_repo: (src_path, size)}`` and ``uploads``
    ``{path_in_repo: size}``; ``notes``: why files that could have been copied are uploaded."""

    source: BaseSource | None = None
    commit: str | None = None            # the base revision, resolved to its commit
    copies: dict[str, tuple[str, int]] = field(default_factory=dict)
    uploads: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    transport: str = "lfs"               # how uploads travel: "xet" or "lfs"
    xet: XetSent | None = None           # what the uploads through Xet sent

    @property
    def copy_bytes(self) -> int:
        return sum(size for _, size in self.copies.values())

    @property
    def upload_bytes(self) -> int:
        return sum(self.uploads.values())

    def summary(self) -> str:
        where = (f" from {self.source.repo_id}@{(self.commit or self.source.revision)[:12]}"
                 if self.copies and self.source else "")
        line = (f"{plural(len(self.copies), 'file')} ({human_bytes(self.copy_bytes)}) copied "
                f"server-side{where}, {plural(len(self.uploads), 'file')} "
                f"({human_bytes(self.upload_bytes)}) uploaded")
        if self.xet is not None and self.xet.files:
            return f"{line}; {self.xet.summary()}"
        return line + (" over Git LFS" if self.uploads else "")

    def upload_all(self, note: str) -> None:
        for path, (_, size) in self.copies.items():
            self.uploads[path] = size
        self.copies.clear()
        self.notes.append(note)


def base_source(base: str, base_model: str | None) -> BaseSource | None:
    """The hub repository and revision the variant's original base (at path ``base``) came
    from, if known; ``base_model``: its hub repository as the manifest or the user says."""
    repo_id = from_cache_path(base)
    if repo_id:
        return BaseSource(repo_id, os.path.basename(os.path.realpath(base)),
                          "the Hugging Face cache snapshot it was made from")
    pulled = read_pulled_source(Path(base))
    if pulled is not None:
        return BaseSource(pulled[0], pulled[1], "the repository it was pulled from")
    if base_model:
        commit = local_dir_commit(Path(base)) if os.path.isdir(base) else None
        return BaseSource(base_model, commit or "main", "the base_model")
    return None


def plan_transfer(api, manifest, base: str, base_model: str | None,
                  names: dict[str, str]) -> TransferPlan:
    """The plan for the variant's files (``names``: local path -> path in the repository)."""
    plan = TransferPlan(source=base_source(base, base_model))
    by_sha = {sha: rel for rel, (sha, _) in sorted(manifest.base_files.items())}
    for rel, (sha, size) in manifest.subjects.items():
        if sha in by_sha and size > 0 and plan.source is not None:
            plan.copies[names[rel]] = (by_sha[sha], size)
        else:
            plan.uploads[names[rel]] = size
    if not plan.copies:
        return plan
    _check_against_hub(api, manifest, names, plan)
    return plan


def _check_against_hub(api, manifest, names: dict[str, str], plan: TransferPlan) -> None:
    """Keep as copies only the files the base repository holds, as LFS, with the manifest's
    sha256; the others, and all when the repository cannot be read, become uploads."""
    from huggingface_hub.errors import HfHubHTTPError

    source = plan.source
    if source is None:
        raise ValueError("checking server-side copies needs the transfer plan's source")
    try:
        plan.commit = api.model_info(source.repo_id, revision=source.revision).sha
        found = {}
        wanted = sorted({src for src, _ in plan.copies.values()})
        for start in range(0, len(wanted), PATHS_INFO_BATCH):
            for entry in api.get_paths_info(source.repo_id, wanted[start:start + PATHS_INFO_BATCH],
                                            revision=plan.commit):
                found[entry.path] = entry
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        plan.upload_all(f"cannot read the base repository {source.repo_id}@{source.revision} "
                        f"with this token (HTTP {status}): uploading its files instead")
        return
    expected = {names[rel]: sha for rel, (sha, _) in manifest.subjects.items()}
    for path, (src, size) in list(plan.copies.items()):
        entry = found.get(src)
        lfs = getattr(entry, "lfs", None)
        if lfs is not None and lfs.sha256 == expected[path]:
            continue
        del plan.copies[path]
        plan.uploads[path] = size
        if entry is None:
            plan.notes.append(f"{src} is not in {source.repo_id}@{plan.commit[:12]}: "
                              f"uploading {path}")
        elif lfs is not None:
            plan.notes.append(f"{src} has another sha256 in {source.repo_id}@{plan.commit[:12]} "
                              f"than the manifest records: uploading {path}")
        # a regular (non-LFS) file travels inside the commit anyway: nothing to copy, no note
