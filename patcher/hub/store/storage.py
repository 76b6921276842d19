"""Storage of the embedded hub: content-addressed blobs, immutable commits, atomically moved refs.

No Starlette: the server calls it, and tests can drive it directly.

Layout under ROOT::

    tokens.json                       bearer tokens (see ``tokens.py``)
    secret.key                        HMAC key signing LFS upload URLs (0600, made on first start)
    tmp/                              every write starts here, then is renamed into place
    tmp/session-*/                    one per Store (server process), flock'ed while it lives
    blobs/sha256/ab/abcdef...         file contents, read-only, one file per distinct content
    repos/<models|datasets>/<namespace>/<name>/
        repo.json                     {"id", "type", "private", "created_at"}
        refs.json                     {"branches": {name: commit}, "tags": {name: commit}}
        commits/<commit id>.json      immutable commit records
        lfs/<sha256>                  empty marker: this LFS object was uploaded to this repo
        .lock                         flock'ed while refs.json or repo.json change

A commit record is ``{"parent", "message", "description", "author", "time", "tree"}``, where
``tree`` maps each path to ``{"sha256", "size", "git_oid", "lfs"}``. ``git_oid`` is the git blob
id of what git would store: the content for a regular file, the LFS pointer for an LFS file (the
Hub's ``blobId``). The commit id is the first 40 hex digits of the sha256 of the canonical JSON
of the record, so the same record always gets the same id.

Crash safety: a blob is written to ``tmp/``, hashed while written, fsynced, checked against the
expected digest and only then renamed to its final name; a JSON file is written the same way.
A crash leaves at most a stray file in ``tmp/`` (cleaned at the next start), never a partial blob,
commit or ref. Each Store writes under its own ``tmp/session-*`` directory, which it holds an
exclusive ``flock`` on while it lives: ``clean_tmp`` at start-up removes everything in ``tmp/``
that no live Store holds, however recent (a crashed upload's staging included), and never the
files of another server process sharing the root. Blobs are never garbage-collected (deleting a
repo keeps them); unreferenced xorbs are, by ``modelpatch hub gc`` (``xet_gc.py``).

Xet storage (xorbs, file reconstructions, their indexes) lives under ``xet/``: ``xet_store.py``.

This module holds ``Store``: repos, their lock, refs, commits and LFS markers. The blob store is
``blob_store.py``, the records ``records.py``, commit operations ``commit_ops.py``; its small JSON
files are replaced atomically with ``fsops.replace_file``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ...fsops import fsync_dir, replace_file
from ..request_errors import (
    BadRequest,
    Conflict,
    Forbidden,
    HubRequestError,
    PreconditionFailed,
    RepoNotFound,
    RevisionNotFound,
)
from .blob_store import BlobStore
from .commit_ops import Op, apply_ops
from .naming import (
    COMMIT_ID,
    DEFAULT_BRANCH,
    REPO_KINDS,
    RESERVED_NAMESPACES,
    check_ref_name,
    split_repo_id,
)
from .records import Commit, RepoMeta, commit_id_of, utc_timestamp
from .xet_store import XetStore


class Store(BlobStore):
    """The hub's data under ``root``: the blob store plus the repos. Thread-safe; ref updates are
    serialized per repo with ``flock`` (across threads and processes)."""

    _CACHE_MAX = 1024

    def __init__(self, root: Path):
        self.root = Path(root)
        self.tmp_root = self.root / "tmp"
        self.tmp_root.mkdir(parents=True, exist_ok=True)
        session, self._session_fd = _locked_session_dir(self.tmp_root)
        super().__init__(blobs=self.root / "blobs" / "sha256", tmp=session)
        self.repos = self.root / "repos"
        self.repos.mkdir(parents=True, exist_ok=True)
        self.xet = XetStore(self.root / "xet", tmp=session, blobs=self.blobs)
        self._commits: dict[str, Commit] = {}  # commit id -> record; ids are content hashes

    def clean_tmp(self) -> int:
        """Remove what interrupted writes left in ``tmp/``: every entry but the session
        directories of live Stores (this one, or another process's on the same root). Returns the
        number of entries removed."""
        removed = 0
        for entry in self.tmp_root.iterdir():
            if entry != self.tmp:
                with _unless_held(entry) as free, contextlib.suppress(FileNotFoundError):
                    if free:
                        if entry.is_dir() and not entry.is_symlink():
                            shutil.rmtree(entry, ignore_errors=True)
                        else:
                            entry.unlink()
                        removed += 1
        return removed

    # -- small JSON files ------------------------------------------------------------------

    def _write_json(self, path: Path, obj: Any) -> None:
        """Atomically and durably replace ``path`` with ``obj`` as JSON (temp file in ``tmp/``)."""
        replace_file(path, json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n",
                     tmp_dir=self.tmp, prefix="json-")

    # -- repos -----------------------------------------------------------------------------

    def repo_dir(self, kind: str, repo_id: str) -> Path:
        namespace, name = split_repo_id(repo_id)
        return self.repos / REPO_KINDS[kind] / namespace / name

    def get_repo(self, kind: str, repo_id: str) -> RepoMeta | None:
        """The repo's metadata, or None if there is no such repo (or the id is malformed)."""
        if kind not in REPO_KINDS:
            return None
        try:
            d = self.repo_dir(kind, repo_id)
            data = _read_json(d / "repo.json")
        except (BadRequest, FileNotFoundError, NotADirectoryError):
            return None
        return RepoMeta(kind=kind, id=data["id"], private=bool(data["private"]),
                        created_at=data["created_at"], dir=d)

    def create_repo(self, kind: str, repo_id: str, *, private: bool, author: str) -> RepoMeta:
        """Create an empty repo whose ``main`` branch holds an empty initial commit. The repo is
        assembled in tmp/ and renamed into place, so it appears complete or not at all."""
        if kind not in REPO_KINDS:
            raise BadRequest(
                f"unsupported repo type {kind!r} (this hub serves models and datasets)")
        namespace, _ = split_repo_id(repo_id)
        if namespace.lower() in RESERVED_NAMESPACES:
            raise BadRequest(f"namespace {namespace!r} is reserved")
        final = self.repo_dir(kind, repo_id)
        if final.exists():
            raise Conflict(f"You already created this {kind} repo: {repo_id}")
        created = utc_timestamp()
        initial = {"parent": None, "message": "initial commit", "description": "",
                   "author": author, "time": created, "tree": {}}
        commit_id = commit_id_of(initial)
        staging = Path(tempfile.mkdtemp(dir=self.tmp, prefix="repo-"))
        try:
            (staging / "commits").mkdir()
            (staging / "lfs").mkdir()
            self._write_json(staging / "repo.json", {"id": repo_id, "type": kind,
                                                     "private": bool(private),
                                                     "created_at": created})
            self._write_json(staging / "commits" / f"{commit_id}.json", initial)
            self._write_json(staging / "refs.json",
                             {"branches": {DEFAULT_BRANCH: commit_id}, "tags": {}})
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(staging, final)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise Conflict(f"You already created this {kind} repo: {repo_id}") from None
                raise
            fsync_dir(final.parent)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        meta = self.get_repo(kind, repo_id)
        if meta is None:
            raise Conflict(f"the {kind} repo {repo_id} was deleted while it was being created")
        return meta

    def delete_repo(self, meta: RepoMeta) -> None:
        """Remove the repo's records (its blobs stay in the shared store). Waits for a commit in
        progress; commits waiting for the lock then find the repo gone."""
        trash = Path(tempfile.mkdtemp(dir=self.tmp, prefix="deleted-"))
        try:
            with self._locked(meta):
                os.rename(meta.dir, trash / "repo")
        finally:
            shutil.rmtree(trash, ignore_errors=True)

    def set_private(self, meta: RepoMeta, private: bool) -> RepoMeta:
        with self._locked(meta):
            data = _read_json(meta.dir / "repo.json")
            data["private"] = bool(private)
            self._write_json(meta.dir / "repo.json", data)
        return RepoMeta(meta.kind, meta.id, bool(private), meta.created_at, meta.dir)

    @contextlib.contextmanager
    def _locked(self, meta: RepoMeta) -> Iterator[None]:
        try:
            fd = os.open(meta.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            raise RepoNotFound(f"Repository not found: {meta.id}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not (meta.dir / "refs.json").exists():  # deleted while we waited
                raise RepoNotFound(f"Repository not found: {meta.id}")
            yield
        finally:
            os.close(fd)

    # -- refs and commits ------------------------------------------------------------------

    def refs(self, meta: RepoMeta) -> dict[str, dict[str, str]]:
        try:
            return _read_json(meta.dir / "refs.json")
        except FileNotFoundError:
            raise RepoNotFound(f"Repository not found: {meta.id}") from None

    def read_commit(self, meta: RepoMeta, commit_id: str) -> Commit:
        cached = self._commits.get(commit_id)
        if cached is not None:
            return cached
        path = meta.dir / "commits" / f"{commit_id}.json"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise RevisionNotFound(f"Invalid rev id: {commit_id}") from None
        record = json.loads(raw)
        if commit_id_of(record) != commit_id:
            raise HubRequestError(f"commit {commit_id} of {meta.id} is corrupted", status=500)
        commit = Commit(id=commit_id, parent=record["parent"], message=record["message"],
                        description=record.get("description", ""), author=record["author"],
                        time=record["time"], tree=record["tree"])
        if len(self._commits) >= self._CACHE_MAX:
            self._commits.clear()
        self._commits[commit_id] = commit
        return commit

    def resolve(self, meta: RepoMeta, revision: str) -> Commit:
        """The commit a branch, tag (optionally ``refs/heads/``/``refs/tags/``-prefixed) or full
        commit id names. Raises RevisionNotFound."""
        refs = self.refs(meta)
        commit_id: str | None
        if revision.startswith("refs/heads/"):
            commit_id = refs["branches"].get(revision[len("refs/heads/"):])
        elif revision.startswith("refs/tags/"):
            commit_id = refs["tags"].get(revision[len("refs/tags/"):])
        else:
            commit_id = refs["branches"].get(revision) or refs["tags"].get(revision)
        if commit_id is None and COMMIT_ID.fullmatch(revision.lower()):
            if (meta.dir / "commits" / f"{revision.lower()}.json").exists():
                commit_id = revision.lower()
        if commit_id is None:
            raise RevisionNotFound(f"Invalid rev id: {revision}")
        return self.read_commit(meta, commit_id)

    def history(self, meta: RepoMeta, commit: Commit) -> Iterator[Commit]:
        """``commit`` and its ancestors, newest first."""
        current: Commit | None = commit
        while current is not None:
            yield current
            current = self.read_commit(meta, current.parent) if current.parent else None

    def commit(self, meta: RepoMeta, branch: str, ops: list[Op], *, message: str,
               description: str, author: str, parent_commit: str | None = None) -> Commit:
        """Apply ``ops`` to the head of ``branch`` as one new commit and move the branch to it.

        Runs under the repo lock, so concurrent commits serialize; ``parent_commit`` (a full id
        or a prefix of at least 5 hex digits) must be the branch head at that moment."""
        if not message.strip():
            raise BadRequest("the commit message cannot be empty")
        with self._locked(meta):
            refs = self.refs(meta)
            head_id = refs["branches"].get(branch)
            if head_id is None:
                if branch in refs["tags"] or COMMIT_ID.fullmatch(branch):
                    raise BadRequest(f"cannot commit to {branch!r}: not a branch")
                raise RevisionNotFound(f"Invalid rev id: {branch}")
            if parent_commit is not None:
                parent = parent_commit.lower()
                if len(parent) < 5 or not head_id.startswith(parent):
                    raise PreconditionFailed(
                        f"A commit has happened since: parent commit {parent_commit} is not the "
                        f"head of {branch!r} ({head_id})")
            head = self.read_commit(meta, head_id)
            tree = apply_ops(head.tree, ops)
            record = {"parent": head_id, "message": message, "description": description,
                      "author": author, "time": utc_timestamp(), "tree": tree}
            commit_id = commit_id_of(record)
            path = meta.dir / "commits" / f"{commit_id}.json"
            if not path.exists():
                self._write_json(path, record)
            refs["branches"][branch] = commit_id
            self._write_json(meta.dir / "refs.json", refs)
        return self.read_commit(meta, commit_id)

    def create_ref(self, meta: RepoMeta, kind: str, name: str, revision: str) -> Commit:
        """Create branch (``kind="branches"``) or tag (``"tags"``) ``name`` at ``revision``."""
        check_ref_name(name)
        with self._locked(meta):
            target = self.resolve(meta, revision)
            refs = self.refs(meta)
            if name in refs["branches"] or name in refs["tags"]:
                what = "Branch" if kind == "branches" else "Tag"
                raise Conflict(f"{what} {name!r} conflicts with an existing reference")
            refs[kind][name] = target.id
            self._write_json(meta.dir / "refs.json", refs)
        return target

    def delete_ref(self, meta: RepoMeta, kind: str, name: str) -> None:
        if kind == "branches" and name == DEFAULT_BRANCH:
            raise Forbidden(f"cannot delete the default branch {DEFAULT_BRANCH!r}")
        with self._locked(meta):
            refs = self.refs(meta)
            if name not in refs[kind]:
                raise RevisionNotFound(f"Invalid rev id: {name}")
            del refs[kind][name]
            self._write_json(meta.dir / "refs.json", refs)

    # -- LFS objects of a repo -------------------------------------------------------------

    def add_lfs_object(self, meta: RepoMeta, sha256: str) -> None:
        """Record that ``sha256`` was uploaded to this repo (a commit may then reference it)."""
        marker = meta.dir / "lfs" / sha256
        try:
            marker.touch()
        except FileNotFoundError:
            raise RepoNotFound(f"Repository not found: {meta.id}") from None

    def has_lfs_object(self, meta: RepoMeta, sha256: str) -> bool:
        """True if ``sha256`` was uploaded to this repo and the hub holds its content (a blob,
        or a Xet reconstruction). Content stored for another repo does not count: referencing
        it needs proof of possession (an upload)."""
        return (meta.dir / "lfs" / sha256).exists() and self.blob_size(sha256) is not None

    def blob_size(self, sha256: str) -> int | None:
        """The size of the LFS object ``sha256``: its blob's, or, for a file uploaded over Xet
        (kept only as xorbs), its reconstruction's."""
        size = super().blob_size(sha256)
        if size is None:
            found = self.xet.xet_hash_of(sha256)
            record = self.xet.file_record(found) if found else None
            size = record["size"] if record else None
        return size


def _locked_session_dir(tmp_root: Path) -> tuple[Path, int]:
    """A new ``session-*`` directory under ``tmp_root`` and an open descriptor holding its
    ``flock`` (released when the process ends). Another process starting at the same instant
    may remove the directory before the lock is taken: then make another."""
    for _ in range(5):
        session = Path(tempfile.mkdtemp(dir=tmp_root, prefix="session-"))
        try:
            fd = os.open(session, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.path.samestat(os.fstat(fd), os.stat(session)):
                return session, fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(f"cannot keep a session directory in {tmp_root}")


@contextlib.contextmanager
def _unless_held(entry: Path) -> Iterator[bool]:
    """For the block: False if ``entry`` is the session directory of a live Store; otherwise
    True, holding the entry's lock (if it is a session directory) so that no Store starting now
    can take it while it is removed."""
    if not entry.name.startswith("session-") or entry.is_symlink() or not entry.is_dir():
        yield True
        return
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())
