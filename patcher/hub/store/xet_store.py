"""Xet storage of the embedded hub, under ``ROOT/xet/`` beside the LFS blob store::

    xorbs/ab/<xorb hash>          a xorb as uploaded (read-only), shared by every repo
    xorbs/ab/<xorb hash>.idx      its chunks: 48 bytes each (offset, stored size, size, hash)
    files/ab/<file hash>.json     a file's reconstruction: {"size", "sha256", "terms"}
    sha256/ab/<sha256>            the Xet file hash of an LFS object (text)
    chunks/ab/<chunk hash>/<xorb> global dedupe index: xorbs holding an eligible chunk
    xorb-repos/ab/<xorb>/<key>    the repos a xorb was uploaded to or is used by (access checks)
    gc.lock                       flock: shared while files register, exclusive while gc sweeps

Names are Xet hash strings (64 lowercase hex digits, checked here before any path is built).
A xorb's index is written before the xorb itself, and both through ``tmp/`` and a rename, so a
present xorb always has its index; ``gc`` removes the xorb first."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any, Iterator

from ...errors import XetFormatError
from ...fsops import replace_file
from ..request_errors import BadRequest
from ..xet import hashing
from ..xet.xorb import ChunkRecord, iter_xorb, read_chunks, records_hash

_INDEX = struct.Struct("<QII32s")
# a chunk's hash qualifies for the global dedupe index when its last 8 bytes, as a little-endian
# u64, are 0 modulo this (the protocol's rule; the first chunk of every file qualifies too)
DEDUPE_MODULUS = 1024


def checked_hex(value: str, what: str = "Xet hash") -> str:
    if not isinstance(value, str) or not hashing.is_hash_hex(value):
        raise BadRequest(f"malformed {what}: expected 64 lowercase hexadecimal digits")
    return value


def dedupe_eligible(raw_hash: bytes) -> bool:
    return int.from_bytes(raw_hash[24:32], "little") % DEDUPE_MODULUS == 0


def repo_key(kind: str, repo_id: str) -> str:
    return hashlib.sha256(f"{kind}/{repo_id}".encode()).hexdigest()[:40]


class XetStore:
    """Xorbs, file reconstructions and their indexes under ``root``; temp files in ``tmp``."""

    _CACHE_MAX = 256

    def __init__(self, root: Path, tmp: Path):
        self.root = Path(root)
        self.tmp = tmp
        for sub in ("xorbs", "files", "sha256", "chunks", "xorb-repos"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._indexes: dict[str, list[ChunkRecord]] = {}

    def _path(self, section: str, hexhash: str, suffix: str = "") -> Path:
        checked_hex(hexhash)
        return self.root / section / hexhash[:2] / (hexhash + suffix)

    # -- the gc lock -----------------------------------------------------------------------

    @contextlib.contextmanager
    def gc_lock(self, exclusive: bool) -> Iterator[None]:
        """Shared while files register (their xorbs must not vanish meanwhile), exclusive while
        ``gc`` decides and deletes."""
        fd = os.open(self.root / "gc.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    # -- xorbs -----------------------------------------------------------------------------

    def xorb_path(self, hexhash: str) -> Path:
        return self._path("xorbs", hexhash)

    def xorb_size(self, hexhash: str) -> int | None:
        try:
            return self.xorb_path(hexhash).stat().st_size
        except FileNotFoundError:
            return None

    def has_xorb(self, hexhash: str) -> bool:
        return self.xorb_size(hexhash) is not None

    def xorb_chunks(self, hexhash: str) -> list[ChunkRecord]:
        """The chunks of a stored xorb (from its index); XetFormatError if it is not stored."""
        cached = self._indexes.get(hexhash)
        if cached is not None:
            return cached
        try:
            raw = self._path("xorbs", hexhash, ".idx").read_bytes()
        except FileNotFoundError:
            raise XetFormatError(f"xorb {hexhash} is not stored on this hub") from None
        records = [ChunkRecord(offset, stored, size, digest)
                   for offset, stored, size, digest in _INDEX.iter_unpack(raw)]
        if len(self._indexes) >= self._CACHE_MAX:
            self._indexes.clear()
        self._indexes[hexhash] = records
        return records

    def put_xorb(self, hexhash: str, data: bytes, max_chunks: int) -> bool:
        """Store an uploaded xorb after decoding every chunk and recomputing the xorb's hash
        from them; XetFormatError if it is malformed or its hash is not ``hexhash``. Returns
        False when it was already stored."""
        checked_hex(hexhash)
        if self.has_xorb(hexhash):
            return False
        records = [record for record, _ in iter_xorb(data, max_chunks)]
        if not records:
            raise XetFormatError("the xorb has no chunks")
        actual = hashing.hash_to_hex(records_hash(records))
        if actual != hexhash:
            raise XetFormatError(f"the xorb's chunks hash to {actual}, not {hexhash}")
        end = records[-1].end
        self.store_xorb(hexhash, data[:end], records)
        return True

    def store_xorb(self, hexhash: str, data: bytes, records: list[ChunkRecord]) -> None:
        """Write a xorb whose records are known good (checked, or built by this hub)."""
        index = b"".join(_INDEX.pack(r.offset, r.stored_size, r.size, r.hash) for r in records)
        path = self.xorb_path(hexhash)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(self._path("xorbs", hexhash, ".idx"), index, mode=0o444, tmp_dir=self.tmp,
                     prefix="xorb-")
        replace_file(path, data, mode=0o444, tmp_dir=self.tmp, prefix="xorb-")
        for record in records:
            if dedupe_eligible(record.hash):
                self.index_chunk(hashing.hash_to_hex(record.hash), hexhash)

    def read_chunks(self, hexhash: str, start: int, end: int) -> list[bytes]:
        """The raw bytes of chunks ``[start, end)`` of a stored xorb."""
        records = self.xorb_chunks(hexhash)
        if not 0 <= start < end <= len(records):
            raise XetFormatError(f"chunks [{start}, {end}) are outside xorb {hexhash} "
                                 f"({len(records)} chunks)")
        wanted = records[start:end]
        with open(self.xorb_path(hexhash), "rb") as f:
            f.seek(wanted[0].offset)
            data = f.read(wanted[-1].end - wanted[0].offset)
        return read_chunks(data, start, wanted)

    # -- which repos a xorb belongs to -----------------------------------------------------

    def mark_xorb(self, hexhash: str, kind: str, repo_id: str) -> None:
        """Record that ``hexhash`` was uploaded to, or is used by, the repo."""
        folder = self._path("xorb-repos", hexhash)
        marker = folder / repo_key(kind, repo_id)
        if marker.exists():
            return
        folder.mkdir(parents=True, exist_ok=True)
        replace_file(marker, f"{kind}\n{repo_id}\n".encode(), mode=0o444, tmp_dir=self.tmp,
                     prefix="mark-")

    def xorb_repos(self, hexhash: str) -> list[tuple[str, str]]:
        folder = self._path("xorb-repos", hexhash)
        out = []
        with contextlib.suppress(FileNotFoundError):
            for marker in folder.iterdir():
                kind, _, rest = marker.read_text().partition("\n")
                out.append((kind, rest.strip()))
        return out

    # -- global dedupe index ---------------------------------------------------------------

    def index_chunk(self, chunk_hex: str, xorb_hex: str) -> None:
        folder = self._path("chunks", chunk_hex)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / checked_hex(xorb_hex)).touch()

    def chunk_xorbs(self, chunk_hex: str) -> list[str]:
        """Stored xorbs holding the (dedupe-eligible) chunk ``chunk_hex``."""
        folder = self._path("chunks", chunk_hex)
        try:
            names = sorted(entry.name for entry in folder.iterdir())
        except FileNotFoundError:
            return []
        return [name for name in names if hashing.is_hash_hex(name) and self.has_xorb(name)]

    # -- files -----------------------------------------------------------------------------

    def file_record(self, file_hex: str) -> dict[str, Any] | None:
        """``{"size", "sha256", "terms": [[xorb, start, end, size], ...]}`` or None."""
        try:
            return json.loads(self._path("files", file_hex, ".json").read_bytes())
        except FileNotFoundError:
            return None

    def put_file_record(self, file_hex: str, record: dict[str, Any]) -> None:
        path = self._path("files", file_hex, ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(record, separators=(",", ":")).encode(), mode=0o444,
                     tmp_dir=self.tmp, prefix="xfile-")

    def set_xet_hash(self, sha256: str, file_hex: str) -> None:
        path = self._path("sha256", sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, checked_hex(file_hex).encode(), mode=0o444, tmp_dir=self.tmp,
                     prefix="xsha-")

    def xet_hash_of(self, sha256: str) -> str | None:
        """The Xet file hash of an LFS object, if the hub has its reconstruction."""
        try:
            found = self._path("sha256", sha256).read_text().strip()
        except FileNotFoundError:
            return None
        if not hashing.is_hash_hex(found) or self.file_record(found) is None:
            return None
        return found

    def file_xorbs(self, file_hex: str) -> set[str]:
        record = self.file_record(file_hex)
        return {term[0] for term in record["terms"]} if record else set()

    # -- listing (gc) ----------------------------------------------------------------------

    def iter_hex(self, section: str, suffix: str = "") -> Iterator[tuple[str, Path]]:
        for sub in sorted((self.root / section).iterdir()):
            if not sub.is_dir():
                continue
            for entry in sub.iterdir():
                name = entry.name
                if suffix:
                    if not name.endswith(suffix):
                        continue
                    name = name[:-len(suffix)]
                elif "." in name:
                    continue
                if hashing.is_hash_hex(name):
                    yield name, entry

