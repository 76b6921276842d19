"""GGUF writes checked the way a reader reads them.

A GGUF reader finds the tensor data right after the header (metadata and tensor infos), rounded
up to the alignment, and each tensor at its recorded offset from there. A writer that lays the
file out any other way (a header padded past that point, say) makes a file every reader loads
and reads wrong, while its own digests, taken of what it wrote, agree. So:

- ``check_written``: after a GGUF file is written, and before it is committed, gguf-py's
  ``GGUFReader`` (an implementation independent of ours) reads its header, and must find every
  tensor where it was written: same name, order, byte offset and size. The bytes themselves are
  not read again: the writer copied each range in the kernel and hashed it in the same pass
  (``patcher.integrity.digests.hash_writer``), so the output's sha256 already stands for them.
  Only the header and tensor infos are read (the reader maps the file; tensor data stays on
  disk), so the check costs O(header), and it runs while the data is still being copied
  (``start_layout_check``);
- ``check_header``: for a header rewritten in place, the new header must put the data where the
  old one did, every tensor at the same offset;
- ``layout_problem``: for ``verify`` (no base at hand), the file must be read by ``GGUFReader``
  and by the strict parser alike, and hold nothing past its last tensor but alignment padding.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OperationFailed
from ..gguf_py import require_gguf


def written_layout(header_size: int, copies) -> list[tuple[str, int, int]]:
    """``(name, absolute offset, nbytes)`` of every tensor of ``copies`` (``(name, source path,
    source offset, nbytes, padding)``, in order) as a writer lays them out after a header of
    ``header_size`` bytes."""
    layout, pos = [], header_size
    for name, _src, _offset, nbytes, pad in copies:
        layout.append((name, pos, nbytes))
        pos += nbytes + pad
    return layout


def check_written(path: str | os.PathLike, layout, where=None) -> None:
    """Raise OperationFailed unless ``GGUFReader`` finds, in the file at ``path``, exactly the
    tensors of ``layout`` (``written_layout``), in order, each at its offset and of its size."""
    where = where or path
    located = _reader_tensors(path, where)
    names = [name for name, _, _ in layout]
    if list(located) != names:
        raise OperationFailed("GGUF read-back: a reader finds the tensors "
                              f"{_first_diff(located, names)}", where=where)
    for name, offset, nbytes in layout:
        at, size = located[name]
        if size != nbytes:
            raise OperationFailed(f"GGUF read-back: tensor {name!r} is read as {size} "
                                  f"bytes, {nbytes} were written", where=where)
        if at != offset:
            raise OperationFailed(f"GGUF read-back: tensor {name!r} is read from byte {at}, "
                                  f"it was written at byte {offset}", where=where)


def start_layout_check(path: str | os.PathLike, layout, where=None):
    """``check_written`` in a thread of its own, started now on a file whose header is written
    and whose size is final (the data may still be arriving: the reader does not read it).
    Returns a function that waits for the check and raises what it raised. The reader is
    Python parsing the header; it runs on one core while the kernel copies and hashlib hashes
    (both release the GIL) on the others."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1, "gguf-read-back")
    future = pool.submit(check_written, path, layout, where)
    pool.shutdown(wait=False)
    return future.result


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
