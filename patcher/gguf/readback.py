"""GGUF writes checked the way a reader reads them.

A GGUF reader finds the tensor data right after the header (metadata and tensor infos), rounded
up to the alignment, and each tensor at its recorded offset from there. A writer that lays the
file out any other way (a header padded past that point, say) makes a file every reader loads
and reads wrong, while its own digests, taken of what it wrote, agree. So:

- ``check_written``: after a GGUF file is written, and before it is committed, gguf-py's
  ``GGUFReader`` (an implementation independent of ours) reads it back, and every tensor's bytes
  where the reader finds them are compared, range by range, with the bytes of its source;
- ``check_header``: for a header rewritten in place, the new header must put the data where the
  old one did, every tensor at the same offset;
- ``layout_problem``: for ``verify`` (no base at hand), the file must be read by ``GGUFReader``
  and by the strict parser alike, and hold nothing past its last tensor but alignment padding.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OperationFailed
from . import require_gguf

CHUNK = 16 << 20


def check_written(path: str | os.PathLike, copies, where=None) -> None:
    """Raise OperationFailed unless ``GGUFReader`` finds, in the file at ``path``, exactly the
    tensors of ``copies`` (``(name, source path, source offset, nbytes, padding)``, in order),
    each holding the bytes of its source range."""
    where = where or path
    located = _reader_tensors(path, where)
    names = [name for name, *_ in copies]
    if list(located) != names:
        raise OperationFailed("GGUF read-back: a reader finds the tensors "
                              f"{_first_diff(located, names)}", where=where)
    fds: dict[str, int] = {}
    try:
        out = os.open(path, os.O_RDONLY)
        try:
            for name, src, src_offset, nbytes, _pad in copies:
                offset, size = located[name]
                if size != nbytes:
                    raise OperationFailed(f"GGUF read-back: tensor {name!r} is read as {size} "
                                          f"bytes, {nbytes} were written", where=where)
                if src not in fds:
                    fds[src] = os.open(src, os.O_RDONLY)
                bad = _first_difference(out, offset, fds[src], src_offset, nbytes)
                if bad is not None:
                    raise OperationFailed(f"GGUF read-back: tensor {name!r} as a reader reads it "
                                          f"(from byte {offset}) differs from its source at byte "
                                          f"{bad} of {nbytes}", where=where)
        finally:
            os.close(out)
    finally:
        for fd in fds.values():
            os.close(fd)


def check_header(header: bytes, base, where) -> None:
    """Raise OperationFailed unless ``header`` (new bytes for the header region of the file whose
    header is ``base``) puts the data section and every tensor where ``base`` has them."""
    from .format import parse_header

    new = parse_header(header, base.file_size, str(where))
    if new.data_offset != base.data_offset or len(header) != base.data_offset or [
            (t.name, t.offset, t.nbytes) for t in new.tensors.values()] != [
            (t.name, t.offset, t.nbytes) for t in base.tensors.values()]:
        raise OperationFailed(f"GGUF read-back: the new header puts the data at byte "
                              f"{new.data_offset}, not {base.data_offset} where it stays",
                              where=where)


def layout_problem(path: Path) -> str | None:
    """Why the GGUF file at ``path`` is not laid out as readers read it, or None."""
    from .format import aligned, read_header

    try:
        header = read_header(path)
    except Exception as exc:      # noqa: BLE001 - any refusal is the answer
        return str(exc)
    try:
        located = _reader_tensors(path, path)
    except OperationFailed as exc:
        return exc.args[0] if exc.args else str(exc)
    ours = {t.name: (header.data_offset + t.offset, t.nbytes) for t in header.tensors.values()}
    if located != ours:
        return "gguf-py's GGUFReader and the strict parser disagree on where the tensors lie"
    end = max((o + n for o, n in ours.values()), default=header.data_offset)
    if header.file_size > aligned(end, header.alignment):
        return (f"{header.file_size - end} bytes follow the last tensor (ending at byte {end}): "
                "the tensors are not where a reader reads them")
    return None


def check_layouts(root: Path, report):
    """``report`` (a ``VerifyReport`` of ``root``) with the layout problem of every GGUF file it
    found intact; the digests say the bytes are the ones written, this that readers read them
    as the tensors they were written as."""
    from dataclasses import replace

    bad = {m.path for m in report.modified} | set(report.missing)
    problems = []
    for rel in sorted(p for p in _manifest_files(root) if p.endswith(".gguf") and p not in bad):
        why = layout_problem(root / rel)
        if why is not None:
            problems.append(f"{rel}: {why}")
    return replace(report, layout_problems=problems) if problems else report


def _manifest_files(root: Path) -> list[str]:
    from ..integrity.manifest import MANIFEST_NAME, read_manifest

    if not (root / MANIFEST_NAME).is_file():
        return []
    return list(read_manifest(root).subjects)


def _reader_tensors(path, where) -> dict[str, tuple[int, int]]:
    """``{name: (absolute data offset, nbytes)}`` as gguf-py's GGUFReader reads the file."""
    gguf = require_gguf(str(where))
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:      # noqa: BLE001 - gguf-py raises ValueError, numpy errors...
        raise OperationFailed(f"GGUF read-back: gguf-py cannot read the file: {exc}",
                              where=where) from None
    return {t.name: (int(t.data_offset), int(t.n_bytes)) for t in reader.tensors}


def _first_diff(located: dict, names: list[str]) -> str:
    got = list(located)
    for i, (a, b) in enumerate(zip(got, names)):
        if a != b:
            return f"{a!r} where {b!r} was written (tensor {i})"
    return f"{len(got)} tensors; {len(names)} were written"


def _first_difference(fd_a: int, off_a: int, fd_b: int, off_b: int, n: int) -> int | None:
    """The first byte at which the two ranges differ (relative), or None; read in chunks into
    two buffers reused throughout."""
    bufs = (bytearray(min(CHUNK, n)), bytearray(min(CHUNK, n)))
    pos = 0
    while pos < n:
        size = min(CHUNK, n - pos)
        a, b = (memoryview(buf)[:size] for buf in bufs)
        got_a, got_b = os.preadv(fd_a, [a], off_a + pos), os.preadv(fd_b, [b], off_b + pos)
        if got_a != size or got_b != size:
            return pos + min(got_a, got_b)
        same = bufs[0] == bufs[1] if size == len(bufs[0]) else a.tobytes() == b.tobytes()
        if not same:                  # bytearray and bytes compare with memcmp
            return pos + next(i for i in range(size) if a[i] != b[i])
        pos += size
    return None
