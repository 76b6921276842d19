"""Which files ``pull`` rebuilds through Xet from local chunks (``xet_pull.py``), and the
rebuilding of each.

A file qualifies when the variant's provenance manifest says it changed (its sha256 is none of
the base's files') and the base file at the same path is on this machine (the Hugging Face
cache, ``--reuse``: found by the sha256 the manifest records for it). The manifest is read
from the hub first, as untrusted as any answer: it only chooses which local files to chunk;
``pull`` checks it, and every file against it, before anything is committed.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from ...errors import InputError, PatchError
from ...model.base_identity import from_statement
from ...model.model_dir import MANIFEST_NAME
from ...names import checked_name
from .reuse import find_local
from .xet_pull import LocalBase, XetPulled, connect, rebuild, xet_file_hash

log = logging.getLogger("modelpatch")
_CACHE_BLOB = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/(?:blobs|snapshots)/")


def rebuild_changed(api, repo_id: str, info, staging: Path, missing: list,
                    reuse_dirs: list[Path]) -> XetPulled:
    """Rebuild the changed files among ``missing`` (siblings of ``info`` to download) into
    ``staging`` where the hub offers Xet and the base file is local; the others are left to
    the download. Returns what was rebuilt."""
    pulled = XetPulled()
    candidates = {s.rfilename: s for s in missing if s.lfs is not None and s.size}
    if not candidates or not any(s.rfilename == MANIFEST_NAME for s in info.siblings or []):
        return pulled
    cas = connect(api, repo_id, info.sha, pulled)
    if cas is None:
        return pulled
    found = _changed_with_local_base(api, repo_id, info.sha, staging, candidates, reuse_dirs)
    if not found:
        return pulled
    bases, base_model = found
    hashes = _xet_hashes(api, repo_id, info.sha, sorted(bases))
    stores: dict[str, object] = {repo_id: cas}
    for rel, base_path in sorted(bases.items()):
        want = hashes.get(rel)
        if want is None:
            continue
        size = candidates[rel].size
        base_recon = _base_reconstruction(api, stores, base_path, [
            _cache_repo(base_path), base_model, repo_id], rel, pulled)
        if base_recon is None:
            log.info("pull: the hub holds no Xet data of the local base of %s: downloading it",
                     rel)
            continue
        recon = cas.reconstruction(want, size, rel)
        if recon is None:
            continue
        dest = staging / checked_name(rel, what="the hub's file listing entry")
        dest.parent.mkdir(parents=True, exist_ok=True)
        base = LocalBase(base_path, base_recon, rel)
        try:
            rebuild(dest, recon, base, cas, want, rel, pulled)
        finally:
            base.close()
        pulled.files[rel] = size
    return pulled


def _base_reconstruction(api, stores: dict, base_path: Path, repos: list, rel: str,
                         pulled: XetPulled):
    """The hub's reconstruction of the local base file, asked (by its Xet hash) with a read
    token of each repository that may hold it (the hub shows a file only to a token of a
    repository that has it): the cache repository the file was found in, the manifest's
    ``base_model``, the variant's own."""
    file_hash, size = xet_file_hash(base_path), base_path.stat().st_size
    for repo in dict.fromkeys(r for r in repos if r):
        if repo not in stores:
            stores[repo] = connect(api, repo, "main", pulled)
        if stores[repo] is None:
            continue
        recon = stores[repo].reconstruction(file_hash, size, f"the base of {rel}")
        if recon is not None:
            return recon
    return None


def _cache_repo(path: Path) -> str | None:
    """``ORG/NAME`` of the Hugging Face cache repository ``path`` is a blob of, else None."""
    from ...model_ref import check_repo_id

    match = _CACHE_BLOB.search(os.path.realpath(path).replace(os.sep, "/"))
    if match is None:
        return None
    try:
        return check_repo_id(f"{match.group(1)}/{match.group(2)}")
    except InputError:
        return None


def _changed_with_local_base(api, repo_id: str, commit: str, staging: Path, candidates: dict,
                             reuse_dirs: list[Path]) -> tuple[dict[str, Path], str | None] | None:
    """``{path: local base file}`` for the candidates the manifest says changed and whose base
    file (same path) is on this machine, and the ``base_model`` the manifest records."""
    from huggingface_hub import hf_hub_download

    from ...integrity.manifest import read_manifest
    from .connection import hub_call

    hub_call("download", repo_id, hf_hub_download, repo_id, MANIFEST_NAME, revision=commit,
             local_dir=staging, endpoint=api.endpoint, token=api.token)
    try:
        manifest = read_manifest(staging)
    except (PatchError, OSError, ValueError):
        return None                    # pull's own manifest check says why
    base_shas = {sha for sha, _ in manifest.base_files.values()}
    wanted = {}
    for rel, sibling in candidates.items():
        subject = manifest.subjects.get(rel)
        base = manifest.base_files.get(rel)
        if subject is None or base is None or subject[0] in base_shas:
            continue
        if subject[0] != sibling.lfs.sha256 or subject[1] != sibling.size:
            continue                   # pull refuses it anyway, once downloaded
        wanted[rel] = base
    try:
        found = find_local(wanted, reuse_dirs) if wanted else {}
    except InputError:
        return None
    bases = {rel: found[sha] for rel, (sha, _) in wanted.items() if sha in found}
    return (bases, from_statement(manifest.statement)) if bases else None


def _xet_hashes(api, repo_id: str, commit: str, paths: list[str]) -> dict[str, str]:
    """The Xet hash of each of ``paths`` (paths-info ``xetHash``), where the hub gives one."""
    from .connection import hub_call
    from .xet_terms import is_hash

    entries = hub_call("paths-info", repo_id, api.get_paths_info, repo_id, paths,
                       revision=commit)
    return {e.path: e.xet_hash for e in entries
            if getattr(e, "xet_hash", None) and is_hash(e.xet_hash)}
