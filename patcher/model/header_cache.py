"""Validated safetensors headers and shard indexes, remembered by file identity.

A config-only apply or a plan of a Kimi-K2.5-sized checkpoint (273k tensors, 119 shards) spends
most of its time parsing 35 MB of header JSON and a 29 MB shard index. This cache keeps, per model
directory, what ``ModelDir.open`` derived from them: each shard's tensor columns, the index's
weight map, and whether the index matched the headers. Every entry is keyed by the identity of
the files it came from, as the digest cache's rows are: (device, inode, size, mtime_ns,
ctime_ns), followed through symlinks.

Rules (those of ``patcher.integrity.digest_cache``):

* Any change of a file's identity is a miss: a rewrite, a touch, a same-size edit whose mtime is
  put back (its ctime moves), a replacement (a new inode). A file modified less than
  ``RACY_WINDOW_NS`` before it was read is not recorded.
* Nothing read back is trusted: the file carries the sha256 of its payload, and every cached
  header passes the same whole-column checks as a freshly parsed one
  (``tensor_table.checked_table``) before it is used. A cache that is unreadable, corrupt, of
  another version or for another directory is ignored, never an error.
* Bounded: two files per model directory under ``$MODELPATCH_CACHE_DIR/headers`` (mode 0700):
  ``<key>.ids``, small (identities, checks, the index's order, and where each shard's columns
  lie in ``<key>.bin`` with their sha256), and ``<key>.bin``, the columns. A command reads
  ``.ids`` only, and a blob of ``.bin`` when it first looks at that shard's tensors; linking the
  base into a variant rewrites ``.ids`` alone. The least recently written pairs are removed
  beyond ``MAX_FILES`` or ``MAX_BYTES``. Each file is written to a temporary file and renamed
  into place; never fsynced (it is only a cache).

As for the digest cache, whoever can write the cache directory can make modelpatch read a
header that is valid but not the file's; the directory is the user's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import marshal
import os
import time
from array import array
from collections.abc import Mapping
from itertools import chain, count, islice, repeat
from operator import le
from pathlib import Path
from typing import Any

from .safetensors_io import DTYPE_BITS, ShardHeader, read_header
from .tensor_table import LazyTable, TensorTable, checked_table

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "MODELPATCH_CACHE_DIR"     # shared with patcher.integrity.digest_cache
RACY_WINDOW_NS = 2_000_000_000
MAX_FILES = 32
MAX_BYTES = 1 << 30
_MAGIC = b"modelpatch-headers-2\n"
_DTYPE_NAMES = tuple(sorted(DTYPE_BITS))
_DTYPE_CODE = {name: i for i, name in enumerate(_DTYPE_NAMES)}

Identity = tuple[int, int, int, int, int]


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def cache_dir() -> Path:
    base = os.environ.get(CACHE_DIR_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "modelpatch") / "headers"


def _cache_file(root: Path) -> tuple[Path, str]:
    """The ``.ids`` file of ``root`` (its ``.bin`` beside it), and root's real path."""
    real = os.path.realpath(root)
    return cache_dir() / (hashlib.sha256(real.encode("utf-8", "surrogatepass")).hexdigest()[:32]
                          + ".ids"), real


class HeaderCache:
    """The cached headers of one model directory, loaded once; ``save`` writes them back.

    Entries: ``shards``: relpath -> (identity, header_len, metadata, columns: a marshal blob
    not yet written, else its (sha256, offset, length) in the ``.bin`` file, read and decoded
    only when a command looks at the tensors); ``checked``: the identities of the index
    and of every shard when the index last matched the headers, with ``index``: its weight map
    as positions among the headers' tensors (valid only while ``checked`` holds)."""

    def __init__(self, root: Path):
        self.entries: dict[str, Any] = {"shards": {}, "checked": None, "index": None}
        self.dirty = False
        try:
            self.path, self.real = _cache_file(root)
        except (OSError, RuntimeError, KeyError):     # no home directory
            self.path = None
            return
        loaded = _read(self.path, self.real)
        if loaded is not None:
            self.entries = loaded

    def shard(self, relpath: str, st: os.stat_result, path: Path) -> ShardHeader | None:
        """The cached header of ``relpath`` if its identity is ``st``'s. Its tensors are
        checked when first used; a cached table that fails the checks is replaced by the file's
        own header, read then."""
        entry = self.entries["shards"].get(relpath)
        if entry is None or entry[0] != identity(st):
            return None
        _, header_len, metadata, blob = entry
        data_size = st.st_size - 8 - header_len
        if data_size < 0 or (metadata is not None and not _string_map(metadata)) or \
                not (isinstance(blob, bytes) or _is_ref(blob)):
            return None
        return ShardHeader(path=path, header_len=header_len, file_size=st.st_size,
                           tensors=LazyTable(lambda: _decoded(self._blob(blob), data_size,
                                                              path)),
                           metadata=metadata)

    def _blob(self, ref) -> bytes | None:
        """A blob recorded in this run, or the one ``ref`` names in ``.bin`` if its sha256
        matches (else None)."""
        if isinstance(ref, bytes):
            return ref
        digest, offset, length = ref
        try:
            with open(self.path.with_suffix(".bin"), "rb") as f:
                blob = os.pread(f.fileno(), length, offset)
        except OSError:
            return None
        return blob if hashlib.sha256(blob).digest() == digest else None

    def index(self, key: tuple, shards: dict[str, ShardHeader]) -> tuple | None:
        """(weight_map, total_size, metadata, shard names) when the index was checked against
        headers of exactly these identities (``key``); the weight map is built when first used."""
        entry = self.entries["index"]
        if entry is None or self.entries["checked"] != key:
            return None
        try:
            positions, total, metadata, names = entry
            if not ((positions in _ORDERS or isinstance(positions, bytes)
                     and len(positions) % 4 == 0)
                    and isinstance(metadata, dict) and set(names) <= shards.keys()):
                return None
        except (TypeError, ValueError):
            return None
        return (LazyMap(lambda: ordered_weight_map(positions, names, shards)), total,
                metadata, tuple(names))

    def record(self, relpath: str, st: os.stat_result, header: ShardHeader,
               observed_ns: int) -> None:
        if self.path is None or st.st_mtime_ns > observed_ns - RACY_WINDOW_NS:
            return
        names, dtypes, shapes, starts, ends = _columns(header.tensors)
        blob = marshal.dumps((names, bytes(map(_DTYPE_CODE.__getitem__, dtypes)), shapes,
                              starts, ends))
        self.entries["shards"][relpath] = (identity(st), header.header_len, header.metadata,
                                           blob)
        self.dirty = True

    def record_checked(self, key: tuple, weight_map, total: int | None, metadata: dict,
                       shards: dict[str, ShardHeader]) -> None:
        """The index matched these headers: remember that, and its weight map's order."""
        if self.path is None or self.entries["checked"] == key:
            return
        # An index proven by its text (patcher.model.index_text) knows its order and shards.
        order = getattr(weight_map, "order", None)
        names = sorted(set(weight_map.values())) if order is None else list(weight_map.names)
        self.entries["checked"] = key
        self.entries["index"] = (order or _order(weight_map, names, shards), total, metadata,
                                 names)
        self.dirty = True

    def forget(self, keep: set[str]) -> None:
        """Drop the entries of shards no longer in the directory."""
        gone = set(self.entries["shards"]) - keep
        for relpath in gone:
            del self.entries["shards"][relpath]
        self.dirty = self.dirty or bool(gone)

    def refresh(self, stats: dict[str, os.stat_result]) -> None:
        """Take new ctimes of unchanged files (same device, inode, size and mtime): linking a
        file into a variant changes its ctime, which would otherwise make every entry miss."""
        def same(old, new):
            return old[:4] == new[:4]

        for rel, entry in list(self.entries["shards"].items()):
            st = stats.get(rel)
            if st is not None and entry[0] != identity(st) and same(entry[0], identity(st)):
                self.entries["shards"][rel] = (identity(st), *entry[1:])
                self.dirty = True
        checked = self.entries["checked"]
        if checked is not None:
            new = tuple((rel, identity(stats[rel])) if rel in stats and same(i, identity(
                stats[rel])) else (rel, i) for rel, i in checked)
            if new != checked:
                self.entries["checked"] = new
                self.dirty = True

    def save(self) -> None:
        """Write the entries back if they changed (atomically; failures only logged): a new
        ``.bin`` when columns were recorded, then ``.ids``."""
        if self.path is None or not self.dirty:
            return
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            shards = self.entries["shards"]
            if any(isinstance(e[3], bytes) for e in shards.values()):
                self._write_blobs(shards)
            payload = marshal.dumps((self.real, self.entries))
            _write(self.path, _MAGIC + hashlib.sha256(payload).digest() + payload)
            _evict(self.path.parent, self.path)
        except (OSError, ValueError) as exc:
            log.warning("header cache %s not written: %s", self.path, exc)
        self.dirty = False

    def _write_blobs(self, shards: dict) -> None:
        """One ``.bin`` with every shard's columns; entries then refer to it."""
        parts, refs, offset = [], {}, 0
        for rel, entry in shards.items():
            blob = self._blob(entry[3])
            if blob is None:
                continue
            parts.append(blob)
            refs[rel] = (hashlib.sha256(blob).digest(), offset, len(blob))
            offset += len(blob)
        _write(self.path.with_suffix(".bin"), b"".join(parts))
        self.entries["shards"] = {rel: (*shards[rel][:3], ref) for rel, ref in refs.items()}


class LazyMap(Mapping):
    """A read-only mapping that ``load`` builds on first use."""

    def __init__(self, load):
        self._load, self._map = load, None

    def _m(self) -> dict:
        if self._map is None:
            self._map = self._load()
        return self._map

    def __getitem__(self, key):
        return self._m()[key]

    def __iter__(self):
        return iter(self._m())

    def __len__(self) -> int:
        return len(self._m())

    def __contains__(self, key) -> bool:
        return key in self._m()

    def values(self):
        return self._m().values()

    def items(self):
        return self._m().items()

    def __eq__(self, other) -> bool:
        return self._m() == (other._m() if isinstance(other, LazyMap) else other)


def checked_key(stats: dict[str, os.stat_result]) -> tuple:
    """What an index check depends on: the identity of the index and of every shard."""
    return tuple(sorted((rel, identity(st)) for rel, st in stats.items()))


def refresh(model, relpaths: list[str]) -> None:
    """After linking files of ``model`` (a ``ModelDir``) into a variant: keep its cache entries
    (see ``HeaderCache.refresh``)."""
    cache = model.header_cache
    if cache is None or cache.path is None or not cache.entries["shards"]:
        return
    stats = {}
    for rel in relpaths:
        try:
            stats[rel] = os.stat(model.root / rel)
        except OSError:
            pass
    cache.refresh(stats)
    cache.save()


def _columns(tensors) -> tuple:
    if isinstance(tensors, TensorTable):
        return tensors.columns()
    rows = [(n, t.dtype, list(t.shape), t.start, t.end) for n, t in tensors.items()]
    return tuple(map(list, zip(*rows))) if rows else ([], [], [], [], [])


def _is_ref(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], bytes) and \
        all(isinstance(v, int) and v >= 0 for v in value[1:])


def _write(path: Path, data: bytes) -> None:
    # os.open, not tempfile: importing tempfile costs every command about 20 ms
    tmp = path.with_name(f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _decoded(blob: bytes | None, data_size: int, path: Path) -> TensorTable:
    """The cached columns, if they pass the checks of a freshly parsed header; else the file's
    own header."""
    try:
        names, codes, shapes, starts, ends = marshal.loads(blob)
        if isinstance(codes, bytes) and len(set(names)) == len(names):
            table = checked_table(names, list(map(_DTYPE_NAMES.__getitem__, codes)), shapes,
                                  starts, ends, data_size)
            if table is not None:
                return table
    except (ValueError, EOFError, TypeError, IndexError):
        pass
    log.warning("header cache: the entry for %s does not check out; reading the file", path)
    return TensorTable(*_columns(read_header(path).tensors))


_ORDERS = ("headers", "sorted")


def _order(weight_map, names: list[str], shards: dict[str, ShardHeader]):
    """How to rebuild the weight map's key order from the headers: ``"headers"`` (the order of
    the shards' headers), ``"sorted"`` (by name, as most writers emit it), else the position of
    each key among the headers' tensors."""
    keys = list(weight_map)
    tensor = list(chain.from_iterable(shards[s].tensors for s in names))
    if keys == tensor:
        return "headers"
    if all(map(le, keys, islice(keys, 1, None))):
        return "sorted"
    position = dict(zip(tensor, count()))
    return array("I", map(position.__getitem__, keys)).tobytes()


def ordered_weight_map(positions, names: list[str], shards: dict[str, ShardHeader]) -> dict:
    """The weight map of the shards ``names`` in the order ``positions`` (see ``_order``)."""
    tables = [shards[s].tensors for s in names]
    tensor = list(chain.from_iterable(tables))
    shard = list(chain.from_iterable(map(repeat, names, map(len, tables))))
    if positions == "headers":
        return dict(zip(tensor, shard))
    if positions == "sorted":
        return dict(sorted(zip(tensor, shard)))
    order = array("I", positions)
    return dict(zip(map(tensor.__getitem__, order), map(shard.__getitem__, order)))


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(type(k) is str and type(v) is str
                                           for k, v in value.items())


def _read(path: Path, real: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    head = len(_MAGIC) + 32
    if not blob.startswith(_MAGIC) or hashlib.sha256(blob[head:]).digest() != \
            blob[len(_MAGIC):head]:
        return None
    try:
        owner, entries = marshal.loads(blob[head:])
    except (ValueError, EOFError, TypeError):
        return None
    if owner != real or not isinstance(entries, dict) or \
            not isinstance(entries.get("shards"), dict) or set(entries) != {
                "shards", "checked", "index"}:
        return None
    return entries


def _evict(directory: Path, keep: Path) -> None:
    """Remove the least recently written cache pairs beyond MAX_FILES or MAX_BYTES."""
    pairs: dict[str, list] = {}
    for entry in os.scandir(directory):
        st = entry.stat(follow_symlinks=False)
        if entry.name.startswith(".tmp-"):
            if st.st_mtime < time.time() - 3600:
                os.unlink(entry.path)
            continue
        stem, _, suffix = entry.name.rpartition(".")
        if suffix in ("ids", "bin"):
            pair = pairs.setdefault(stem, [0, 0])
            pair[0] = max(pair[0], st.st_mtime_ns)
            pair[1] += st.st_size
    total = 0
    for n, (stem, (_, size)) in enumerate(sorted(pairs.items(), key=lambda p: -p[1][0])):
        total += size
        if stem != keep.stem and (n >= MAX_FILES or total > MAX_BYTES):
            for suffix in (".ids", ".bin"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / (stem + suffix))
