"""Rewriting only the header region of a GGUF file in place (``apply --in-place``).

When a metadata-only patch gives a header (metadata and tensor infos) that fits before the
file's data offset, and every tensor keeps its offset, the tensor data need not move: only the
first ``data_offset`` bytes change. An in-place apply then writes just that region, in the file
itself, under the journal (``patcher.execute.journal``, step ``["header", rel, src, undo]``):

- while preparing, the base's header bytes go to the patch's ``headers/<rel>`` (the revert data:
  nothing else of the file is kept) and the new ones to the staging area, both fsynced; the
  digests of the base and of the result come from one read of the unchanged tail;
- the switch writes ``src`` over the region and fsyncs. Writing the whole region again is
  harmless, so a crash mid-write is rolled forward (``src`` again) or back (``undo``, the bytes
  that were there) by the next command;
- ``revert`` writes the kept header back (``revert -o`` builds the base from it and the tail).

Refused, with the whole file rewritten instead (the plan says why), when the file has more than
one hard link (a variant may share the inode: writing would change it too) or is a symlink (a
Hugging Face cache snapshot links into ``blobs/``, which are never written through).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import faults
from ..errors import OperationFailed
from ..fsops import make_parents, write_file
from ..model.model_dir import STATE_DIR
from ..tensors.tasks import TaskKind

HEADERS_DIR = "headers"
"""Under a patch directory: the base's header bytes of each file rewritten in place."""
_STAGED = f"{STATE_DIR}/{HEADERS_DIR}"   # under the staging directory: no model path starts so
_CHUNK = 64 << 20


def refusal(model_file, task, data_offset: int, file_size: int) -> str | None:
    """Why ``task`` (a ``GGUFTask`` replacing ``model_file``, whose header ends at
    ``data_offset``) cannot write just the header in place; None when it can."""
    path = str(model_file.path)
    pos = len(task.header)
    if pos != data_offset:
        return "the new header does not fit the header region"
    for _, src, offset, nbytes, pad in task.copies:
        if src != path or offset != pos:
            return "tensor data moves"
        pos += nbytes + pad
    if pos != file_size:
        return "tensor data moves"
    if model_file.link_target is not None or os.path.islink(path):
        return "the file is a symlink (a Hugging Face cache blob is never written through)"
    links = os.stat(path).st_nlink
    if links > 1:
        return f"the file has {links} hard links (a variant may share it)"
    return None


def is_header_rewrite(fp) -> bool:
    """Whether plan entry ``fp`` rewrites only a GGUF header in place."""
    return fp.shard_task is not None and fp.shard_task.kind is TaskKind.GGUF_HEADER


def header_rewrites(plan) -> list:
    return [fp for fp in plan.files if fp.shard_task is not None and is_header_rewrite(fp)]


def staged_header(staging_rel: str, rel: str) -> str:
    return f"{staging_rel}/{_STAGED}/{rel}"


def apply_steps(plan, patch_dir_rel: str, staging_rel: str) -> list[list[str]]:
    """The journal steps that write each new header: from staging, undone from the revert data."""
    return [["header", fp.path, staged_header(staging_rel, fp.path),
             f"{patch_dir_rel}/{HEADERS_DIR}/{fp.path}"] for fp in header_rewrites(plan)]


def revert_steps(record, patch_dir_rel: str, staging_rel: str) -> list[list[str]]:
    """The journal steps that put each kept header back, undone from the header staged now."""
    return [["header", rel, f"{patch_dir_rel}/{HEADERS_DIR}/{rel}", staged_header(staging_rel, rel)]
            for rel in sorted(record.headers)]


def stage_apply(root: Path, plan, builder, staging: Path, patch_dir: Path) -> dict[str, str]:
    """Keep each base header under ``patch_dir`` and stage the new one; return the result's
    sha256 per file. The base's digest, unless known, is taken from the same read of the tail
    (``builder.hashed_while_writing``), so nothing is read twice."""
    digests = {}
    for fp in header_rewrites(plan):
        new = fp.shard_task.header
        live = root / fp.path
        old = read_region(live, len(new))
        write_file(make_parents(patch_dir / HEADERS_DIR, fp.path), old, mode=0o444)
        write_file(make_parents(staging / _STAGED, fp.path), new, mode=0o444)
        known = builder.known_base_digest(fp.source)
        base_hash = None if known else hashlib.sha256(old)
        new_hash = hashlib.sha256(new)
        _hash_tail(live, len(new), [h for h in (base_hash, new_hash) if h is not None])
        if base_hash is not None:
            builder.hashed_while_writing[fp.source] = base_hash.hexdigest()
        digests[fp.path] = new_hash.hexdigest()
    return digests


def stage_revert(root: Path, record, staging: Path) -> None:
    """Stage the header each file has now (what undoing the revert's step writes back)."""
    for rel, length in sorted(record.headers.items()):
        write_file(make_parents(staging / _STAGED, rel), read_region(root / rel, length),
                   mode=0o444)


def check_kept(root: Path, patch_dir: Path, record) -> list[str]:
    """The files whose kept header, followed by the live tail, is not the base's recorded
    digest (checked before a revert changes anything)."""
    bad = []
    for rel, length in sorted(record.headers.items()):
        kept = patch_dir / HEADERS_DIR / rel
        if not kept.is_file() or kept.stat().st_size != length:
            bad.append(rel)
            continue
        h = hashlib.sha256(kept.read_bytes())
        _hash_tail(root / rel, length, [h])
        if h.hexdigest() != record.base_files[rel].sha256:
            bad.append(rel)
    return bad


def rebuild(header: Path, source: Path, dst: Path, mode: int) -> None:
    """``dst`` (new): the bytes of ``header``, then those of ``source`` past its length."""
    data = header.read_bytes()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_all(fd, data, 0)
        with open(source, "rb") as src:
            src.seek(len(data))
            pos = len(data)
            while chunk := src.read(_CHUNK):
                _write_all(fd, chunk, pos)
                pos += len(chunk)
        os.fsync(fd)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def write_region(live: Path, src: Path) -> None:
    """Write the bytes of ``src`` over the start of ``live`` (a regular file, never followed
    through a symlink, at least that long) and fsync it. A journal step: taking it twice
    leaves the same bytes."""
    data = src.read_bytes()
    fd = os.open(live, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < len(data):
            raise OperationFailed(f"cannot write its {len(data)}-byte header region: it is not "
                                  f"the file the patch planned", where=live)
        half = len(data) // 2
        _write_all(fd, data[:half], 0)
        faults.point(f"header:{live.name}:half")   # a kill here leaves a torn header
        _write_all(fd, data[half:], half)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_region(path: Path, length: int) -> bytes:
    with open(path, "rb") as f:
        data = f.read(length)
    if len(data) != length:
        raise OperationFailed(f"shorter than its {length}-byte header region", where=path)
    return data


def _hash_tail(path: Path, start: int, hashes: list) -> None:
    """Feed the bytes of ``path`` from ``start`` on to every hash, mapped window by window; a
    second hash runs in a thread beside the first (hashlib releases the GIL)."""
    with open(path, "rb") as f, ThreadPoolExecutor(1) as pool:
        size = os.fstat(f.fileno()).st_size
        for offset in range(start - start % mmap.ALLOCATIONGRANULARITY, size, _CHUNK):
            with mmap.mmap(f.fileno(), min(_CHUNK, size - offset), offset=offset,
                           access=mmap.ACCESS_READ) as window:
                with memoryview(window) as view:
                    chunk = view[max(0, start - offset):]
                    others = [pool.submit(h.update, chunk) for h in hashes[1:]]
                    hashes[0].update(chunk)
                    for other in others:
                        other.result()
                    chunk.release()


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
