"""Publishing variants to a hub and pulling them back, verified, with huggingface_hub.

``publish`` verifies the variant against its provenance manifest, creates the repository (private
by default) and uploads the variant in one commit, without the revert data under ``.modelpatch/``,
with a model card naming the base and the recipe. ``pull`` downloads into a staging directory,
checks every file against the hub's own digests (LFS sha256, git blob sha1) and the provenance
manifest, and only then renames it into place.

The token comes from ``HF_TOKEN`` or huggingface_hub's login and is only ever handed to the
client: never printed, logged or written. huggingface_hub 1.20+ uploads through Xet, which a
self-hosted hub does not speak: for any endpoint other than huggingface.co, Xet is turned off.
The endpoint (``endpoint=``, else ``HF_ENDPOINT``) must be an http(s) URL: anything else is an
``InputError`` before any request. ``progress=False`` silences huggingface_hub's progress bars
(the CLI's ``-q``).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError, PatchError, VerifyMismatch
from ...fsops import remove_tree
from ...integrity.manifest import read_manifest
from ...model.model_dir import MANIFEST_NAME, SKIPPED_DIRS
from ...integrity.patch_record import patch_dirs, read_record
from ...cli.render import human_bytes
from .connection import check_endpoint, check_repo_id, client, hub_call, progress_bars
from .model_card import CARD_NAME, render_card

log = logging.getLogger("modelpatch")
# The hub's README.md is the model card publish writes, not the variant's file. The variant's own
# README.md (when it has one) travels under this name; pull puts it back and keeps the card
# under .modelpatch/hub/, where verify does not look.
ORIGINAL_README = "modelpatch-original-README.md"
HUB_FILES = ".modelpatch/hub"                  # what pull sets aside: the hub's, not the variant's
HUB_CARD_COPY = f"{HUB_FILES}/README.md"
GIT_ATTRIBUTES = ".gitattributes"


@dataclass(frozen=True)
class PublishResult:
    repo_id: str
    revision: str
    commit: str
    files: int


def publish(directory: str | os.PathLike, repo_id: str, *, endpoint: str | None = None,
            private: bool = True, revision: str | None = None,
            message: str | None = None, progress: bool = True,
            base_model: str | None = None) -> PublishResult:
    """Upload the variant at ``directory`` to ``repo_id`` in one commit (``progress=False``:
    no progress bars). The card's ``base_model`` is ``base_model`` if given, else what the
    variant records or its base's path says (``patcher.model.base_identity``), else left out."""
    from ...model.base_identity import check_repo_id as check_base_model
    from ...execute.locking import lock_directory
    from ...integrity.verify import verify_dir

    check_endpoint(endpoint)                      # bad usage, before hashing the variant
    check_repo_id(repo_id)
    if base_model is not None:
        check_base_model(base_model)
    root = Path(directory)
    with lock_directory(root, exclusive=False):   # no in-place patch between verify and upload
        report = verify_dir(root)
        if not report.ok:
            raise VerifyMismatch(f"refusing to publish a variant that does not verify: "
                                 f"{report.summary()}", where=root)
        with progress_bars(progress) as bars:
            return _upload(root, repo_id, endpoint, private, revision, message, base_model,
                           announce=progress and not bars)


def _upload(root: Path, repo_id: str, endpoint: str | None, private: bool,
            revision: str | None, message: str | None, base_model: str | None,
            announce: bool) -> PublishResult:
    from huggingface_hub import CommitOperationAdd

    manifest = read_manifest(root)
    base = _base_name(root)
    base_model = base_model or _identified_base_model(base, manifest)
    api = client(endpoint)
    hub_call("create_repo", repo_id, api.create_repo, repo_id, private=private, exist_ok=True)
    branch = revision or "main"
    if branch != "main":
        hub_call("create_branch", repo_id, api.create_branch, repo_id, branch=branch,
                  exist_ok=True)
    existing = _existing_card(root, api, repo_id, branch)
    card = render_card(existing, manifest, base_model, base).encode("utf-8")
    ops = [CommitOperationAdd(path_in_repo=ORIGINAL_README if rel == CARD_NAME else rel,
                              path_or_fileobj=str(root / rel))
           for rel in sorted(manifest.subjects)]
    ops.append(CommitOperationAdd(path_in_repo=MANIFEST_NAME,
                                  path_or_fileobj=str(root / MANIFEST_NAME)))
    ops.append(CommitOperationAdd(path_in_repo=CARD_NAME, path_or_fileobj=card))
    recipe = manifest.recipe["name"]
    if announce:                               # a plain line where no bars are shown
        size = sum(size for _, size in manifest.subjects.values())
        log.info("publish: committing %d files (%s) to %s", len(ops), human_bytes(size), repo_id)
    info = hub_call("create_commit", repo_id, api.create_commit, repo_id, operations=ops,
                     revision=branch,
                     commit_message=message or f"modelpatch: {recipe} applied to "
                                               f"{base_model or _label(base)}")
    return PublishResult(repo_id=repo_id, revision=branch, commit=info.oid, files=len(ops))


def _identified_base_model(base: str, manifest) -> str | None:
    """The hub repository the variant's original base is, from its manifest or its path; None,
    with a warning saying how to set it, when neither tells."""
    import logging

    from ...model.base_identity import identify

    identity = identify(base, manifest.statement)
    if identity.repo_id is None:
        logging.getLogger("modelpatch").warning("warning: %s", identity.hint(_label(base)))
    return identity.repo_id


def _label(base: str) -> str:
    """The base directory's name, to name it in messages (never as a hub repository)."""
    return base.rstrip("/").rsplit("/", 1)[-1]


def _base_name(root: Path) -> str:
    """Where the original base (the first patch's) was."""
    dirs = patch_dirs(root)
    if dirs:
        base_path = read_record(dirs[0]).base_path
        if base_path:
            return base_path
    return "unknown base"


def _existing_card(root: Path, api, repo_id: str, revision: str) -> str | None:
    """The card to keep: the variant's own README.md, else the one already on the hub."""
    local = root / CARD_NAME
    if local.is_file():
        return local.read_text(encoding="utf-8")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RevisionNotFoundError

    def download() -> str | None:
        try:
            return hf_hub_download(repo_id, CARD_NAME, revision=revision, endpoint=api.endpoint,
                                   token=api.token)
        except (EntryNotFoundError, RevisionNotFoundError):
            return None

    path = hub_call("download the model card", repo_id, download)
    return None if path is None else Path(path).read_text(encoding="utf-8")


@dataclass(frozen=True)
class PullResult:
    output: Path
    commit: str
    files: int


def pull(repo_id: str, out: str | os.PathLike | None = None, *, endpoint: str | None = None,
         revision: str | None = None, progress: bool = True) -> PullResult:
    """Download ``repo_id`` into ``out`` and verify it; nothing appears at ``out`` unless every
    file matches both the hub's digests and the provenance manifest. ``progress=False``: no
    progress bars. Errors name the repository, never the staging directory."""
    from huggingface_hub import snapshot_download

    from ...execute.locking import lock_new_path
    from ...execute.output_dir import make_staging_dir, remove_stale_staging

    check_repo_id(repo_id)
    out = Path(os.path.abspath(out or repo_id.split("/")[-1]))
    api = client(endpoint)
    with lock_new_path(out):
        if os.path.lexists(out):
            raise InputError("output already exists", where=out)
        remove_stale_staging(out)      # left by a killed pull
        info = hub_call("model_info", repo_id, api.model_info, repo_id, revision=revision,
                         files_metadata=True)
        _refuse_state_files([s.rfilename for s in info.siblings or []], repo_id)
        staging = make_staging_dir(out)
        try:
            with progress_bars(progress) as bars:
                if progress and not bars:
                    log.info("pull: downloading %d files (%s) of %s@%s",
                             len(info.siblings or []),
                             human_bytes(sum(s.size or 0 for s in info.siblings or [])), repo_id,
                             info.sha[:12])
                hub_call("download", repo_id, snapshot_download, repo_id, revision=info.sha,
                          local_dir=staging, endpoint=api.endpoint, token=api.token)
            _refuse_state_files(os.listdir(staging), repo_id, ignore=(".cache",))
            remove_tree(staging / ".cache")          # huggingface_hub's local-dir bookkeeping
            try:
                _check_hub_digests(staging, info, repo_id)
                _require_manifest(staging, repo_id)
                _restore_readme(staging)
                _set_aside_git_attributes(staging)
                _check_manifest(staging, repo_id)
            except PatchError as exc:
                _name_the_repo(exc, staging, repo_id)
                raise
            os.rename(staging, out)
        except BaseException:
            remove_tree(staging)
            raise
    return PullResult(output=out, commit=info.sha, files=len(info.siblings or []))


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _refuse_state_files(paths: list[str], repo_id: str, ignore: tuple[str, ...] = ()) -> None:
    """Refuse a repository holding files in modelpatch's, git's or huggingface_hub's own state
    directories (``.modelpatch/``, ``.git/``, ``.cache/``): the next command would take them
    for its own (replay a journal, run a git hook). Compared without case, as a
    case-insensitive filesystem would. Pull writes its own ``.modelpatch/hub/`` afterwards."""
    state = {name.lower() for name in SKIPPED_DIRS} - set(ignore)
    bad = sorted(p for p in paths if p.split("/", 1)[0].lower() in state)
    if bad:
        shown = ", ".join(repr(p) for p in bad[:3]) + (f" and {len(bad) - 3} more"
                                                       if len(bad) > 3 else "")
        raise InputError(f"refusing to pull: the repository has files in state directories "
                         f"that only modelpatch, git or huggingface_hub may write: {shown}",
                         where=repo_id,
                         hint="a published variant never holds .modelpatch/, .git/ or .cache/")


def _name_the_repo(exc: PatchError, staging: Path, repo_id: str) -> None:
    """Point an error about a file in ``staging`` (gone once pull fails) at the repository."""
    where, prefix = exc.where, str(staging)
    if where is None or not (where == prefix or where.startswith(prefix + os.sep)):
        return
    rest = where[len(prefix):].lstrip(os.sep)
    exc.where = f"{repo_id}: {rest}" if rest else repo_id
    exc.args = (exc.one_line(),)


def _check_hub_digests(root: Path, info, repo_id: str) -> None:
    from ...integrity.hashing import hash_files

    lfs = {s.rfilename: s.lfs.sha256 for s in info.siblings if s.lfs is not None}
    plain = {s.rfilename: s.blob_id for s in info.siblings if s.lfs is None}
    got = hash_files([root / rel for rel in lfs])
    bad = [rel for rel, sha in lfs.items() if got[root / rel] != sha]
    bad += [rel for rel, oid in plain.items() if oid and _git_blob_sha1(root / rel) != oid]
    if bad:
        raise VerifyMismatch(f"downloaded files differ from the hub's digests: {', '.join(bad)}",
                             where=repo_id, hint="the hub's storage may be corrupted")


def _restore_readme(root: Path) -> None:
    """Move the hub's card aside and put the variant's own README.md back."""
    card = root / CARD_NAME
    if card.exists():
        target = root / HUB_CARD_COPY
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(card, target)
    if (root / ORIGINAL_README).exists():
        os.rename(root / ORIGINAL_README, card)


def _set_aside_git_attributes(root: Path) -> None:
    """Hugging Face's hub adds a ``.gitattributes`` to every new repository: it is the hub's,
    not the variant's (unless the manifest lists it), so it goes beside the hub's card."""
    attributes = root / GIT_ATTRIBUTES
    if attributes.exists() and GIT_ATTRIBUTES not in read_manifest(root).subjects:
        target = root / HUB_FILES / GIT_ATTRIBUTES
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(attributes, target)


def _require_manifest(root: Path, repo_id: str) -> None:
    if not (root / MANIFEST_NAME).exists():
        raise InputError("not a modelpatch variant: no provenance manifest in the repository",
                         where=repo_id)


def _check_manifest(root: Path, repo_id: str) -> None:
    """Every downloaded file is the one the provenance manifest lists, and nothing is missing."""
    from ...integrity.verify import verify_dir

    report = verify_dir(root)
    if not report.ok:
        raise VerifyMismatch(f"downloaded files do not match the provenance manifest: "
                             f"{report.summary()}", where=repo_id)
