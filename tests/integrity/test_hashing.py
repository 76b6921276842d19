"""patcher.integrity.digests.hashing: file digests, parallel hashing, hashing while writing and
copying."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random

import pytest

from patcher.errors import InputError, OperationFailed
from patcher.integrity.digests import hash_writer, hashing
from patcher.integrity.digests.hash_writer import HashingWriter, hash_while_copying
from patcher.integrity.digests.hashing import (
    hash_files,
    hash_files_stat,
    hf_blob_sha256,
    sha256_file,
)

CHUNK = hashing.CHUNK_SIZE


def _bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("size", [0, 1, 4095, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 12345])
def test_sha256_file_equals_hashlib(tmp_path, size):
    data = _bytes(size, seed=size)
    path = _write(tmp_path / "f.bin", data)
    seen = []
    assert sha256_file(path, on_progress=seen.append) == hashlib.sha256(data).hexdigest()
    assert sum(seen) == size
    assert all(n > 0 for n in seen)


def test_sha256_file_small_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(hashing, "CHUNK_SIZE", 1000)
    data = _bytes(123_457)
    path = _write(tmp_path / "f.bin", data)
    seen = []
    assert sha256_file(str(path), on_progress=seen.append) == hashlib.sha256(data).hexdigest()
    assert len(seen) == 124 and sum(seen) == len(data)


def test_sha256_file_errors(tmp_path):
    with pytest.raises(OperationFailed, match="missing.bin"):
        sha256_file(tmp_path / "missing.bin")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):  # and does not hang
        sha256_file(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        sha256_file(tmp_path)


def test_symlink_is_followed(tmp_path):
    data = _bytes(5000)
    _write(tmp_path / "target", data)
    (tmp_path / "link").symlink_to("target")
    assert sha256_file(tmp_path / "link") == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("jobs", [None, 1, 2, 8])
def test_hash_files_parallel_equals_serial(tmp_path, monkeypatch, jobs):
    monkeypatch.setattr(hashing, "CHUNK_SIZE", 4096)
    sizes = [0, 1, 4096, 50_000, 300_001, 7, 65_536, 123_456]
    paths = [_write(tmp_path / f"f{i}.bin", _bytes(n, seed=i)) for i, n in enumerate(sizes)]
    serial = {p: sha256_file(p) for p in paths}
    seen = []
    result = hash_files(paths + [paths[0]], jobs=jobs, on_progress=seen.append)
    assert result == serial
    assert list(result) == paths  # in the order given, duplicates once
    assert sum(seen) == sum(sizes)


def test_hash_files_largest_first(tmp_path, monkeypatch):
    paths = [_write(tmp_path / f"f{n}.bin", _bytes(n)) for n in (10, 3000, 0, 70, 999)]
    order = []
    real = hashing._hash_path

    def spy(path, *args, **kwargs):
        order.append(os.path.getsize(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(hashing, "_hash_path", spy)
    hash_files(paths, jobs=1)
    assert order == [3000, 999, 70, 10, 0]


def test_hash_files_stat_reports_stat_and_stability(tmp_path):
    path = _write(tmp_path / "f.bin", _bytes(1000))
    (result,) = hash_files_stat([path]).values()
    st = os.stat(path)
    assert result.stable and result.size == 1000
    assert (result.stat.st_ino, result.stat.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_hash_files_error_names_the_file(tmp_path):
    good = _write(tmp_path / "good.bin", b"x" * 10)
    with pytest.raises(OperationFailed, match="gone.bin"):
        hash_files([good, tmp_path / "gone.bin"], jobs=2)
    assert hash_files([]) == {}


@pytest.mark.parametrize("wrap", [lambda f: f, lambda f: f.raw])
def test_hashing_writer(tmp_path, wrap):
    import numpy as np

    out = tmp_path / "out.bin"
    pieces = [b"header", bytearray(b"\x00" * 10), memoryview(_bytes(70_000)),
              np.arange(12, dtype=np.float32).reshape(3, 4), b""]
    expected = b"".join(bytes(memoryview(p).cast("B")) for p in pieces)
    with open(out, "wb") as f:
        w = HashingWriter(wrap(f))
        for p in pieces:
            assert w.write(p) == memoryview(p).nbytes
    assert out.read_bytes() == expected
    assert w.sha256 == hashlib.sha256(expected).hexdigest()
    assert w.size == len(expected)


def _copy_case(tmp_path, ranges, header=b"HDR", buffering=-1):
    src_data = _bytes(300_000, seed=7)
    src = _write(tmp_path / "src.bin", src_data)
    out = tmp_path / "out.bin"
    expected = bytearray(header)
    progress = []
    with open(out, "wb", buffering=buffering) as f, open(src, "rb") as s:
        w = HashingWriter(f)
        w.write(header)
        for off, length in ranges:
            assert hash_while_copying(s.fileno(), off, length, w,
                                      on_progress=progress.append) == length
            expected += src_data[off:off + length]
            w.write(b"|")
            expected += b"|"
        assert f.tell() == len(expected)
    assert out.read_bytes() == bytes(expected)
    assert w.sha256 == hashlib.sha256(expected).hexdigest()
    assert w.size == len(expected)
    assert sum(progress) == sum(n for _, n in ranges)


RANGES = [(0, 0), (0, 1), (1, 4097), (12_345, 150_000), (299_999, 1), (0, 300_000)]


@pytest.mark.parametrize("buffering", [-1, 0])  # a buffered file object, or a raw FileIO
def test_hash_while_copying(tmp_path, monkeypatch, buffering):
    monkeypatch.setattr(hash_writer, "COPY_WINDOW", 40_000)  # several unaligned windows per range
    _copy_case(tmp_path, RANGES, buffering=buffering)


def test_hash_while_copying_uses_copy_file_range(tmp_path, monkeypatch):
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no copy_file_range")
    calls = []
    real = os.copy_file_range

    def spy(*args):
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", spy)
    monkeypatch.setattr(os, "pwrite", None)  # must not be needed
    _copy_case(tmp_path, [(10, 200_000)])
    assert calls and calls[0] == 200_000


@pytest.mark.parametrize("failure", ["exdev", "zero", "absent"])
def test_hash_while_copying_fallbacks(tmp_path, monkeypatch, failure):
    monkeypatch.setattr(hash_writer, "COPY_WINDOW", 64 << 10)
    if failure == "exdev":
        def cfr(*args):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", cfr, raising=False)
    elif failure == "zero":
        monkeypatch.setattr(os, "copy_file_range", lambda *a: 0, raising=False)
        monkeypatch.setattr(os, "sendfile", lambda *a: 0, raising=False)
    else:
        monkeypatch.delattr(os, "copy_file_range", raising=False)
        monkeypatch.delattr(os, "sendfile", raising=False)
    _copy_case(tmp_path, RANGES)


def test_hash_while_copying_out_of_range(tmp_path):
    src = _write(tmp_path / "src.bin", b"abc")
    with open(tmp_path / "o", "wb") as f, open(src, "rb") as s:
        w = HashingWriter(f)
        with pytest.raises(OperationFailed, match="past its end"):
            hash_while_copying(s.fileno(), 2, 2, w)
    assert w.size == 0


def test_hashing_writer_breaks_after_failed_write():
    class Failing(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

    w = HashingWriter(Failing())
    with pytest.raises(OSError):
        w.write(b"data")
    with pytest.raises(OperationFailed):
        _ = w.sha256


# -- Hugging Face cache blob names ---------------------------------------------------------------

def _hf_cache(tmp_path, data: bytes):
    sha = hashlib.sha256(data).hexdigest()
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / sha).write_bytes(data)
    (repo / "blobs" / ("a" * 40)).write_text("{}")  # a git (non-LFS) blob: sha1 name
    snap = repo / "snapshots" / ("c" * 40)
    (snap / "sub").mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(f"../../blobs/{sha}")
    (snap / "sub" / "nested.bin").symlink_to(f"../../../blobs/{sha}")
    (snap / "config.json").symlink_to(f"../../blobs/{'a' * 40}")
    (snap / "README.md").write_text("not a link")
    return sha, repo, snap


def test_hf_blob_sha256(tmp_path):
    sha, repo, snap = _hf_cache(tmp_path, b"tensor bytes")
    assert hf_blob_sha256(snap / "model.safetensors") == sha
    assert hf_blob_sha256(str(snap / "sub" / "nested.bin")) == sha
    assert hf_blob_sha256(snap / "config.json") is None  # 40-hex git blob id
    assert hf_blob_sha256(snap / "README.md") is None  # not a symlink
    assert hf_blob_sha256(snap / "absent") is None
    # Reached through a symlink to the snapshot directory: "../../blobs" is resolved where the
    # link really is.
    (tmp_path / "my-model").symlink_to(snap)
    assert hf_blob_sha256(tmp_path / "my-model" / "model.safetensors") == sha
    # Dangling link: no answer.
    (snap / "dangling").symlink_to(f"../../blobs/{'b' * 64}")
    assert hf_blob_sha256(snap / "dangling") is None
    # A 64-hex name outside a repo's blobs/ folder is not an HF blob.
    other = tmp_path / "elsewhere" / "blobs"
    other.mkdir(parents=True)
    (other / sha).write_bytes(b"x")
    (tmp_path / "link").symlink_to(other / sha)
    assert hf_blob_sha256(tmp_path / "link") is None


def test_hf_blob_sha256_shared_xet_store(tmp_path):
    """A repo blob that links into the cache-wide Xet store answers with its etag, never with the
    Xet hash the store names it by."""
    data = b"xet-stored tensor bytes"
    sha = hashlib.sha256(data).hexdigest()
    xet_hash = "f" * 64
    cache = tmp_path / "hub"
    store = cache / "blobs" / xet_hash[:2]
    store.mkdir(parents=True)
    (store / xet_hash).write_bytes(data)
    repo = cache / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / sha).symlink_to(f"../../blobs/{xet_hash[:2]}/{xet_hash}")
    snap = repo / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(f"../../blobs/{sha}")
    assert hf_blob_sha256(snap / "model.safetensors") == sha
    assert hf_blob_sha256(repo / "blobs" / sha) is None  # the store link itself: not a snapshot
