"""What both executors build from a plan (``engine`` for a new variant, ``inplace`` for a
patch of the base itself): the new files, written and hashed; the base's digests, known or
computed once; the revert record; the manifest's subjects; the manifest.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import faults
from ..changes import changes_json
from ..errors import OperationFailed
from ..fsops import make_parents, write_file
from ..gguf.header_inplace import is_header_rewrite
from ..integrity.digests.digest_cache import KnownDigests
from ..integrity.manifest import build_statement, read_manifest, write_manifest
from ..integrity.patch_record import BaseFile, PatchRecord, next_sequence
from ..model.base_identity import identify
from ..model.model_dir import MANIFEST_NAME, SIGNATURE_NAME, ModelDir
from ..plan import Action, Plan

log = logging.getLogger("modelpatch")


@dataclass(frozen=True)
class Progress:
    """Callbacks the CLI hooks progress meters to (``patcher.cli.progress``); all optional. Each
    step reports bytes done, and its total before it starts."""

    hashing: Callable[[int], None] | None = None
    writing: Callable[[int], None] | None = None
    hash_total: Callable[[int], None] | None = None
    copying: Callable[[int], None] | None = None
    write_total: Callable[[int], None] | None = None
    copy_total: Callable[[int], None] | None = None


class PatchBuilder:
    """The work both apply modes share: new files, digests, the patch record, the manifest."""

    def __init__(self, plan: Plan, model: ModelDir, *, progress: Progress,
                 base_model: str | None = None, base_signature: dict | None = None):
        self.plan, self.model, self.progress = plan, model, progress
        self.jobs = plan.options.jobs
        self.base_model = base_model     # ORG/NAME given by the user, else identified
        # The base's model.sig as recorded (verified by apply --require-signed-base), else
        # read here: its signer as it claims.
        self.base_signature = base_signature
        self.known = KnownDigests()
        self.trusted = _base_manifest_digests(model)
        # Known digests of the files this patch reads, looked up before anything is linked: a
        # link changes a file's ctime, and with it the digest cache's key.
        self.source_stats = {fp.source: os.stat(model.files[fp.source].path)
                             for fp in plan.files if fp.source is not None}
        self.known_before = {rel: known for rel, st in self.source_stats.items()
                             if (known := self.known.lookup(model.files[rel].path, st=st))}
        # base relpath -> sha256 of the bytes a rewrite read or a copy copied
        self.hashed_while_writing: dict[str, str] = {}
        self.sequence = next_sequence(model.root)
        self.started = _now()
        self.bytes_hashed = 0

    def known_base_digest(self, rel: str) -> str | None:
        known = self.known_before.get(rel)
        return ((known.sha256 if known else None) or self.trusted.get(rel)
                or self.hashed_while_writing.get(rel))

    def rerecord_linked(self, base_digests: dict[str, str]) -> None:
        """Record again, under their new ctime, the digests of base files this patch linked
        (same inode, size and mtime as when looked up or hashed): the next apply finds them."""
        rows = []
        for rel, digest in base_digests.items():
            before, st = self.source_stats[rel], os.stat(self.model.files[rel].path)
            if (st.st_ino, st.st_size, st.st_mtime_ns) != (before.st_ino, before.st_size,
                                                           before.st_mtime_ns):
                continue
            known = self.known_before.get(rel)
            trusted = rel in self.trusted and known is None
            rows.append((st, digest, not trusted and (known is None or known.verified)))
        self.known.cache.put_many(rows)

    def write_new_files(self, dest: Path) -> dict[str, str]:
        """Write every file the plan creates (JSON, added files, shards) under ``dest``."""
        digests = {}
        for fp in self.plan.files:
            if fp.action in (Action.WRITE_JSON, Action.ADD):
                faults.point(f"file:{fp.path}")
                write_file(make_parents(dest, fp.path), fp.content)
                digests[fp.path] = hashlib.sha256(fp.content).hexdigest()
        shards = [fp for fp in self.plan.files if fp.action is Action.REWRITE_SHARD
                  and not is_header_rewrite(fp)]
        if shards and self.progress.write_total:
            self.progress.write_total(sum(fp.size_after or 0 for fp in shards))
        if shards:
            digests.update(self._rewrite_shards(shards, dest))
        for rel, digest in digests.items():
            self.known.record(os.stat(dest / rel), digest, verified=True)
        return digests

    def copier(self, rel: str) -> Callable[[Path, Path], None]:
        """A ``link_or_copy`` copy function for base file ``rel`` that hashes what it copies:
        the base is then not read a second time to hash it, and a digest claimed for it (an HF
        blob name, the cache) that the bytes contradict is caught here."""
        from ..integrity.digests.hash_writer import copy_hashed

        def copy(src: Path, dst: Path) -> None:
            observed = time.time_ns()
            result = copy_hashed(src, dst)
            if not result.stable:
                return
            claimed = self.known_base_digest(rel)
            if claimed is not None and claimed != result.sha256:
                raise OperationFailed(f"the copied bytes have sha256 {result.sha256}, not the "
                                      f"{claimed} known for this file", where=src,
                                      hint="the file changed, or a digest claimed for it (an "
                                           "HF blob name) is wrong: run `modelpatch verify`")
            self.known.record_results([result], observed_ns=observed)
            self.hashed_while_writing[rel] = result.sha256

        return copy

    def _rewrite_shards(self, shards: list, dest: Path) -> dict[str, str]:
        """Write the rewritten shards; a base shard whose digest is not known yet is hashed as
        the rewrite reads it (``patcher.integrity.digests.source_digest``), not in a pass of its
        own."""
        from ..tensors.writing.shard_pool import run_shard_tasks

        for fp in shards:
            make_parents(dest, fp.path)
        model = self.model
        wanted = {str(model.files[fp.source].path): fp.source for fp in shards
                  if fp.source is not None and self.known_base_digest(fp.source) is None}
        observed = time.time_ns()
        results = run_shard_tasks([fp.shard_task for fp in shards], dest, jobs=self.jobs,
                                  on_progress=self.progress.writing,
                                  hash_sources=frozenset(wanted))
        stable = [r for r in results.sources.values() if r.stable]
        self.known.record_results(stable, observed_ns=observed)
        self.hashed_while_writing.update(
            {wanted[path]: r.sha256 for path, r in results.sources.items() if r.stable})
        return results.outputs

    def base_digests(self) -> dict[str, str]:
        """sha256 of every base file the output keeps or the revert data needs, each computed
        at most once: known digests (cache, HF blob names, the base's manifest, shards hashed
        while rewritten) first."""
        faults.point("hashing")
        model = self.model
        needed = [fp.source for fp in self.plan.files if fp.source is not None]
        digests, unknown = {}, []
        for rel in needed:
            digest = self.known_base_digest(rel)
            if digest:
                digests[rel] = digest
            else:
                unknown.append(rel)
        self.bytes_hashed = sum(model.files[r].size for r in unknown)
        if unknown:
            if self.progress.hash_total:
                self.progress.hash_total(self.bytes_hashed)
            paths = {model.files[r].path: r for r in unknown}
            hashed = self.known.digests(list(paths), jobs=self.jobs,
                                        on_progress=self.progress.hashing)
            digests.update({paths[p]: d for p, d in hashed.items()})
        return digests

    def record(self, base_digests: dict[str, str], mode: str) -> PatchRecord:
        model = self.model
        base_files = {rel: BaseFile(base_digests[rel], f.size, _mode(f.path), f.link_target)
                      for rel, f in model.files.items() if rel in base_digests}
        files = self.plan.files
        return PatchRecord(
            sequence=self.sequence,
            recipe={"name": self.plan.recipe.name, "sha256": self.plan.recipe.sha256},
            mode=mode, base_files=base_files,
            replaced=sorted(f.source for f in files if f.source and f.action is not Action.LINK),
            added=sorted(f.path for f in files
                         if f.source is None and f.action is not Action.DROP),
            base_manifest=model.has(MANIFEST_NAME),
            base_path=os.path.abspath(model.root),     # a relative one depends on the cwd
            base_signature=model.has(SIGNATURE_NAME))

    def subjects(self, staging: Path, digests: dict[str, str],
                 base_digests: dict[str, str]) -> dict[str, tuple[str, int]]:
        """The manifest's subjects, ``{path: (sha256, size)}`` of every output file: a carried
        file has its base file's digest and size, a new one the digest it was written with and
        its size in ``staging``."""
        subjects = {}
        for fp in self.plan.files:
            if fp.action is Action.LINK:
                subjects[fp.path] = (base_digests[fp.source], self.model.files[fp.source].size)
            elif is_header_rewrite(fp):         # staging holds only the new header
                subjects[fp.path] = (digests[fp.path], fp.size_after)
            elif fp.action is not Action.DROP:
                subjects[fp.path] = (digests[fp.path], os.path.getsize(staging / fp.path))
        return subjects

    def write_manifest(self, dest: Path, subjects: dict[str, tuple[str, int]],
                       base_digests: dict[str, str]) -> str:
        faults.point("manifest")
        model = self.model
        base_statement = _base_statement(model)
        base_model = self.base_model or identify(model.root, base_statement).repo_id
        statement = manifest_statement(
            self.plan, subjects,
            {p: (base_digests[p], model.files[p].size) for p in base_digests},
            started=self.started, finished=_now(), base_statement=base_statement,
            base_model=base_model,
            base_signature=self.base_signature or _claimed_signature(model))
        return write_manifest(dest, statement)[0]


def manifest_statement(plan: Plan, subjects: dict[str, tuple[str, int]],
                       base_files: dict[str, tuple[str, int]], *, started, finished,
                       base_statement: dict | None, base_model: str | None,
                       base_signature: dict | None = None) -> dict:
    """The provenance statement of ``plan``'s output, the one builder of every executor (a new
    variant, a patch in place, a variant made on a hub): the recipe as the plan bound it (its
    parameter values and every recipe combined), the plan's options and its change log; only
    the files (``subjects``, ``base_files``), times and base differ by where it ran."""
    return build_statement(
        subjects=subjects, base_files=base_files, recipe=plan.recipe.manifest_record(),
        options=plan.options.to_json(), changes=changes_json(plan.changes), started=started,
        finished=finished, base_statement=base_statement, base_model=base_model,
        base_signature=base_signature)


def _mode(path: Path) -> int:
    return path.lstat().st_mode & 0o7777


def _base_manifest_digests(model: ModelDir) -> dict[str, str]:
    """Digests from the base's own manifest, trusted for files unchanged since it was written:
    same size, and neither modified nor changed in any way (ctime, which nobody can set back)
    after the manifest was written. A file linked since (its ctime moves) is left to the cache."""
    if not model.has(MANIFEST_NAME):
        return {}
    manifest = read_manifest(model.root)
    written = model.files[MANIFEST_NAME].path.stat().st_mtime_ns
    trusted = {}
    for rel, (digest, size) in manifest.subjects.items():  # DigestEntry(sha256, size)
        f = model.files.get(rel)
        if f is None or f.size != size:
            continue
        st = f.path.stat()
        if st.st_mtime_ns <= written and st.st_ctime_ns <= written:
            trusted[rel] = digest
    return trusted


def _claimed_signature(model: ModelDir) -> dict | None:
    """The base's ``model.sig`` as it claims to be signed (not checked), or None."""
    if not model.has(SIGNATURE_NAME):
        return None
    return claimed_signature(model.root)


def claimed_signature(root: Path) -> dict:
    """What a manifest records of ``root/model.sig`` unchecked: as its signer claims it, or
    ``unknown (why)`` when it cannot be read. One function for every executor, so that a
    variant made here and one made on a hub record a signed base alike."""
    from ..errors import VerifyMismatch
    from ..signing.verify import base_signature

    try:
        return base_signature(root)         # type: ignore[return-value]
    except VerifyMismatch as exc:
        data = (root / SIGNATURE_NAME).read_bytes()
        return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                "signer": f"unknown ({exc.message})", "verified": False, "carried": False}


def _base_statement(model: ModelDir) -> dict | None:
    return read_manifest(model.root).statement if model.has(MANIFEST_NAME) else None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
