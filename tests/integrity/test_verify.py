"""patcher.integrity.verify: compare a variant directory with its manifest."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import time

import pytest

from patcher.errors import InputError, VerifyMismatch
from patcher.integrity.digests.digest_cache import DigestCache
from patcher.integrity.manifest import MANIFEST_NAME, build_statement, write_manifest
from patcher.integrity.verify import Mismatch, compare_maps, list_files, verify_dir

T = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
FILES = {
    "config.json": b'{"a": 1}',
    "model-00001-of-00002.safetensors": b"A" * 5000,
    "model-00002-of-00002.safetensors": b"B" * 7000,
    "sub/tokenizer.json": b"{}",
    "empty.txt": b"",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def cache(tmp_path):
    with DigestCache(tmp_path / "cache" / "digests.sqlite3") as c:
        yield c


def age(path, seconds: int = 3600):
    t = time.time_ns() - seconds * 10**9
    os.utime(path, ns=(t, t), follow_symlinks=False)


def make_variant(root, files=FILES, old=True):
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        if old:
            age(p)
    (root / ".modelpatch" / "originals").mkdir(parents=True)
    (root / ".modelpatch" / "journal.json").write_text("{}")
    (root / ".modelpatch" / "originals" / "config.json").write_text("old")
    st = build_statement(subjects={n: (sha(d), len(d)) for n, d in files.items()}, base_files={},
                         recipe={"name": "r", "sha256": sha(b"r"), "text": "r"}, options={},
                         changes=[], started=T, finished=T)
    write_manifest(root, st)
    return root


# -- compare_maps --------------------------------------------------------------------------------

def test_compare_maps_reports_everything_at_once():
    expected = {"a": (sha(b"a"), 1), "b": (sha(b"b"), 1), "c": (sha(b"c"), 1),
                "d": (sha(b"d"), 1), "e": (sha(b"e"), 1)}
    present = {"a", "b", "c", "e", "x", "y"}
    digests = {"a": sha(b"a"), "b": sha(b"other")}  # c: not hashed (size differs)
    sizes = {"a": 1, "b": 1, "c": 2, "e": None, "x": 3, "y": None}
    r = compare_maps(expected, present, digests, sizes)
    assert not r.ok
    assert r.missing == ["d"] and r.extra == ["x", "y"]
    assert [m.path for m in r.modified] == ["b", "c", "e"]
    b, c, e = r.modified
    assert b == Mismatch("b", sha(b"b"), 1, sha(b"other"), 1) and b.reason == "sha256 differs"
    assert c.actual_sha256 is None and c.reason == "size 2 != 1"
    assert e.reason == "not a regular file inside the directory"
    assert r.checked == 5
    assert "1 missing" in r.summary() and "first: b: sha256 differs" in r.summary()
    with pytest.raises(VerifyMismatch) as info:
        r.raise_for_mismatch("dir")
    assert info.value.exit_code == 1


def test_compare_maps_ok_and_unhashed():
    expected = {"a": (sha(b"a"), 1)}
    assert compare_maps(expected, {"a"}, {"a": sha(b"a")}).ok
    r = compare_maps(expected, {"a"}, {})
    assert r.modified[0].reason == "not hashed"
    assert compare_maps({}, set(), {}).ok


# -- verify_dir ----------------------------------------------------------------------------------

def test_verify_clean_variant(tmp_path, cache):
    root = make_variant(tmp_path / "v")
    seen = []
    r = verify_dir(root, cache=cache, jobs=2, on_progress=seen.append)
    assert r.ok, r.summary()
    assert r.checked == len(FILES) and r.hashed_files == len(FILES)
    assert r.hashed_bytes == sum(map(len, FILES.values())) == sum(seen)
    assert r.as_dict()["ok"] is True


def test_verify_reports_modified_missing_extra_at_once(tmp_path, cache):
    root = make_variant(tmp_path / "v")
    (root / "model-00001-of-00002.safetensors").write_bytes(b"X" * 5000)  # same size
    (root / "model-00002-of-00002.safetensors").write_bytes(b"B" * 6999)  # other size
    os.unlink(root / "sub" / "tokenizer.json")
    (root / "sub" / "new.bin").write_bytes(b"new")
    (root / "stray.txt").write_bytes(b"")
    r = verify_dir(root, cache=cache)
    assert not r.ok
    assert [(m.path, m.reason) for m in r.modified] == [
        ("model-00001-of-00002.safetensors", "sha256 differs"),
        ("model-00002-of-00002.safetensors", "size 6999 != 7000"),
    ]
    assert r.missing == ["sub/tokenizer.json"]
    assert r.extra == ["stray.txt", "sub/new.bin"]
    # The file of the wrong size was not hashed.
    assert r.hashed_files == 3 and r.hashed_bytes == 5000 + 8 + 0
    d = r.as_dict()
    assert d["modified"][1]["reason"] == "size 6999 != 7000"
    assert d["modified"][1]["actual_sha256"] is None


def test_verify_symlinks_and_non_files(tmp_path, cache):
    files = dict(FILES)
    root = make_variant(tmp_path / "v", files)
    # A symlink is judged by what it points at.
    real = root / "sub" / "tokenizer.json"
    os.replace(real, root / "sub" / "real.json")
    real.symlink_to("real.json")
    r = verify_dir(root, cache=cache)
    assert r.extra == ["sub/real.json"] and not r.modified and not r.missing
    # A dangling symlink, or a directory, where a file is expected: modified, not a regular file.
    os.unlink(real)
    real.symlink_to("nowhere")
    os.unlink(root / "config.json")
    (root / "config.json").mkdir()
    (root / "config.json" / "inner").write_text("x")
    r = verify_dir(root, cache=cache)
    assert [(m.path, m.reason) for m in r.modified] == [("sub/tokenizer.json",
                                                         "not a regular file inside the directory")]
    assert r.missing == ["config.json"]
    assert r.extra == ["config.json/inner", "sub/real.json"]


def test_list_files_skips_state_and_manifest(tmp_path):
    root = make_variant(tmp_path / "v")
    (root / "sub" / ".modelpatch").mkdir()  # only the root's .modelpatch/ is reserved
    (root / "sub" / ".modelpatch" / "x").write_text("x")
    names = set(list_files(root))
    assert names == set(FILES) | {"sub/.modelpatch/x"}
    assert MANIFEST_NAME not in names


def test_verify_errors(tmp_path, cache):
    with pytest.raises(InputError, match="not a directory"):
        verify_dir(tmp_path / "absent", cache=cache)
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="no provenance manifest"):
        verify_dir(tmp_path / "plain", cache=cache)


def test_full_verification_records_verified_digests(tmp_path, cache):
    root = make_variant(tmp_path / "v")
    assert verify_dir(root, cache=cache).ok
    for name, data in FILES.items():
        hit = cache.get(os.stat(root / name), require_verified=True)
        assert hit is not None and hit.sha256 == sha(data)
    # Next fast verification hashes nothing.
    r = verify_dir(root, cache=cache, fast=True)
    assert r.ok and r.hashed_files == 0 and r.cached_files == len(FILES)


def test_fast_mode_trusts_only_verified_rows(tmp_path, cache):
    root = make_variant(tmp_path / "v")
    target = root / "model-00001-of-00002.safetensors"
    st = os.stat(target)
    # A verified row that (wrongly) disagrees: fast mode believes it, full mode rehashes.
    assert cache.put(st, "f" * 64, verified=True)
    fast = verify_dir(root, cache=cache, fast=True)
    assert [m.path for m in fast.modified] == [target.name]
    assert fast.cached_files == 1
    # (the full run below records the true digest, replacing the bad row)
    full = verify_dir(root, cache=cache)
    assert full.ok and full.cached_files == 0 and full.hashed_files == len(FILES)
    assert cache.get(st).sha256 == sha(FILES[target.name])

    # An unverified row is never used by fast mode, even when it is right.
    other = root / "model-00002-of-00002.safetensors"
    other.chmod(0o644)
    other.write_bytes(b"B" * 7000)  # rewritten: the verified row no longer matches
    age(other, 1800)
    assert cache.put(os.stat(other), "e" * 64, verified=False)
    r = verify_dir(root, cache=cache, fast=True)
    assert r.ok and r.hashed_files == 1 and r.cached_files == len(FILES) - 1


def test_fresh_files_are_not_trusted_from_cache(tmp_path, cache):
    root = make_variant(tmp_path / "v", old=False)  # written just now: racily clean
    assert verify_dir(root, cache=cache).ok
    r = verify_dir(root, cache=cache, fast=True)
    assert r.ok and r.hashed_files == len(FILES)


def test_verify_with_unusable_cache(tmp_path):
    root = make_variant(tmp_path / "v")
    (tmp_path / "blocker").write_text("")
    broken = DigestCache(tmp_path / "blocker" / "digests.sqlite3")
    r = verify_dir(root, cache=broken, fast=True)
    assert r.ok and r.hashed_files == len(FILES)


# --- the manifest itself, and links out of the directory -----------------------------------

def _variant(kimi_dir, tmp_path):
    from fs_snapshot import copy_tree

    from patcher import api

    base = copy_tree(kimi_dir, tmp_path / "base")
    return api.apply("sm120-fp16-kv", base, out=tmp_path / "v").output


def _edit_manifest(variant, old: str, new: str) -> None:
    path = variant / MANIFEST_NAME
    text = path.read_text()
    assert old in text
    os.chmod(path, 0o644)
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(("old", "new", "says"), [
    ("Why this recipe exists", "Why this recipe EXISTS", "recipe text does not match"),
    ('"startedOn": "20', '"startedOn": "19', "differs from the"),
    ('"kind": "set"', '"kind": "sxt"', "change log does not match"),
])
def test_an_edited_manifest_fails_verification(kimi_dir, tmp_path, old, new, says):
    from fs_snapshot import cli

    variant = _variant(kimi_dir, tmp_path)
    assert verify_dir(variant).ok
    _edit_manifest(variant, old, new)
    report = verify_dir(variant)
    assert not report.ok and any(says in p for p in report.manifest_problems), report
    for fast in ([], ["--fast"]):
        result = cli("verify", variant, *fast)
        assert result.returncode == 1 and MANIFEST_NAME in result.stdout + result.stderr


def test_a_symlink_out_of_the_directory_is_not_a_match(kimi_dir, tmp_path):
    variant = _variant(kimi_dir, tmp_path)
    outside = tmp_path / "outside.model"
    target = variant / "tiktoken.model"
    outside.write_bytes(target.read_bytes())          # the very bytes, but outside
    target.unlink()
    target.symlink_to(outside)
    report = verify_dir(variant)
    assert [(m.path, m.reason) for m in report.modified] == [
        ("tiktoken.model", "not a regular file inside the directory")]


def test_an_edited_change_log_is_caught_even_when_the_patch_record_notes_the_new_manifest(
        kimi_dir, tmp_path):
    """The record's note is an ordinary file: an edit of the manifest's change log plus a new
    note still leaves the log's own digest to tell: the note alone is never trusted."""
    import hashlib
    import json

    from patcher.integrity.patch_record import RECORD_NAME, patch_dirs

    variant = _variant(kimi_dir, tmp_path)
    _edit_manifest(variant, '"kind": "set"', '"kind": "sxt"')
    record = patch_dirs(variant)[-1] / RECORD_NAME
    data = json.loads(record.read_text())
    data["manifest_sha256"] = hashlib.sha256((variant / MANIFEST_NAME).read_bytes()).hexdigest()
    os.chmod(record, 0o644)
    record.write_text(json.dumps(data))
    report = verify_dir(variant)
    assert not report.ok
    assert [p for p in report.manifest_problems if "change log does not match" in p], report
