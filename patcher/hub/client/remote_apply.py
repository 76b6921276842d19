"""``apply RECIPE hf://ORG/NAME --publish ORG/NAME-VARIANT``: a config-only variant of a hub
repository, made and published without downloading its shards.

The recipe is planned from the repository's JSON files and safetensors headers alone
(``patcher.remote``). A plan that rewrites a shard is refused: that needs the tensor data
(apply without --publish downloads the model). Otherwise only small files are fetched whole: the
JSON files the plan reads, and every other regular (non-LFS) file, to know its sha256 for the
manifest. The LFS files' sha256 come from the hub's listing at the resolved commit. The
variant's manifest is built as a local apply builds it, then the variant is committed: each
unchanged LFS file a server-side copy from the base repository at that commit, the rest
uploaded (``publish.commit_variant``: the same fallbacks as ``publish``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import HubError, InputError
from ...execute.patch_builder import claimed_signature, manifest_statement
from ...integrity.manifest import read_manifest, write_manifest
from ...model.model_dir import MANIFEST_NAME, SIGNATURE_NAME
from ...names import checked_digest, checked_name
from ...plan import Action, PlanOptions, require_change
from .connection import check_repo_id, client, hub_call
from .model_card import CARD_NAME, ORIGINAL_README, render_card
from .publish import commit_variant, existing_card
from .server_copies import BaseSource, TransferPlan

log = logging.getLogger("modelpatch")


@dataclass(frozen=True)
class RemotePublishResult:
    repo_id: str
    revision: str
    commit: str
    fetched: list[str]               # files fetched whole (besides the shards' headers)
    plan: TransferPlan


def apply_and_publish(recipe, url: str, repo_id: str, *, endpoint: str | None = None,
                      private: bool = True, revision: str | None = None,
                      message: str | None = None, base_model: str | None = None,
                      allow_noop: bool = False,
                      params: dict | None = None) -> RemotePublishResult:
    from ...plan import plan as make_plan
    from ...recipe.load import load_recipes
    from ...remote.model import RemoteModel

    check_repo_id(repo_id)
    loaded = load_recipes(recipe)
    model = RemoteModel.open(url, endpoint=endpoint)
    # config only (refused below otherwise): nothing is computed here, so no jobs or device
    options = PlanOptions.of({"device": None}, params=params)
    the_plan = make_plan(loaded, model, options=options, endpoint=endpoint)
    rewrites = [fp.path for fp in the_plan.files if fp.action is Action.REWRITE_SHARD]
    if rewrites:
        raise InputError(f"recipe {loaded.name!r} rewrites {len(rewrites)} shards "
                         f"({rewrites[0]}, ...): --publish from hf:// needs a config-only recipe",
                         where=url, hint="apply without --publish downloads the model first")
    require_change(the_plan, allow_noop)
    api = client(endpoint)
    source = BaseSource(model.hub.repo_id, model.hub.commit, "the hf:// input")
    info = hub_call("model_info", source.repo_id, api.model_info, source.repo_id,
                     revision=source.revision, files_metadata=True)
    lfs = {_listed(s.rfilename): checked_digest(s.lfs.sha256, what="the hub's LFS sha256",
                                                lengths=(64,))
           for s in info.siblings or [] if s.lfs is not None}
    with tempfile.TemporaryDirectory(prefix="modelpatch-remote-") as tmp:
        root = Path(tmp)
        digests, fetched = _write_small_files(root, model, the_plan, lfs)
        signature = _base_signature(model, Path(tmp) / ".base-signature", fetched)
        manifest = _write_manifest(root, model, the_plan, digests, lfs,
                                   base_model or source.repo_id, signature)
        log.info("apply: fetched %s of %s@%s; no shard downloaded", ", ".join(fetched) or
                 "nothing", source.repo_id, source.revision[:12])
        names = {rel: ORIGINAL_README if rel == CARD_NAME else rel for rel in manifest.subjects}
        plan = TransferPlan(source=source, commit=source.revision)
        for fp in the_plan.files:
            if fp.action is Action.DROP:
                continue
            size = manifest.subjects[fp.path][1]
            if fp.action is Action.LINK and fp.source in lfs:
                plan.copies[names[fp.path]] = (fp.source, size)
            else:
                plan.uploads[names[fp.path]] = size
        log.info("publish: %s, to %s", plan.summary(), repo_id)
        branch = revision or "main"
        hub_call("create_repo", repo_id, api.create_repo, repo_id, private=private,
                  exist_ok=True)
        if branch != "main":
            hub_call("create_branch", repo_id, api.create_branch, repo_id, branch=branch,
                      exist_ok=True)
        label = f"hf://{source.repo_id}"
        card = render_card(existing_card(root, api, repo_id, branch), manifest,
                           base_model or source.repo_id, label).encode("utf-8")
        extra = {MANIFEST_NAME: str(root / MANIFEST_NAME), CARD_NAME: card}
        oid = commit_variant(api, repo_id, branch, root, names, plan, extra, message or
                             f"modelpatch: {loaded.name} applied to {source.repo_id}")
    return RemotePublishResult(repo_id, branch, oid, fetched, plan)


def _write_small_files(root: Path, model, the_plan, lfs: dict[str, str]
                       ) -> tuple[dict[str, str], list[str]]:
    """Write every output file that is not an unchanged LFS file under ``root``; returns the
    sha256 of every base file the plan reads and every file written, and the base files
    fetched whole."""
    digests: dict[str, str] = {}
    fetched = []
    for fp in the_plan.files:
        if fp.source is not None and fp.source not in lfs:
            data = model.read_bytes(fp.source)
            fetched.append(fp.source)
            digests[fp.source] = hashlib.sha256(data).hexdigest()
            if fp.action is Action.LINK:
                _write(root, fp.path, data)
        elif fp.source is not None:
            digests[fp.source] = lfs[fp.source]
        if fp.action in (Action.WRITE_JSON, Action.ADD):
            _write(root, fp.path, fp.content)
    return digests, sorted(fetched)


def _listed(name: object) -> str:
    return checked_name(name, what="the hub's file listing entry", allow_dot_dirs=True)


def _write(root: Path, rel: str, data: bytes) -> None:
    """``data`` as ``root/rel``, a new file: ``rel`` is a name (the hub's listing or the plan),
    checked before anything is created, and never a path out of ``root``."""
    path = root / _listed(rel)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as f:
            f.write(data)
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        raise HubError(f"the hub lists {rel!r} twice, or as a file and a directory") from None


def _base_signature(model, scratch: Path, fetched: list[str]) -> dict | None:
    """What a local apply records of the base's ``model.sig`` (as its signer claims it), for
    the hub's copy: fetched whole into ``scratch``, outside the variant's files."""
    if SIGNATURE_NAME not in model.files:
        return None
    scratch.mkdir()
    (scratch / SIGNATURE_NAME).write_bytes(model.read_bytes(SIGNATURE_NAME))
    fetched.append(SIGNATURE_NAME)
    fetched.sort()
    return claimed_signature(scratch)


def _write_manifest(root: Path, model, the_plan, digests: dict[str, str], lfs: dict[str, str],
                    base_model: str, base_signature: dict | None = None):
    subjects = {}
    for fp in the_plan.files:
        if fp.action is Action.LINK:
            subjects[fp.path] = (digests[fp.source], model.files[fp.source].size)
        elif fp.action in (Action.WRITE_JSON, Action.ADD):
            subjects[fp.path] = (hashlib.sha256(fp.content).hexdigest(), len(fp.content))
    base_statement = (json.loads(model.read_bytes(MANIFEST_NAME))
                      if MANIFEST_NAME in model.files else None)
    now = _dt.datetime.now(_dt.timezone.utc)
    statement = manifest_statement(
        the_plan, subjects, {rel: (sha, model.files[rel].size) for rel, sha in digests.items()},
        started=now, finished=now, base_statement=base_statement, base_model=base_model,
        base_signature=base_signature)
    write_manifest(root, statement)
    return read_manifest(root)
