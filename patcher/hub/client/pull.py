"""``pull``: download a published variant into a staging directory, check every file against
the hub's own digests (LFS sha256, git blob sha1) and the provenance manifest, and only then
rename it into place.

Before downloading, LFS files whose bytes are already on this machine (the Hugging Face cache,
``--reuse DIR``: ``reuse.py``) are linked into the staging directory and verified; files the
variant's manifest says changed are rebuilt through Xet from the local base's chunks, only the
chunks the base lacks downloaded (``xet_reuse.py``); only the others are downloaded. The
repository and commit are recorded in the pulled directory (``.modelpatch/hub/source.json``,
outside what verify checks), so a variant made from it can be published with server-side
copies.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ... import interrupts
from ...errors import InputError, PatchError, VerifyMismatch
from ...fsops import remove_tree
from ...integrity.manifest import read_manifest
from ...integrity.snapshot_verify import git_blob_sha1
from ...model.model_dir import MANIFEST_NAME, SIGNATURE_NAME, SKIPPED_DIRS
from ...names import checked_digest, checked_name
from ...units import human_bytes, plural
from .base_repo import check_pulled_base, is_published_base
from .connection import check_repo_id, client, hub_call, hub_output, lfs_only, xet_offered
from .growth import reported_growth
from .model_card import CARD_NAME, HUB_CARD_COPY, HUB_FILES, ORIGINAL_README
from .reuse import Reuse, find_local, link_into
from .xet_pull import XetPulled
from .xet_reuse import rebuild_changed

GIT_ATTRIBUTES = ".gitattributes"

log = logging.getLogger("modelpatch")


@dataclass(frozen=True)
class PullResult:
    output: Path
    commit: str
    files: int
    reused_bytes: int = 0
    downloaded_bytes: int = 0
    rebuilt_bytes: int = 0             # files rebuilt through Xet from local chunks
    received_bytes: int = 0            # what the hub sent for them


def pull(repo_id: str, out: str | os.PathLike | None = None, *, endpoint: str | None = None,
         revision: str | None = None, progress: bool = True,
         reuse: list[str | os.PathLike] | tuple = (), force: bool = False,
         trust=None, on_progress=None, on_total=None) -> PullResult:
    """Download ``repo_id`` into ``out`` and verify it; nothing appears at ``out`` unless every
    file matches both the hub's digests and the provenance manifest. ``progress=False``: no
    log line saying what is reused and downloaded; ``on_total(bytes)`` and
    ``on_progress(bytes)`` count the download. LFS files already in the Hugging Face cache or
    under a ``reuse`` directory are linked instead of downloaded. ``force``: replace an ``out``
    that an earlier pull or apply wrote, in one rename, reusing its unchanged files. Errors name
    the repository, never the staging directory."""
    from huggingface_hub import snapshot_download

    from ...execute.locking import lock_new_path
    from ...execute.output_dir import (
        commit,
        make_staging_dir,
        remove_stale_staging,
        restore_replaced,
    )

    check_repo_id(repo_id)
    reuse_dirs = [_reuse_dir(d) for d in reuse]
    out = Path(os.path.abspath(out or repo_id.split("/")[-1]))
    if not out.parent.is_dir():
        raise InputError("the output's parent directory does not exist", where=out.parent)
    api = client(endpoint)
    with lock_new_path(out):
        restore_replaced(out)          # put back what a killed pull --force had moved aside
        if os.path.lexists(out):
            if not force:
                raise InputError("output already exists", where=out,
                                 hint="force=True replaces it")
            _refuse_to_replace(out)
            reuse_dirs.append(out)     # an update downloads only what changed
        remove_stale_staging(out)      # left by a killed pull
        info = hub_call("model_info", repo_id, api.model_info, repo_id, revision=revision,
                         files_metadata=True)
        _check_listing(info)
        _refuse_state_files([s.rfilename for s in info.siblings or []], repo_id)
        staging = make_staging_dir(out)
        try:
            reused = _reuse_local(staging, info, reuse_dirs)
            missing = [s for s in info.siblings or [] if s.rfilename not in reused.linked]
            with hub_output(progress):
                rebuilt = rebuild_changed(api, repo_id, info, staging, missing, reuse_dirs)
            missing = [s for s in missing if s.rfilename not in rebuilt.files
                       and not (staging / s.rfilename).is_file()]
            downloaded = sum(s.size or 0 for s in missing)
            if progress:
                log.info("pull: %s@%s: %s (%s) reused from local files, %s%s (%s) to download",
                         repo_id, info.sha[:12], plural(len(reused.linked), "file"),
                         human_bytes(reused.bytes), _rebuilt_line(rebuilt),
                         plural(len(missing), "file"), human_bytes(downloaded))
            if on_total is not None and downloaded:
                on_total(downloaded)
            plain = missing and not xet_offered(api, repo_id, info.sha, write=False)
            with hub_output(progress), reported_growth(staging, on_progress), lfs_only(plain):
                if missing:         # a hub that names Xet hashes but gives no token: HTTP
                    hub_call("download", repo_id, snapshot_download, repo_id,
                              revision=info.sha, local_dir=staging, endpoint=api.endpoint,
                              token=api.token,
                              allow_patterns=[_literal(s.rfilename) for s in missing])
            _refuse_state_files(os.listdir(staging), repo_id, ignore=(".cache",))
            remove_tree(staging / ".cache")          # huggingface_hub's local-dir bookkeeping
            try:
                _check_hub_digests(staging, info, repo_id)
                if is_published_base(staging):
                    check_pulled_base(staging, repo_id)
                else:
                    _require_manifest(staging, repo_id)
                    _restore_readme(staging)
                    _set_aside_git_attributes(staging)
                    _check_manifest(staging, repo_id)
                if trust is not None:
                    _check_signature(staging, repo_id, trust)
                write_pulled_source(staging, repo_id, info.sha)
            except PatchError as exc:
                _name_the_repo(exc, staging, repo_id)
                raise
            with interrupts.deferred():    # renamed whole (an earlier output moved aside
                commit(staging, out)       # and back on failure), or not at all
        except BaseException:
            remove_tree(staging)
            raise
    return PullResult(output=out, commit=info.sha, files=len(info.siblings or []),
                      reused_bytes=reused.bytes, downloaded_bytes=downloaded,
                      rebuilt_bytes=rebuilt.file_bytes, received_bytes=rebuilt.received_bytes)


def _rebuilt_line(rebuilt: XetPulled) -> str:
    if not rebuilt.files:
        return ""
    share = 100 * rebuilt.received_bytes / max(1, rebuilt.file_bytes)
    return (f"{plural(len(rebuilt.files), 'changed file')} ({human_bytes(rebuilt.file_bytes)}) "
            f"rebuilt through Xet from local chunks ({human_bytes(rebuilt.received_bytes)} "
            f"received, {share:.1f}%), ")


def _refuse_to_replace(out: Path) -> None:
    """``force`` replaces what pull or apply wrote (a variant, a pulled base), never another
    directory, nor one holding revert data of its own."""
    from ...execute.output_dir import refuse_to_replace_a_stranger

    if out.is_dir() and not out.is_symlink() and (out / SOURCE_FILE).is_file() \
            and not (out / MANIFEST_NAME).exists():
        return                         # a base an earlier pull wrote
    refuse_to_replace_a_stranger(out)


def _check_listing(info) -> None:
    """Every name and digest the listing gives is a name, never a path (``patcher.names``),
    checked before the staging directory exists."""
    checked_digest(info.sha, what="the listing's commit id", lengths=(40,))
    for sibling in info.siblings or []:
        checked_name(sibling.rfilename, what="the hub's file listing entry",
                     allow_dot_dirs=True)
        if sibling.lfs is not None:
            checked_digest(sibling.lfs.sha256, what="the hub's LFS sha256", lengths=(64,))


def _reuse_dir(path: str | os.PathLike) -> Path:
    if not os.path.isdir(path):
        raise InputError("--reuse needs a directory", where=path)
    return Path(path)


def _reuse_local(staging: Path, info, reuse_dirs: list[Path]) -> Reuse:
    wanted = {s.rfilename: (s.lfs.sha256, s.size) for s in info.siblings or []
              if s.lfs is not None and s.size}
    return link_into(staging, wanted, find_local(wanted, reuse_dirs))


def _literal(name: str) -> str:
    """``name`` as an fnmatch pattern matching only itself (huggingface_hub's allow_patterns)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


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
    from ...integrity.digests.hashing import hash_files

    lfs = {s.rfilename: s.lfs.sha256 for s in info.siblings if s.lfs is not None}
    plain = {s.rfilename: s.blob_id for s in info.siblings if s.lfs is None}
    got = hash_files([root / rel for rel in lfs])
    bad = [rel for rel, sha in lfs.items() if got[root / rel] != sha]
    bad += [rel for rel, oid in plain.items() if oid and git_blob_sha1(root / rel) != oid]
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


def _check_signature(root: Path, repo_id: str, trust) -> None:
    """``pull --key``: the download is signed by ``trust`` and matches what it signed."""
    from ...signing.verify import verify_signed

    if not (root / SIGNATURE_NAME).exists():
        raise VerifyMismatch("not signed: the repository has no model.sig", where=repo_id)
    verify_signed(root, trust, fast=True, also_ignore=(HUB_FILES,))   # what pull set aside


def _require_manifest(root: Path, repo_id: str) -> None:
    if not (root / MANIFEST_NAME).exists():
        raise InputError("not a modelpatch variant: no provenance manifest in the repository",
                         where=repo_id, hint="a base model is pulled when `modelpatch publish "
                                             "--base` put it there, with its digests")


def _check_manifest(root: Path, repo_id: str) -> None:
    """Every downloaded file is the one the provenance manifest lists, and nothing is missing."""
    from ...integrity.verify import verify_dir

    report = verify_dir(root)
    if not report.ok:
        raise VerifyMismatch(f"downloaded files do not match the provenance manifest: "
                             f"{report.summary()}", where=repo_id)


# ------------------------------------------------------------------ where a pull came from

SOURCE_FILE = Path(".modelpatch") / "hub" / "source.json"
_COMMIT = re.compile(r"[0-9a-f]{40}")


def write_pulled_source(root: Path, repo_id: str, commit: str) -> None:
    path = root / SOURCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"repo_id": repo_id, "commit": commit}) + "\n", encoding="utf-8")


def read_pulled_source(root: Path) -> tuple[str, str] | None:
    """``(repo_id, commit)`` recorded in ``root`` by pull; None when absent or malformed (it
    only chooses where to copy from: publish checks every file's sha256 on the hub anyway)."""
    try:
        with open(root / SOURCE_FILE, encoding="utf-8") as f:
            data = json.loads(f.read(4096))
        repo_id, commit = data["repo_id"], data["commit"]
        check_repo_id(repo_id)
    except (OSError, ValueError, KeyError, TypeError, InputError):
        return None
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        return None
    return repo_id, commit
