"""hash_while_copying with its kernel copy and the source's digest in threads (ranges of
PARALLEL_MIN bytes and more): the same bytes and digests as the serial path, errors raised."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from patcher.errors import OperationFailed
from patcher.integrity.digests import hash_writer
from patcher.integrity.digests.hash_writer import HashingWriter, hash_while_copying
from patcher.integrity.digests.source_digest import SourceDigest


def _copy(tmp_path, ranges, monkeypatch, parallel_min):
    monkeypatch.setattr(hash_writer, "COPY_WINDOW", 40_000)
    monkeypatch.setattr(hash_writer, "PARALLEL_MIN", parallel_min)
    data = os.urandom(300_000)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    out = tmp_path / f"out-{parallel_min}.bin"
    with open(out, "wb", buffering=0) as f, open(src, "rb") as s:
        w, digest = HashingWriter(f), SourceDigest(s.fileno())
        w.write(b"HDR")
        for off, n in ranges:
            hash_while_copying(s.fileno(), off, n, w, source_digest=digest)
        source = digest.result()
    expected = b"HDR" + b"".join(data[o:o + n] for o, n in ranges)
    assert out.read_bytes() == expected
    assert w.sha256 == hashlib.sha256(expected).hexdigest() and w.size == len(expected)
    assert source.stable and source.sha256 == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("parallel_min", [0, 1 << 40])     # threads always / never
def test_threads_give_the_serial_bytes_and_digests(tmp_path, monkeypatch, parallel_min):
    _copy(tmp_path, [(5, 100_000), (100_005, 1), (150_000, 150_000)], monkeypatch,
          parallel_min)


def test_a_copy_failing_in_its_thread_is_raised_and_breaks_the_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(hash_writer, "PARALLEL_MIN", 0)

    def enospc(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "copy_file_range", enospc, raising=False)
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 100_000)
    with open(tmp_path / "o", "wb", buffering=0) as f, open(src, "rb") as s:
        w = HashingWriter(f)
        with pytest.raises(OperationFailed, match="No space left"):
            hash_while_copying(s.fileno(), 0, 100_000, w)
        with pytest.raises(OperationFailed, match="earlier write failed"):
            w.sha256


def test_a_callers_pool_serves_every_range_and_stays_open(tmp_path, monkeypatch):
    """A writer of many ranges passes one pool: no call starts threads of its own."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(hash_writer, "COPY_WINDOW", 40_000)
    monkeypatch.setattr(hash_writer, "PARALLEL_MIN", 0)
    made = []
    real = hash_writer.ThreadPoolExecutor
    monkeypatch.setattr(hash_writer, "ThreadPoolExecutor",
                        lambda *a, **k: made.append(a) or real(*a, **k))
    data = os.urandom(200_000)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    out = tmp_path / "out.bin"
    pool = ThreadPoolExecutor(2)
    with open(out, "wb", buffering=0) as f, open(src, "rb") as s:
        w, digest = HashingWriter(f), SourceDigest(s.fileno())
        for off in range(0, 200_000, 50_000):
            hash_while_copying(s.fileno(), off, 50_000, w, source_digest=digest, pool=pool)
        source = digest.result()
    assert pool.submit(lambda: 1).result() == 1      # not shut down by the calls
    pool.shutdown()
    assert made == []
    assert out.read_bytes() == data and w.sha256 == hashlib.sha256(data).hexdigest()
    assert source.sha256 == hashlib.sha256(data).hexdigest()
