"""patcher.integrity.digests.digest_cache: digests keyed by (dev, ino, size, mtime_ns), and
KnownDigests."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from patcher.integrity.digests import digest_cache
from patcher.integrity.digests.digest_cache import DigestCache, KnownDigests, default_cache_path

HOUR_NS = 3600 * 10**9
SHA_A = "a" * 64
SHA_B = "b" * 64


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def cache(tmp_path):
    with DigestCache(tmp_path / "cache" / "digests.sqlite3") as c:
        yield c


def make_old(path, data: bytes | None = None, age_ns: int = HOUR_NS):
    """Write ``data`` (if given) and set the mtime well outside the racy window."""
    if data is not None:
        path.write_bytes(data)
    t = time.time_ns() - age_ns
    os.utime(path, ns=(t, t))
    return os.stat(path)


def test_default_path_follows_env(tmp_path):
    assert default_cache_path() == tmp_path / "cache" / "digests.sqlite3"
    assert DigestCache().path == tmp_path / "cache" / "digests.sqlite3"


def test_hit_and_misses_on_change(cache, tmp_path):
    f = tmp_path / "f.bin"
    st = make_old(f, b"hello")
    assert cache.get(st) is None
    assert cache.put(st, SHA_A, verified=True)
    hit = cache.get(os.stat(f))
    assert hit is not None and hit.sha256 == SHA_A and hit.verified
    assert abs(hit.recorded_at - time.time()) < 3600

    # touch: new mtime, same inode and size
    st2 = make_old(f, age_ns=HOUR_NS // 2)
    assert cache.get(st2) is None
    assert cache.put(st2, SHA_B, verified=True)
    assert cache.get(os.stat(f)).sha256 == SHA_B
    assert cache.get(st) is None  # the old state no longer answers (one row per inode)

    # the same size and the mtime put back (cp -p, rsync -a --inplace): only the ctime moved
    cache.put(os.stat(f), SHA_B, verified=True)
    f.write_bytes(b"HELLO")
    os.utime(f, ns=(st2.st_mtime_ns, st2.st_mtime_ns))
    edited = os.stat(f)
    assert (edited.st_ino, edited.st_size, edited.st_mtime_ns) == \
        (st2.st_ino, st2.st_size, st2.st_mtime_ns)
    assert cache.get(edited) is None

    # rewrite in place with another size
    f.write_bytes(b"hello world")
    os.utime(f, ns=(st2.st_mtime_ns, st2.st_mtime_ns))
    st3 = os.stat(f)
    assert st3.st_ino == st2.st_ino and st3.st_mtime_ns == st2.st_mtime_ns
    assert cache.get(st3) is None

    # replace with a new inode of the same size and mtime
    g = tmp_path / "g.bin"
    g.write_bytes(b"hello")
    os.utime(g, ns=(st2.st_mtime_ns, st2.st_mtime_ns))
    os.replace(g, f)
    st4 = os.stat(f)
    assert st4.st_ino != st2.st_ino
    assert (st4.st_size, st4.st_mtime_ns) == (st2.st_size, st2.st_mtime_ns)
    assert cache.get(st4) is None


def test_every_key_field_must_match(cache):
    base = dict(st_dev=1, st_ino=2, st_size=3, st_mtime_ns=4, st_ctime_ns=4)
    assert cache.put(SimpleNamespace(**base), SHA_A, verified=True, observed_ns=10 * HOUR_NS)
    assert cache.get(SimpleNamespace(**base)).sha256 == SHA_A
    for key in base:
        assert cache.get(SimpleNamespace(**dict(base, **{key: base[key] + 1}))) is None


def test_unsigned_64bit_device_and_inode(cache):
    st = SimpleNamespace(st_dev=2**64 - 1, st_ino=2**63 + 5, st_size=1, st_mtime_ns=1,
                         st_ctime_ns=1)
    assert cache.put(st, SHA_A, verified=True)
    assert cache.get(st).sha256 == SHA_A
    assert cache.get(SimpleNamespace(st_dev=2**64 - 1, st_ino=5, st_size=1, st_mtime_ns=1,
                                     st_ctime_ns=1)) is None


def test_verified_flag(cache, tmp_path):
    st = make_old(tmp_path / "f", b"x")
    assert cache.put(st, SHA_A, verified=False)
    assert cache.get(st).verified is False
    assert cache.get(st, require_verified=True) is None
    assert cache.put(st, SHA_B, verified=True)
    assert cache.get(st, require_verified=True).sha256 == SHA_B
    # A claim taken on trust never replaces a digest computed from the bytes.
    cache.put(st, SHA_A, verified=False)
    hit = cache.get(st)
    assert hit.sha256 == SHA_B and hit.verified


def test_racily_clean_files_are_not_recorded(cache, tmp_path):
    f = tmp_path / "fresh"
    f.write_bytes(b"just written")
    st = os.stat(f)
    assert not cache.put(st, SHA_A, verified=True)
    assert cache.get(st) is None
    # The status was observed long after the last write: fine.
    assert cache.put(st, SHA_A, verified=True, observed_ns=st.st_mtime_ns + 3 * 10**9)
    assert cache.get(st).sha256 == SHA_A


def test_put_many_and_bad_digest(cache, tmp_path):
    stats = [make_old(tmp_path / f"f{i}", bytes([i]) * (i + 1)) for i in range(5)]
    assert cache.put_many([(st, SHA_A, True) for st in stats]) == 5
    assert all(cache.get(st).sha256 == SHA_A for st in stats)
    with pytest.raises(ValueError):
        cache.put(stats[0], "ABC", verified=True)


def test_unopenable_cache_degrades_to_noop(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    st = SimpleNamespace(st_dev=1, st_ino=2, st_size=3, st_mtime_ns=4, st_ctime_ns=4)
    c = DigestCache(blocker / "digests.sqlite3")
    with caplog.at_level(logging.WARNING, logger="patcher.integrity.digests.digest_cache"):
        assert c.get(st) is None
        assert not c.put(st, SHA_A, verified=True, observed_ns=HOUR_NS)
        assert c.get(st) is None
    assert not c.enabled
    warnings = [r for r in caplog.records if "digest cache" in r.getMessage()]
    assert len(warnings) == 1  # warned once, not per call


def test_corrupt_cache_degrades_to_noop(tmp_path, caplog):
    path = tmp_path / "digests.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    c = DigestCache(path)
    st = SimpleNamespace(st_dev=1, st_ino=2, st_size=3, st_mtime_ns=4, st_ctime_ns=4)
    with caplog.at_level(logging.WARNING):
        assert c.get(st) is None
        assert not c.put(st, SHA_A, verified=True, observed_ns=HOUR_NS)
    assert not c.enabled
    assert any("unavailable" in r.getMessage() for r in caplog.records)


def test_no_home_directory_degrades_to_noop(monkeypatch, caplog):
    monkeypatch.delenv("MODELPATCH_CACHE_DIR")

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(digest_cache.Path, "home", staticmethod(no_home))
    c = DigestCache()
    st = SimpleNamespace(st_dev=1, st_ino=2, st_size=3, st_mtime_ns=4, st_ctime_ns=4)
    with caplog.at_level(logging.WARNING):
        assert c.get(st) is None
    assert not c.enabled and "home directory" in caplog.text


def test_disabled_cache():
    c = DigestCache.disabled()
    st = SimpleNamespace(st_dev=1, st_ino=2, st_size=3, st_mtime_ns=4, st_ctime_ns=4)
    assert not c.put(st, SHA_A, verified=True, observed_ns=HOUR_NS)
    assert c.get(st) is None


_WRITER = """
import sys
from types import SimpleNamespace
from patcher.integrity.digests.digest_cache import DigestCache
c = DigestCache(sys.argv[1])
worker = int(sys.argv[2])
for i in range(200):
    st = SimpleNamespace(st_dev=worker, st_ino=i, st_size=i, st_mtime_ns=1, st_ctime_ns=1)
    assert c.put(st, format(worker * 1000 + i, "064x"), verified=True, observed_ns=10**18)
    assert c.get(st) is not None
assert c.enabled
"""


def test_concurrent_processes(tmp_path):
    path = tmp_path / "shared" / "digests.sqlite3"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(w)])
             for w in range(1, 4)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    c = DigestCache(path)
    for w in range(1, 4):
        for i in (0, 199):
            st = SimpleNamespace(st_dev=w, st_ino=i, st_size=i, st_mtime_ns=1, st_ctime_ns=1)
            assert c.get(st).sha256 == format(w * 1000 + i, "064x")


def test_fork_gets_its_own_connection(cache):
    st = SimpleNamespace(st_dev=1, st_ino=2, st_size=3, st_mtime_ns=4, st_ctime_ns=4)
    assert cache.put(st, SHA_A, verified=True, observed_ns=HOUR_NS)
    pid = os.fork()
    if pid == 0:  # child: reuse the parent's object
        ok = cache.get(st).sha256 == SHA_A
        st2 = SimpleNamespace(st_dev=1, st_ino=9, st_size=3, st_mtime_ns=4, st_ctime_ns=4)
        ok = ok and cache.put(st2, SHA_B, verified=True, observed_ns=HOUR_NS)
        os._exit(0 if ok and cache.enabled else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache.get(SimpleNamespace(st_dev=1, st_ino=9, st_size=3, st_mtime_ns=4,
                                     st_ctime_ns=4)).sha256 == SHA_B
    assert cache.get(st).sha256 == SHA_A


# -- KnownDigests --------------------------------------------------------------------------------

def test_known_digests_sources(cache, tmp_path):
    data = b"lfs file"
    sha = hashlib.sha256(data).hexdigest()
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    make_old(repo / "blobs" / sha, data)
    snap = repo / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(f"../../blobs/{sha}")
    plain = tmp_path / "plain.bin"
    make_old(plain, b"plain")

    known = KnownDigests(cache)
    hit = known.lookup(snap / "model.safetensors")
    assert hit.sha256 == sha and hit.source == "hf-blob" and not hit.verified
    assert known.lookup(snap / "model.safetensors", require_verified=True) is None
    assert KnownDigests(cache, use_hf_blob_names=False).lookup(snap / "model.safetensors") is None
    assert known.lookup(plain) is None
    assert known.lookup(tmp_path / "missing") is None

    # A recorded digest (keyed by the blob's inode) wins over the blob name.
    assert known.record(os.stat(snap / "model.safetensors"), SHA_A, verified=True)
    hit = known.lookup(snap / "model.safetensors", require_verified=True)
    assert hit.sha256 == SHA_A and hit.source == "cache" and hit.verified


def test_known_digests_hash_only_unknown_then_remember(cache, tmp_path):
    files = [tmp_path / f"f{i}.bin" for i in range(4)]
    for i, f in enumerate(files):
        make_old(f, bytes([i]) * (1000 * (i + 1)))
    fresh = tmp_path / "fresh.bin"
    fresh.write_bytes(b"fresh")  # racily clean: hashed every time until it ages
    expected = {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in files + [fresh]}

    known = KnownDigests(cache)
    hashed = []
    assert known.digests(files + [fresh], jobs=2, on_progress=hashed.append) == expected
    assert sum(hashed) == sum(f.stat().st_size for f in files + [fresh])

    hashed.clear()
    assert known.digests(files + [fresh], on_progress=hashed.append,
                         require_verified=True) == expected
    assert sum(hashed) == fresh.stat().st_size
    assert list(known.iter_unknown(files + [fresh])) == [fresh]

    # Rewriting a file invalidates exactly that one.
    make_old(files[0], b"changed")
    expected[files[0]] = hashlib.sha256(b"changed").hexdigest()
    hashed.clear()
    assert known.digests(files, on_progress=hashed.append) == {f: expected[f] for f in files}
    assert sum(hashed) == len(b"changed")


def test_known_digests_default_cache_uses_env(tmp_path):
    known = KnownDigests()
    assert known.cache.path == tmp_path / "cache" / "digests.sqlite3"
    assert digest_cache.RACY_WINDOW_NS >= 10**9
