"""A base model on a hub: ``publish --base`` uploads a plain model directory (no recipe, no
manifest) with the sha256 and size of every file recorded beside them, and ``pull`` checks a
repository holding that record file by file, as it checks a variant against its manifest.

The record, ``modelpatch.base.json``, is an in-toto Statement v1 whose subjects are the model's
files (the shape of a provenance manifest's subjects) and whose predicate is empty: it says
what the bytes are, not how they were made. The pulled directory keeps it under
``.modelpatch/hub/``, beside the hub's other files, so the directory is the base itself.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ...errors import InputError, OperationFailed, VerifyMismatch
from ...fsops import NotRegularFile, TooLarge, read_capped
from ...model.model_dir import BASE_RECORD, MANIFEST_NAME, SIGNATURE_NAME
from .connection import check_endpoint, check_repo_id, client, hub_call, hub_output
from .model_card import HUB_FILES

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "urn:modelpatch:published-base:v1"
#: The largest record read back: 100 bytes a file, for more files than any real model has.
MAX_RECORD_BYTES = 16 << 20
GIT_ATTRIBUTES = ".gitattributes"

log = logging.getLogger("modelpatch")


def publish_base(directory: str | os.PathLike, repo_id: str, *, endpoint: str | None = None,
                 private: bool = True, revision: str | None = None,
                 message: str | None = None, progress: bool = True, plan_only: bool = False):
    """Upload the model directory ``directory`` to ``repo_id`` in one commit, with the record
    of its files' digests; ``plan_only``: hash and list, upload nothing."""
    from ...execute.locking import lock_directory
    from ...model.model_dir import ModelDir
    from .publish import PublishResult, uploading
    from .server_copies import TransferPlan

    check_endpoint(endpoint)
    check_repo_id(repo_id)
    root = Path(directory)
    ModelDir.open(root)            # a model (shards, headers, index valid), as apply reads it
    if os.path.lexists(root / MANIFEST_NAME):
        raise InputError("a modelpatch variant, not a base: publish it without --base",
                         where=root, hint="its manifest lets publish verify it and copy the "
                                          "files its base repository holds")
    with lock_directory(root, exclusive=False):   # no in-place patch while it is hashed
        files = _digests(root)
        plan = TransferPlan(uploads={rel: size for rel, (_, size) in files.items()})
        branch = revision or "main"
        if plan_only:
            return PublishResult(repo_id=repo_id, revision=branch, commit=None,
                                 files=len(files) + 1, plan=plan)
        record = json.dumps(record_statement(files), indent=1, sort_keys=True).encode()
        with hub_output(progress):
            api = client(endpoint)
            hub_call("create_repo", repo_id, api.create_repo, repo_id, private=private,
                     exist_ok=True)
            if branch != "main":
                hub_call("create_branch", repo_id, api.create_branch, repo_id, branch=branch,
                         exist_ok=True)
            stale = _stale_files(api, repo_id, branch, files)
            with uploading(api, repo_id, branch, plan):
                info = hub_call("create_commit", repo_id, api.create_commit, repo_id,
                                operations=_operations(root, files, record, stale),
                                revision=branch,
                                commit_message=message or f"modelpatch: base {root.name}")
        if progress:                    # once the hub took it: a refusal is the one error line
            log.info("publish: %s, to %s", plan.summary(), repo_id)
    return PublishResult(repo_id=repo_id, revision=branch, commit=info.oid,
                         files=len(files) + 1, plan=plan)


def _digests(root: Path) -> dict[str, tuple[str, int]]:
    """``{relpath: (sha256, size)}`` of every file of the model (the one rule of which files
    are the model's: ``integrity.verify.list_files``); a link out of it or a FIFO is refused."""
    from ...integrity.digests.hashing import hash_files
    from ...integrity.verify import list_files

    listing = list_files(root)
    odd = sorted(rel for rel, st in listing.items() if st is None)
    if odd:
        raise InputError(f"{odd[0]!r} is not a regular file inside the directory (a link out "
                         f"of it, a dangling link or a special file)", where=root)
    if not listing:
        raise InputError("no files to publish", where=root)
    if BASE_RECORD in listing:
        raise InputError(f"{BASE_RECORD} is the name publish --base gives its digest record",
                         where=root / BASE_RECORD, hint="rename or remove that file")
    digests = hash_files([root / rel for rel in listing])
    return {rel: (digests[root / rel], st.st_size) for rel, st in listing.items()}


def record_statement(files: dict[str, tuple[str, int]]) -> dict:
    return {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE, "predicate": {},
            "subject": [{"name": rel, "digest": {"sha256": sha}, "annotations": {"size": size}}
                        for rel, (sha, size) in sorted(files.items())]}


def _stale_files(api, repo_id: str, branch: str, files: dict) -> list[str]:
    """Files the branch holds that the directory does not (a shard an earlier publish put
    there): the commit removes them, so that it holds exactly what its record lists."""
    from huggingface_hub.errors import RevisionNotFoundError

    def listing() -> list[str]:
        try:
            return api.list_repo_files(repo_id, revision=branch)
        except RevisionNotFoundError:           # a new branch: nothing there yet
            return []

    keep = {*files, BASE_RECORD, GIT_ATTRIBUTES}
    return sorted(rel for rel in hub_call("list the repository", repo_id, listing)
                  if rel not in keep)


def _operations(root: Path, files: dict[str, tuple[str, int]], record: bytes,
                stale: list[str]) -> list:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    ops = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(root / rel))
           for rel in sorted(files)]
    signed = (root / SIGNATURE_NAME).is_file()      # the base's OMS signature goes along
    if signed:
        ops.append(CommitOperationAdd(path_in_repo=SIGNATURE_NAME,
                                      path_or_fileobj=str(root / SIGNATURE_NAME)))
    ops += [CommitOperationDelete(path_in_repo=rel) for rel in stale
            if not (signed and rel == SIGNATURE_NAME)]
    return [*ops, CommitOperationAdd(path_in_repo=BASE_RECORD, path_or_fileobj=record)]


# ------------------------------------------------------------------------------------ pull

def is_published_base(staging: Path) -> bool:
    """Whether a downloaded repository is a base ``publish --base`` wrote (a record and no
    manifest)."""
    return (staging / BASE_RECORD).is_file() and not os.path.lexists(staging / MANIFEST_NAME)


def check_pulled_base(staging: Path, repo_id: str) -> None:
    """Every file of the downloaded base is the one its record lists, and nothing is missing
    or extra; the record (and a ``.gitattributes`` the hub added) move under
    ``.modelpatch/hub/``."""
    from ...integrity.digests.hashing import hash_files
    from ...integrity.verify import compare_maps, list_files

    expected = _read_record(staging / BASE_RECORD, repo_id)
    aside = staging / HUB_FILES
    aside.mkdir(parents=True, exist_ok=True)
    os.rename(staging / BASE_RECORD, aside / BASE_RECORD)
    if GIT_ATTRIBUTES not in expected and os.path.lexists(staging / GIT_ATTRIBUTES):
        os.rename(staging / GIT_ATTRIBUTES, aside / GIT_ATTRIBUTES)
    listing = list_files(staging)
    sizes = {rel: (st.st_size if st is not None else None) for rel, st in listing.items()}
    present = [rel for rel in expected if sizes.get(rel) == expected[rel][1]]
    hashed = hash_files([staging / rel for rel in present])
    report = compare_maps(expected, listing.keys(), {rel: hashed[staging / rel]
                                                     for rel in present}, sizes)
    if not report.ok:
        raise VerifyMismatch(f"downloaded files do not match the base's digest record: "
                             f"{report.summary()}", where=repo_id)


def _read_record(path: Path, repo_id: str) -> dict[str, tuple[str, int]]:
    """The record's ``{relpath: (sha256, size)}``, each name checked as a name from outside."""
    from ...config.jsonfile import parse_json
    from ...integrity.manifest_rules import Invalid, file_entry
    from ...names import checked_name

    where = f"{repo_id}: {BASE_RECORD}"
    try:
        data = read_capped(path, MAX_RECORD_BYTES)
    except TooLarge:
        raise InputError(f"larger than {MAX_RECORD_BYTES} bytes", where=where) from None
    except (NotRegularFile, IsADirectoryError):
        raise InputError("not a regular file", where=where) from None
    except OSError as exc:
        raise OperationFailed(f"cannot read: {exc.strerror or exc}", where=where) from None
    statement = parse_json(data, where)
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE \
            or statement.get("predicateType") != PREDICATE_TYPE \
            or not isinstance(statement.get("subject"), list):
        raise InputError(f"not a base digest record (an in-toto Statement of predicate type "
                         f"{PREDICATE_TYPE})", where=where)
    files: dict[str, tuple[str, int]] = {}
    for i, entry in enumerate(statement["subject"]):
        try:
            name, value = file_entry(entry, f"subject[{i}]")
        except Invalid as exc:
            raise InputError(str(exc), where=where) from None
        checked_name(name, what=f"{BASE_RECORD} entry")
        if name in files or name == BASE_RECORD:
            raise InputError(f"subject[{i}] ({name!r}): listed twice", where=where)
        files[name] = (value.sha256, value.size)
    return files
