"""Remember sha256 digests of files by (device, inode, size, mtime_ns, ctime_ns), so nothing is
hashed twice.

One SQLite database, ``$MODELPATCH_CACHE_DIR/digests.sqlite3`` (default
``~/.cache/modelpatch/digests.sqlite3``), in WAL mode with a busy timeout, so that concurrent
modelpatch processes share it. It is only a cache: if it cannot be opened or written (read-only
home, full disk, a network file system without locking, a corrupt file), modelpatch logs one
warning and carries on without it.

Rules that keep it honest:

* A row answers only for a file whose device, inode, size, mtime_ns and ctime_ns all equal the
  row's. Rewriting, touching, truncating or replacing a file (a new inode) makes its row a miss,
  and so does a same-size edit that puts the mtime back (``cp -p``, ``rsync -a`` in place):
  nobody can set the ctime. Linking a file changes its ctime too: whoever links a file whose
  digest it knows records the digest again (``KnownDigests.rerecord``).
* "Racily clean" files are not recorded. A write within the file system's timestamp granularity of
  the moment its status was taken can leave size and mtime unchanged, so a file whose mtime is
  less than ``RACY_WINDOW_NS`` (2 s) before that moment is not cached (as git does for its index).
  A freshly written file therefore becomes cacheable once it is a couple of seconds old.
* ``verified`` says the digest was computed by modelpatch from the bytes themselves (hashed on
  read or while written). Unverified rows hold digests taken on trust (another tool's manifest).
  An unverified put never overwrites a verified row for the same file state.

The cache is as trustworthy as the directory it lives in: whoever can write it can make
``verify --fast`` accept a modified file. The directory is created with mode 0700.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, TypeVar

from .hashing import HashResult, hash_files_stat, hf_blob_sha256, is_sha256_hex

__all__ = [
    "CACHE_DIR_ENV",
    "CachedDigest",
    "DigestCache",
    "KnownDigest",
    "KnownDigests",
    "RACY_WINDOW_NS",
    "default_cache_path",
]

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "MODELPATCH_CACHE_DIR"
CACHE_FILE_NAME = "digests.sqlite3"
RACY_WINDOW_NS = 2_000_000_000
BUSY_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS digests_v2 (
    dev         INTEGER NOT NULL,
    ino         INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    mtime_ns    INTEGER NOT NULL,
    ctime_ns    INTEGER NOT NULL,
    sha256      TEXT    NOT NULL,
    verified    INTEGER NOT NULL,
    recorded_ns INTEGER NOT NULL,
    PRIMARY KEY (dev, ino)
) WITHOUT ROWID
"""

# One row per inode: a new state of the same file replaces the old row. An unverified digest
# does not replace a verified one for the same state.
_UPSERT = """
INSERT INTO digests_v2 (dev, ino, size, mtime_ns, ctime_ns, sha256, verified, recorded_ns)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (dev, ino) DO UPDATE SET
    size = excluded.size, mtime_ns = excluded.mtime_ns, ctime_ns = excluded.ctime_ns,
    sha256 = excluded.sha256, verified = excluded.verified, recorded_ns = excluded.recorded_ns
WHERE excluded.verified = 1 OR digests_v2.verified = 0
   OR digests_v2.size != excluded.size OR digests_v2.mtime_ns != excluded.mtime_ns
   OR digests_v2.ctime_ns != excluded.ctime_ns
"""

P = TypeVar("P")
_INHERITED: list[sqlite3.Connection] = []


def default_cache_path() -> Path:
    """``$MODELPATCH_CACHE_DIR/digests.sqlite3``, else ``~/.cache/modelpatch/digests.sqlite3``."""
    base = os.environ.get(CACHE_DIR_ENV)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "modelpatch"
    return root / CACHE_FILE_NAME


def _i64(v: int) -> int:
    # st_dev / st_ino are unsigned 64-bit (overlayfs xino, NFS set the top bits); SQLite stores
    # signed 64-bit integers.
    return v - (1 << 64) if v >= (1 << 63) else v


@dataclass(frozen=True)
class CachedDigest:
    sha256: str
    verified: bool
    recorded_at: float
    """When the row was recorded (seconds since the epoch)."""


class DigestCache:
    """sha256 digests keyed by (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns); thread- and
    process-safe.

    Opened lazily on first use. Every failure degrades it to a no-op (with one warning): ``get``
    misses and ``put`` does nothing, so a command never fails because of its cache.

    Example:
        >>> cache = DigestCache()  # doctest: +SKIP
        >>> st = os.stat(path)
        >>> hit = cache.get(st, require_verified=True)
        >>> if hit is None:
        ...     cache.put(st, sha256_file(path), verified=True)
    """

    def __init__(self, path: str | os.PathLike | None = None, *, enabled: bool = True):
        self._open_error: BaseException | None = None
        try:
            self._path = Path(path) if path is not None else default_cache_path()
        except (RuntimeError, KeyError, OSError) as exc:  # no home directory to expand
            self._path, self._open_error = Path(os.devnull), exc
        self._enabled = enabled
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._lock = threading.RLock()
        self._warned = False

    @classmethod
    def disabled(cls) -> "DigestCache":
        """A cache that never hits and records nothing."""
        return cls(os.devnull, enabled=False)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def enabled(self) -> bool:
        """False once the cache has been disabled (by request or after an error)."""
        return self._enabled

    # -- connection ----------------------------------------------------------------------------

    def _disable(self, exc: BaseException) -> None:
        self._enabled = False
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None
        if not self._warned:
            self._warned = True
            log.warning("digest cache %s unavailable, continuing without it: %s "
                        "(set %s to a writable directory, or delete the file if it is corrupt)",
                        self._path, exc, CACHE_DIR_ENV)

    def _connection(self) -> sqlite3.Connection | None:
        if not self._enabled:
            return None
        if self._open_error is not None:
            self._disable(self._open_error)
            return None
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        # First use, or first use in a forked child: never share a connection across fork().
        # A connection inherited from the parent is kept referenced, never used or closed here:
        # closing it in the child could disturb the parent's locks.
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None
        try:
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            conn = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise sqlite3.OperationalError(f"cannot use WAL journal mode (got {mode})")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute(_SCHEMA)
            except BaseException:
                conn.close()
                raise
        except (sqlite3.Error, OSError) as exc:
            self._disable(exc)
            return None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                if self._pid == os.getpid():
                    try:
                        self._conn.close()
                    except sqlite3.Error:
                        pass
                else:
                    _INHERITED.append(self._conn)
            self._conn = None

    def __enter__(self) -> "DigestCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- queries -------------------------------------------------------------------------------

    def get(self, st: os.stat_result, *, require_verified: bool = False) -> CachedDigest | None:
        """The digest recorded for the file whose status is ``st``, or None.

        A row answers only if device, inode, size, mtime_ns and ctime_ns all match ``st``. With
        ``require_verified``, rows taken on trust are misses.
        """
        with self._lock:
            conn = self._connection()
            if conn is None:
                return None
            try:
                row = conn.execute(
                    "SELECT size, mtime_ns, ctime_ns, sha256, verified, recorded_ns "
                    "FROM digests_v2 "
                    "WHERE dev = ? AND ino = ?", (_i64(st.st_dev), _i64(st.st_ino))).fetchone()
            except sqlite3.Error as exc:
                self._disable(exc)
                return None
        if row is None:
            return None
        size, mtime_ns, ctime_ns, sha256, verified, recorded_ns = row
        if (size, mtime_ns, ctime_ns) != (st.st_size, st.st_mtime_ns, st.st_ctime_ns) \
                or not is_sha256_hex(sha256):
            return None
        if require_verified and not verified:
            return None
        return CachedDigest(sha256, bool(verified), recorded_ns / 1e9)

    def put(self, st: os.stat_result, sha256: str, *, verified: bool,
            observed_ns: int | None = None) -> bool:
        """Record ``sha256`` for the file whose status is ``st``; return whether it was recorded.

        ``observed_ns`` is a ``time.time_ns()`` taken before ``st`` was (default: now). A file
        modified less than ``RACY_WINDOW_NS`` before that is not recorded (see the module notes).
        """
        return self.put_many([(st, sha256, verified)], observed_ns=observed_ns) == 1

    def put_many(self, items: Iterable[tuple[os.stat_result, str, bool]], *,
                 observed_ns: int | None = None) -> int:
        """Record many ``(stat, sha256, verified)`` in one transaction; return how many were kept.
        """
        now = time.time_ns()
        observed = now if observed_ns is None else observed_ns
        rows = []
        for st, sha256, verified in items:
            if not is_sha256_hex(sha256):
                raise ValueError(f"not a sha256 hex digest: {sha256!r}")
            if st.st_mtime_ns > observed - RACY_WINDOW_NS:
                continue  # racily clean: a later write could keep size and mtime
            rows.append((_i64(st.st_dev), _i64(st.st_ino), st.st_size, st.st_mtime_ns,
                         st.st_ctime_ns, sha256, 1 if verified else 0, now))
        if not rows:
            return 0
        with self._lock:
            conn = self._connection()
            if conn is None:
                return 0
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany(_UPSERT, rows)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._disable(exc)
                return 0
        return len(rows)


@dataclass(frozen=True)
class KnownDigest:
    sha256: str
    verified: bool
    source: str
    """``"cache"`` (the digest cache) or ``"hf-blob"`` (a Hugging Face cache blob name)."""


class KnownDigests:
    """Answers "what is the sha256 of this file?" without hashing when possible.

    Sources, in order: the :class:`DigestCache` (matching device, inode, size, mtime_ns, ctime_ns),
    then the
    name of the Hugging Face cache blob a snapshot symlink points to. HF blob names are claims
    (``verified=False``): ``require_verified=True`` ignores them, as ``verify`` must.

    Example:
        >>> known = KnownDigests()  # doctest: +SKIP
        >>> digests = known.digests(paths, on_progress=bar.update)  # hashes only the unknown
    """

    def __init__(self, cache: DigestCache | None = None, *, use_hf_blob_names: bool = True):
        self.cache = cache if cache is not None else DigestCache()
        self.use_hf_blob_names = use_hf_blob_names

    def lookup(self, path: str | os.PathLike, *, st: os.stat_result | None = None,
               require_verified: bool = False) -> KnownDigest | None:
        """The known digest of ``path`` (symlinks followed), or None. ``st``: its ``os.stat``."""
        if st is None:
            try:
                st = os.stat(path)
            except OSError:
                return None
        hit = self.cache.get(st, require_verified=require_verified)
        if hit is not None:
            return KnownDigest(hit.sha256, hit.verified, "cache")
        if self.use_hf_blob_names and not require_verified:
            name = hf_blob_sha256(path)
            if name is not None:
                return KnownDigest(name, False, "hf-blob")
        return None

    def sha256(self, path: str | os.PathLike, *, require_verified: bool = False) -> str | None:
        known = self.lookup(path, require_verified=require_verified)
        return known.sha256 if known is not None else None

    def record(self, st: os.stat_result, sha256: str, *, verified: bool = True,
               observed_ns: int | None = None) -> bool:
        """Remember a digest computed for the file whose status is ``st`` (see DigestCache.put)."""
        return self.cache.put(st, sha256, verified=verified, observed_ns=observed_ns)

    def record_results(self, results: Iterable[HashResult], *, observed_ns: int) -> int:
        """Remember freshly computed digests as verified; unstable ones (file changed while read)
        are skipped. ``observed_ns``: a ``time.time_ns()`` taken before hashing began."""
        return self.cache.put_many(((r.stat, r.sha256, True) for r in results if r.stable),
                                   observed_ns=observed_ns)

    def digests(self, paths: Iterable[P], *, jobs: int | None = None, on_progress=None,
                require_verified: bool = False) -> dict[P, str]:
        """``{path: sha256}``: known digests looked up, the rest hashed in parallel and recorded."""
        out: dict[P, str] = {}
        todo: list[P] = []
        for p in dict.fromkeys(paths):
            known = self.lookup(p, require_verified=require_verified)  # type: ignore[arg-type]
            if known is not None:
                out[p] = known.sha256
            else:
                todo.append(p)
        if todo:
            observed = time.time_ns()
            results = hash_files_stat(todo, jobs=jobs, on_progress=on_progress)
            self.record_results(results.values(), observed_ns=observed)
            out.update((p, r.sha256) for p, r in results.items())
        return out

    def iter_unknown(self, paths: Iterable[P], *, require_verified: bool = False) -> Iterator[P]:
        """The paths whose digest is not known (those :meth:`digests` would hash)."""
        for p in paths:
            if self.lookup(p, require_verified=require_verified) is None:  # type: ignore[arg-type]
                yield p
