"""A model directory understood exactly, from headers and JSON only (no tensor data).

``ModelDir.open(path)`` lists the files, refuses symlinks that escape the directory (or its
Hugging Face cache repo), reads and validates every safetensors header and the shard index, and
loads JSON files lazily and strictly. Every other command builds on it.
"""

from __future__ import annotations

import os
import re
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

from .. import collector
from ..config.jsonfile import parse_json
from ..errors import ModelDirError, ShardIndexError
from .header_cache import RACY_WINDOW_NS, HeaderCache, checked_key
from .index_text import index_from_headers
from .layout import (  # noqa: F401  (the names' home; re-exported for their callers)
    BASE_RECORD,
    INDEX_NAME,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    SINGLE_SHARD_NAME,
    SKIPPED_DIRS,
    STATE_DIR,
    cache_link_targets,
    hf_cache_repo,
    is_model_path,
)
from .safetensors_io import ShardHeader, TensorInfo, parse_header, read_raw_header
from .shard_index import ShardIndex, index_defects, name_to_shard, parse_index, shard_set

__all__ = ["INDEX_NAME", "MANIFEST_NAME", "SIGNATURE_NAME", "ModelDir", "ModelFile", "ShardIndex",
           "parse_index"]

@dataclass(frozen=True)
class ModelFile:
    """A regular file of the model, reached directly or through a symlink."""

    relpath: str          # POSIX path relative to the model root
    path: Path            # the entry in the model directory (may be a symlink)
    size: int
    link_target: str | None = None   # raw readlink() text when the entry is a symlink
    stamp: tuple[int, int, int, int] | None = None
    """(st_dev, st_ino, st_size, st_mtime_ns) of the file (a symlink's target) when listed."""

    @property
    def is_symlink(self) -> bool:
        return self.link_target is not None


@dataclass
class ModelDir:
    """A validated, read-only view of a model directory."""

    root: Path
    files: dict[str, ModelFile]
    shards: dict[str, ShardHeader]             # relpath -> header, for every *.safetensors
    index: ShardIndex | None
    cache_repo: Path | None = None             # the models--org--name dir for HF snapshots
    subset: bool = False                       # only some files of root (a .gguf as MODEL)
    warnings: list[str] = field(default_factory=list)
    header_cache: HeaderCache | None = field(default=None, repr=False, compare=False)
    _json: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "ModelDir":
        """Read and validate the model directory at ``path``.

        Raises:
            ModelDirError, SafetensorsFormatError, ShardIndexError: naming the file and tensor.
        """
        root = Path(path)
        if not root.is_dir():
            raise ModelDirError("not a directory" if root.exists() else "no such directory",
                                where=root, hint="a model is a directory, one .gguf file or "
                                                 "hf://ORG/NAME[@REV]" if root.exists()
                                else _hub_hint(os.fspath(path)))
        cache_repo = hf_cache_repo(root)
        files = dict(_list_files(root, cache_repo))
        shard_names = sorted(p for p in files if p.endswith(".safetensors"))
        reader = _CachedReader(root, files, shard_names)
        model = cls(root=root, files=files, shards=reader.shards(), index=reader.index(),
                    cache_repo=cache_repo, header_cache=reader.cache)
        model._check_index(defects=not reader.index_checked())
        reader.save(model.index)
        return model

    # --- JSON ------------------------------------------------------------------------------

    def has(self, relpath: str) -> bool:
        return relpath in self.files

    def read_bytes(self, relpath: str) -> bytes:
        return self.files[relpath].path.read_bytes()

    def json(self, relpath: str) -> Any:
        """The parsed JSON file ``relpath`` (strict: UTF-8, no duplicate keys), or None if
        absent."""
        if relpath not in self._json:
            if relpath not in self.files:
                return None
            self._json[relpath] = parse_json(self.read_bytes(relpath), str(self.root / relpath))
        return self._json[relpath]

    def json_object(self, relpath: str) -> dict | None:
        """The JSON file ``relpath`` when it must hold an object: None if absent, else a dict.

        Raises:
            ModelDirError: the file is valid JSON but not an object (``[1]``, ``"x"``, ``null``).
        """
        doc = self.json(relpath)
        if doc is None and relpath not in self.files:
            return None
        if not isinstance(doc, dict):
            raise ModelDirError(f"is valid JSON but not an object (got {_json_type(doc)})",
                                where=str(self.root / relpath))
        return doc

    @property
    def config(self) -> dict:
        """config.json, or {} when the directory has none (a non-object is an error)."""
        return self.json_object("config.json") or {}

    @property
    def hf_quant_config(self) -> dict | None:
        """hf_quant_config.json, or None when the directory has none."""
        return self.json_object("hf_quant_config.json")

    # --- tensors ---------------------------------------------------------------------------

    @cached_property
    def tensor_shards(self) -> dict[str, str]:
        """tensor name -> shard relpath, over every shard the model loads."""
        return name_to_shard(self.shards, self.model_shards)

    @property
    def model_shards(self) -> list[str]:
        """Shards the model loads: the index's shards, or the single ``model.safetensors``."""
        if self.index is not None:
            return self.index.shards()
        return [SINGLE_SHARD_NAME] if SINGLE_SHARD_NAME in self.shards else []

    def tensors(self) -> Iterator[tuple[str, TensorInfo]]:
        """(shard relpath, tensor) over every tensor the model loads."""
        for shard in self.model_shards:
            for info in self.shards[shard].tensors.values():
                yield shard, info

    def tensor(self, name: str) -> TensorInfo | None:
        shard = self.tensor_shards.get(name)
        return self.shards[shard].tensors[name] if shard else None

    # --- validation ------------------------------------------------------------------------

    def _check_index(self, defects: bool = True) -> None:
        unloaded = sorted(set(self.shards) - set(self.model_shards))
        if self.index is None:
            _refuse_shards_without_index(self.root, self.shards)
            reason = (f"not loaded: there is no {INDEX_NAME}, and only {SINGLE_SHARD_NAME} "
                      f"is loaded without one")
        else:
            reason = f"not referenced by {INDEX_NAME}"
        for shard in unloaded:
            self.warnings.append(f"{shard}: {reason}; left as an opaque file")
        if self.index is None or not defects:
            return
        defects = index_defects(str(self.root / INDEX_NAME), self.index, self.shards)
        if defects:
            first = defects[0]
            more = f" (and {len(defects) - 1} more index defects)" if len(defects) > 1 else ""
            error = ShardIndexError(first.message + more, where=first.where, tensor=first.tensor,
                                    hint=first.hint)
            error.defects = defects
            raise error


def _json_type(doc: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(doc), type(doc).__name__)


def _refuse_shards_without_index(root: Path, shards: dict[str, ShardHeader]) -> None:
    """Shards named ``model-NNNNN-of-MMMMM.safetensors`` and neither an index nor a
    ``model.safetensors``: the index is missing, and the model is not an empty one."""
    if SINGLE_SHARD_NAME in shards:
        return
    sharded = [s for s in sorted(set(shards)) if (key := shard_set(s)) and key[0] == "model"]
    if sharded:
        raise ShardIndexError(
            f"sharded model without {INDEX_NAME}: {len(sharded)} shard file(s) such as "
            f"{sharded[0]} cannot be loaded without it", where=str(root),
            hint=f"download {INDEX_NAME} too")


_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[^\s/@]+)?")


def _hub_hint(text: str) -> str | None:
    """``org/name`` that is no directory here is most likely a hub repository."""
    if _REPO_ID.fullmatch(text) and not os.path.lexists(text.split("/", 1)[0]):
        return f"did you mean hf://{text}?"
    return None


def _list_files(root: Path, cache_repo: Path | None) -> Iterator[tuple[str, ModelFile]]:
    real_root = os.path.realpath(root)
    allowed = [real_root] + cache_link_targets(root)
    for dirpath, dirnames, filenames in os.walk(root):
        top = dirpath == str(root)
        dirnames[:] = sorted(d for d in dirnames if not (top and d in SKIPPED_DIRS))
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                raise ModelDirError("symlinked directories are not supported",
                                    where=os.path.join(dirpath, name))
        for name in sorted(filenames):
            if dirpath == str(root) and name in SKIPPED_DIRS:
                continue
            entry = Path(dirpath) / name
            relpath = entry.relative_to(root).as_posix()
            yield relpath, model_file(entry, relpath, allowed)


def model_file(entry: Path, relpath: str, allowed: list[str]) -> ModelFile:
    """The ``ModelFile`` at ``entry``; a symlink must resolve under one of ``allowed``."""
    if not entry.is_symlink():
        st = entry.lstat()
        if not stat.S_ISREG(st.st_mode):
            raise ModelDirError("not a regular file", where=entry)
        return ModelFile(relpath, entry, st.st_size, stamp=_stamp(st))
    target = os.readlink(entry)
    real = os.path.realpath(entry)
    if not any(real == a or real.startswith(a + os.sep) for a in allowed):
        raise ModelDirError(f"symlink to {target!r} escapes the model directory", where=entry,
                            hint="copy the file into the directory or link within it")
    if not os.path.exists(real):
        raise ModelDirError(f"dangling symlink to {target!r}", where=entry)
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise ModelDirError("symlink does not point to a regular file", where=entry)
    return ModelFile(relpath, entry, st.st_size, link_target=target, stamp=_stamp(st))


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def fingerprint(files: dict[str, ModelFile]) -> dict[str, tuple] | None:
    """What a plan read of a directory: every file's listing stamp and link text; None when a
    file has no stamp (a model on a hub)."""
    if any(f.stamp is None for f in files.values()):
        return None
    return {rel: (*f.stamp, f.link_target) for rel, f in files.items()}


def read_fingerprint(root: Path) -> dict[str, tuple]:
    """The ``fingerprint`` of the directory ``root`` as it is now."""
    return fingerprint(dict(_list_files(root, hf_cache_repo(root)))) or {}


class _CachedReader:
    """Headers and index from ``header_cache`` where the files' identities match, the rest read
    and parsed; ``save`` records what was read, and an index check that passed."""

    def __init__(self, root: Path, files: dict[str, ModelFile], shard_names: list[str]):
        self.root, self.files, self.names = root, files, shard_names
        self.observed = time.time_ns()
        self.stats = {rel: os.stat(files[rel].path)
                      for rel in [*shard_names, INDEX_NAME] if rel in files}
        self.cache = HeaderCache(root)
        self.key = checked_key(self.stats)
        self.checked = False

    def shards(self) -> dict[str, ShardHeader]:
        cache, root = self.cache, self.root
        found = {rel: cache.shard(rel, self.stats[rel], root / rel) for rel in self.names}
        read = _read_headers(root, [rel for rel, h in found.items() if h is None])
        for rel, header in read.items():
            cache.record(rel, self.stats[rel], header, self.observed)
        cache.forget(set(self.names))
        self._shards = {rel: found[rel] or read[rel] for rel in self.names}
        return self._shards

    def index(self) -> ShardIndex | None:
        if INDEX_NAME not in self.stats:
            return None
        cached = self.cache.index(self.key, self._shards)
        if cached is not None:
            self.checked = True
            return ShardIndex(*cached)
        raw = self.files[INDEX_NAME].path.read_bytes()
        proven = index_from_headers(raw, str(self.root / INDEX_NAME), self._shards)
        self.checked = proven is not None       # as good as checked: it is the headers'
        return proven or parse_index(raw, str(self.root / INDEX_NAME))

    def index_checked(self) -> bool:
        return self.checked

    def save(self, index: ShardIndex | None) -> None:
        """After a passing check: remember it, if every file is old enough to be cached."""
        if index is not None and all(st.st_mtime_ns <= self.observed - RACY_WINDOW_NS
                                     for st in self.stats.values()):
            self.cache.record_checked(self.key, index.weight_map, index.total_size,
                                      index.metadata, self._shards)
        self.cache.save()


def _read_headers(root: Path, names: list[str]) -> dict[str, ShardHeader]:
    # Threads overlap the per-file latency of network filesystems for the reads; the parsing
    # holds the GIL, so it runs here, serially (threads made it slower).
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(names)))) as pool:
        raw = list(pool.map(lambda n: read_raw_header(root / n, str(root / n)), names))
    # Parsing allocates hundreds of thousands of small objects that all stay alive.
    with collector.paused():
        return {name: parse_header(*r, str(root / name)) for name, r in zip(names, raw)}
