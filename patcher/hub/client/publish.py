"""``publish``: verify a variant and commit it to a hub repository in one commit.

The variant is checked against its provenance manifest, the repository created (private by
default), and the variant committed without the revert data under ``.modelpatch/``, with a model
card naming the base and the recipe. Files the base repository already holds are copied
server-side instead of uploaded (``server_copies.py``); the plan (bytes copied, bytes uploaded,
and why any file that could have been copied is uploaded) is printed first, or alone with
``plan_only``. Uploads go through Xet when the hub offers it, so a rewritten shard sends only
the chunks the hub lacks (``xet_upload.py`` counts them for the publish line); a hub that does
not is spoken to over Git LFS.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...errors import HubError, InputError, VerifyMismatch
from ...integrity.manifest import read_manifest
from ...integrity.patch_record import patch_dirs, read_record
from ...model.model_dir import MANIFEST_NAME, SIGNATURE_NAME
from .connection import (
    check_endpoint,
    check_repo_id,
    client,
    hub_call,
    hub_output,
    lfs_only,
    xet_offered,
)
from .model_card import CARD_NAME, ORIGINAL_README, render_card
from .server_copies import TransferPlan, plan_transfer
from .xet_upload import recording

log = logging.getLogger("modelpatch")


@dataclass(frozen=True)
class PublishResult:
    repo_id: str
    revision: str
    commit: str | None                 # None for a plan only
    files: int
    plan: TransferPlan


def publish(directory: str | os.PathLike, repo_id: str, *, endpoint: str | None = None,
            private: bool = True, revision: str | None = None,
            message: str | None = None, progress: bool = True,
            base_model: str | None = None, plan_only: bool = False) -> PublishResult:
    """Upload the variant at ``directory`` to ``repo_id`` in one commit (``progress=False``:
    no line saying what is copied and uploaded; ``plan_only``: decide what to copy and
    upload, change nothing). The card's
    ``base_model`` is ``base_model`` if given, else what the variant records or its base's path
    says (``patcher.base_identity``), else left out."""
    from ...execute.locking import lock_directory
    from ...integrity.verify import verify_dir
    from ...model.base_identity import check_repo_id as check_base_model

    check_endpoint(endpoint)                      # bad usage, before hashing the variant
    check_repo_id(repo_id)
    if base_model is not None:
        check_base_model(base_model)
    root = Path(directory)
    if root.is_dir() and not os.path.lexists(root / MANIFEST_NAME):
        raise InputError("no provenance manifest: not a modelpatch variant", where=root,
                         hint="base=True publishes a plain model (a base) with the sha256 of "
                              "its files")
    with lock_directory(root, exclusive=False):   # no in-place patch between verify and upload
        report = verify_dir(root)
        if not report.ok:
            raise VerifyMismatch(f"refusing to publish a variant that does not verify: "
                                 f"{report.summary()}", where=root)
        with hub_output(progress):
            return _upload(root, repo_id, endpoint, private, revision, message, base_model,
                           announce=progress, plan_only=plan_only)


def _upload(root: Path, repo_id: str, endpoint: str | None, private: bool,
            revision: str | None, message: str | None, base_model: str | None,
            announce: bool, plan_only: bool) -> PublishResult:
    manifest = read_manifest(root)
    base = _base_name(root)
    base_model = base_model or _identified_base_model(base, manifest)
    api = client(endpoint)
    names = {rel: ORIGINAL_README if rel == CARD_NAME else rel for rel in manifest.subjects}
    plan = hub_call("check the base repository", repo_id, plan_transfer, api, manifest, base,
                     base_model, names)
    branch = revision or "main"
    signer = _signer(root, manifest)            # a stale model.sig is refused before any write
    if plan_only:
        _say_why_uploaded(plan)
        return PublishResult(repo_id=repo_id, revision=branch, commit=None,
                             files=len(names) + 2 + (signer is not None), plan=plan)
    hub_call("create_repo", repo_id, api.create_repo, repo_id, private=private, exist_ok=True)
    if branch != "main":
        hub_call("create_branch", repo_id, api.create_branch, repo_id, branch=branch,
                  exist_ok=True)
    existing = existing_card(root, api, repo_id, branch)
    card = render_card(existing, manifest, base_model, base, signer=signer).encode("utf-8")
    extra = {MANIFEST_NAME: str(root / MANIFEST_NAME), CARD_NAME: card}
    if signer is not None:              # uploaded as is: pull --key checks it
        extra[SIGNATURE_NAME] = str(root / SIGNATURE_NAME)
    commit_message = message or (f"modelpatch: {manifest.recipe['name']} applied to "
                                 f"{base_model or _label(base)}")
    oid = commit_variant(api, repo_id, branch, root, names, plan, extra, commit_message)
    _say_why_uploaded(plan)      # what was sent, once the hub took it (never before: it may
    if announce:                 # refuse, and the error is then the one line)
        log.info("publish: %s, to %s", plan.summary(), repo_id)
    return PublishResult(repo_id=repo_id, revision=branch, commit=oid,
                         files=len(names) + len(extra), plan=plan)


def _signer(root: Path, manifest) -> str | None:
    """Who ``model.sig`` says signed the variant (checked by ``pull --key``), or None when
    unsigned. A signature over other digests than the manifest's (the variant changed since it
    was signed) is refused: it would fail every verification downstream."""
    from ...signing.parse import read_bundle
    from ...signing.sign import resources_of

    if not os.path.lexists(root / SIGNATURE_NAME):
        return None
    bundle = read_bundle(root / SIGNATURE_NAME)
    if bundle.resources != resources_of(manifest.subjects, manifest.sha256):
        raise VerifyMismatch("model.sig does not sign these files (the variant changed after "
                             "it was signed)", where=root / SIGNATURE_NAME,
                             hint="sign it again: modelpatch sign DIR --key PRIVATE.pem")
    return bundle.claimed_signer()


def _say_why_uploaded(plan: TransferPlan) -> None:
    for note in plan.notes:
        log.warning("publish: %s", note)


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


def existing_card(root: Path, api, repo_id: str, revision: str) -> str | None:
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


def commit_variant(api, repo_id: str, branch: str, root: Path, names: dict[str, str],
                   plan: TransferPlan, extra: dict[str, str | bytes], message: str) -> str:
    """Commit the variant: ``plan.copies`` as server-side copies, the rest uploaded, ``extra``
    (path in repo -> local path or bytes) too. When the hub refuses the copies (no duplicate
    endpoint, a file it cannot duplicate), says so and uploads those files instead. Uploads go
    through Xet when the hub offers it (``plan.xet`` then says what they sent), else over LFS."""
    local = {name: rel for rel, name in names.items()}
    with uploading(api, repo_id, branch, plan):
        return _commit(api, repo_id, branch, root, local, plan, extra, message)


@contextmanager
def uploading(api, repo_id: str, branch: str, plan: TransferPlan):
    """The block's uploads go through Xet when the hub offers it (``plan.xet`` then says what
    they sent), else over Git LFS (``plan.transport``)."""
    plan.transport = "xet" if xet_offered(api, repo_id, branch, write=True) else "lfs"
    with lfs_only(plan.transport == "lfs"), recording() as sent:
        yield
    plan.xet = sent


def _commit(api, repo_id: str, branch: str, root: Path, local: dict[str, str],
            plan: TransferPlan, extra: dict[str, str | bytes], message: str) -> str:

    def attempt():
        from huggingface_hub.errors import FileDuplicationError, HfHubHTTPError

        try:
            return api.create_commit(repo_id, operations=_operations(root, local, plan, extra),
                                     revision=branch, commit_message=message)
        except FileDuplicationError as exc:
            return _CopyRefused(str(exc).splitlines()[0])
        except ValueError as exc:       # huggingface_hub: the hub gave no handle to copy by
            if not str(exc).startswith("Cannot duplicate LFS file"):
                raise
            return _CopyRefused("the hub names no copy handle (xetHash) for the files")
        except HfHubHTTPError as exc:
            response = exc.response
            if response is None or "/lfs-files/duplicate" not in str(response.url):
                raise
            return _CopyRefused(f"the hub answered HTTP {response.status_code} to the copy "
                                f"request")

    info = hub_call("create_commit", repo_id, attempt)
    if isinstance(info, _CopyRefused):
        plan.upload_all(f"server-side copy refused ({info.reason}): uploaded the "
                        f"{len(plan.copies)} files instead")
        info = hub_call("create_commit", repo_id, attempt)
        if isinstance(info, _CopyRefused):      # uploads only: a refusal of copies is a bug
            raise HubError(f"the hub refused server-side copies of a commit that has none "
                           f"({info.reason})", where=repo_id)
    return info.oid


@dataclass(frozen=True)
class _CopyRefused:
    reason: str


def _operations(root: Path, local: dict[str, str], plan: TransferPlan,
                extra: dict[str, str | bytes]) -> list:
    from huggingface_hub import CommitOperationAdd, CommitOperationCopy

    if plan.source is None and plan.copies:
        raise ValueError("a transfer plan with server-side copies names no source repository")
    ops: list = [CommitOperationCopy(src_path_in_repo=src, path_in_repo=name,
                                     src_revision=plan.commit, src_repo_id=plan.source.repo_id,
                                     src_repo_type="model")
                 for name, (src, _) in sorted(plan.copies.items())]
    ops += [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(root / local[name]))
            for name in sorted(plan.uploads)]
    ops += [CommitOperationAdd(path_in_repo=name, path_or_fileobj=data)
            for name, data in extra.items()]
    return ops
