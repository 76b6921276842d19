"""``revert DIR -o OUT``: rebuilding the base of a variant from the variant and its revert data."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from fs_snapshot import MANIFEST, cli, copy_tree, diff, sha256, snapshot

from patcher import api
from patcher.errors import InputError

REPLACED = ("config.json", "hf_quant_config.json")


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.fixture
def base(kimi_dir, tmp_path) -> Path:
    return copy_tree(kimi_dir, tmp_path / "base")


def _ok(result, *expect):
    assert result.returncode == 0, result.stderr
    for text in expect:
        assert text in result.stdout + result.stderr
    return result


def _files(root: Path) -> dict:
    """The tree without directory modes (a rebuilt directory is made by mkdir)."""
    return {k: v for k, v in snapshot(root).items() if v[0] != "d"}


def test_rebuild_base_from_variant_is_byte_identical_and_shares_storage(base, tmp_path):
    variant, out = tmp_path / "variant", tmp_path / "out"
    expected = snapshot(base)
    _ok(cli("apply", "sm120-fp16-kv", base, "-o", variant, "-q"))
    originals = variant / ".modelpatch/patches/0001-sm120-fp16-kv/originals"
    for rel in REPLACED:          # the revert data is the base's own inodes: no space
        assert os.stat(originals / rel).st_ino == os.stat(base / rel).st_ino
    variant_before = snapshot(variant)

    _ok(cli("revert", variant, "-o", out), "reverted 0001-sm120-fp16-kv")
    assert diff(snapshot(out), expected) == []
    for rel in expected:
        if expected[rel][0] == "f":   # every rebuilt file shares the base's storage
            assert os.stat(out / rel).st_ino == os.stat(base / rel).st_ino, rel
    assert snapshot(variant) == variant_before       # the variant is only read
    assert not list(tmp_path.glob(".out*"))           # no staging or lock file left


def test_rebuild_still_works_after_the_base_is_deleted(base, tmp_path):
    variant, out = tmp_path / "variant", tmp_path / "out"
    expected = snapshot(base)
    api.apply("sm120-fp16-kv", base, out=variant)
    shutil.rmtree(base)
    result = api.revert(variant, out=out)
    assert result.reverted == ["0001-sm120-fp16-kv"]
    assert diff(snapshot(out), expected) == []
    assert api.verify(variant).ok


def test_rebuild_a_stacked_chain_one_patch_or_all(base, tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    expected = snapshot(base)
    _ok(cli("apply", "sm120-fp16-kv", base, "-o", v1, "-q"))
    _ok(cli("apply", "drop-kv-scales", v1, "-o", v2, "-q"))
    _ok(cli("revert", v2, "-o", tmp_path / "back1"), "reverted 0002-drop-kv-scales")
    assert diff(_files(tmp_path / "back1"), _files(v1)) == []
    _ok(cli("verify", tmp_path / "back1"), "match")
    r = _ok(cli("revert", v2, "-o", tmp_path / "back0", "--all", "--json"))
    assert '"0002-drop-kv-scales"' in r.stdout and '"0001-sm120-fp16-kv"' in r.stdout
    assert diff(snapshot(tmp_path / "back0"), expected) == []


def test_rebuild_from_an_in_place_patched_hub_snapshot(kimi_dir, tmp_path):
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(kimi_dir, tmp_path / "hub", "org/kimi")
    content = {p.name: sha256(p) for p in snap.iterdir() if p.is_file()}
    api.apply_in_place("sm120-fp16-kv", snap)
    api.apply_in_place("drop-kv-scales", snap)
    patched = snapshot(snap)
    api.revert(snap, out=tmp_path / "out1")          # the state after the first patch
    _ok(cli("verify", tmp_path / "out1"), "match")
    api.revert(snap, out=tmp_path / "out0", all_patches=True)
    out0 = tmp_path / "out0"
    assert {p.name: sha256(p) for p in out0.iterdir() if p.is_file()} == content
    assert not (out0 / ".modelpatch").exists() and not (out0 / MANIFEST).exists()
    assert snapshot(snap) == patched
    # The rebuilt first stage can itself be reverted in place (its originals are real files).
    api.revert(tmp_path / "out1")
    assert {p.name: sha256(p) for p in (tmp_path / "out1").iterdir() if p.is_file()} == content


def test_modified_variant_is_refused_unless_forced(base, tmp_path):
    variant, out = tmp_path / "variant", tmp_path / "out"
    expected = snapshot(base)
    api.apply("sm120-fp16-kv", base, out=variant)
    config = variant / "config.json"
    os.chmod(config, 0o644)
    config.write_text("{}\n")
    r = cli("revert", variant, "-o", out)
    assert r.returncode == 1 and "changed since the patch" in r.stderr
    assert "config.json" in r.stderr and "--ignore-changes" in r.stderr
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    _ok(cli("revert", variant, "-o", out, "--ignore-changes"))
    assert diff(snapshot(out), expected) == []     # the replaced file comes from originals/


def test_rebuild_refuses_an_existing_output_and_the_directory_itself(base, tmp_path):
    variant = tmp_path / "variant"
    api.apply("sm120-fp16-kv", base, out=variant)
    (tmp_path / "taken").mkdir()
    r = cli("revert", variant, "-o", tmp_path / "taken")
    assert r.returncode == 2 and "already exists" in r.stderr
    assert "choose another, or --force replaces an earlier rebuild of this base" in r.stderr
    with pytest.raises(InputError, match="directory itself"):
        api.revert(variant, out=variant)
    r = cli("revert", base, "-o", tmp_path / "x")
    assert r.returncode == 2 and "nothing to revert" in r.stderr


def test_force_replaces_an_earlier_rebuild_of_the_same_base_only(base, tmp_path):
    variant, out = tmp_path / "variant", tmp_path / "out"
    expected = snapshot(base)
    api.apply("sm120-fp16-kv", base, out=variant)
    _ok(cli("revert", variant, "-o", out))
    _ok(cli("revert", variant, "-o", out, "--force"))       # the same rebuild again
    assert diff(snapshot(out), expected) == [] and not list(tmp_path.glob(".out*"))
    config = out / "config.json"
    config.unlink()                     # a new file: the rebuilt one shares the base's inode
    config.write_text("{}\n")                               # no longer the base: kept
    r = cli("revert", variant, "-o", out, "--force")
    assert r.returncode == 2 and "not an earlier rebuild of this base" in r.stderr
    assert config.read_text() == "{}\n"
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    r = cli("revert", variant, "-o", stranger, "--force")
    assert r.returncode == 2 and "other files than the rebuilt base" in r.stderr
    assert (stranger / "notes.txt").read_text() == "mine"


def test_force_without_output_points_at_ignore_changes(base, tmp_path):
    api.apply("sm120-fp16-kv", base, out=tmp_path / "variant")
    r = cli("revert", tmp_path / "variant", "--force")
    assert r.returncode == 2 and "--force replaces an existing output" in r.stderr
    assert "--ignore-changes" in r.stderr


def test_missing_revert_data_is_a_clear_error(base, tmp_path):
    variant, out = tmp_path / "variant", tmp_path / "out"
    api.apply("sm120-fp16-kv", base, out=variant)
    os.unlink(variant / ".modelpatch/patches/0001-sm120-fp16-kv/originals/config.json")
    r = cli("revert", variant, "-o", out)
    assert r.returncode == 2 and "original of config.json is missing" in r.stderr
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_rebuild_all_through_an_in_place_patch_of_a_hub_snapshot(kimi_dir, tmp_path):
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(kimi_dir, tmp_path / "hub", "org/kimi")
    content = {p.name: sha256(p) for p in snap.iterdir() if p.is_file()}
    api.apply_in_place("sm120-fp16-kv", snap)
    api.apply("drop-kv-scales", snap, out=tmp_path / "v")
    api.revert(tmp_path / "v", out=tmp_path / "out", all_patches=True)
    assert {p.name: sha256(p) for p in (tmp_path / "out").iterdir() if p.is_file()} == content


def test_lost_manifest_is_refused_unless_forced(base, tmp_path):
    expected = snapshot(base)
    api.apply("sm120-fp16-kv", base, out=tmp_path / "v")
    os.unlink(tmp_path / "v" / MANIFEST)
    r = cli("revert", tmp_path / "v", "-o", tmp_path / "out")
    assert r.returncode == 1 and "no provenance manifest" in r.stderr
    assert "--ignore-changes" in r.stderr
    _ok(cli("revert", tmp_path / "v", "-o", tmp_path / "out", "--ignore-changes"))
    assert diff(snapshot(tmp_path / "out"), expected) == []


def test_revert_of_a_missing_directory(tmp_path):
    r = cli("revert", tmp_path / "nope")
    assert r.returncode == 2 and "no such directory" in r.stderr
    r = cli("revert", tmp_path / "nope", "-o", tmp_path / "out")
    assert r.returncode == 2 and "no such directory" in r.stderr


def test_damaged_revert_data_is_found_before_anything_moves(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    original = snapshot(root)
    api.apply_in_place("sm120-fp16-kv", root)
    kept = root / ".modelpatch/patches/0001-sm120-fp16-kv/originals/config.json"
    os.chmod(kept, 0o644)
    with open(kept, "a") as f:
        f.write(" ")
    patched = snapshot(root)
    result = cli("revert", root)
    assert result.returncode == 1 and "revert data is damaged" in result.stderr
    assert "config.json" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert diff(snapshot(root), patched) == []          # the patched state, untouched
    forced = cli("revert", root, "--ignore-changes")            # to the damaged bytes, and says so
    assert forced.returncode == 0 and "revert data is damaged" in forced.stderr
    assert [d.split(":")[0] for d in diff(snapshot(root), original)] == ["config.json"]


def test_several_recipes_applied_as_one_are_revertible_as_a_variant_and_in_place(base, tmp_path):
    expected = snapshot(base)
    variant = tmp_path / "variant"
    _ok(cli("apply", "sm120-fp16-kv", "drop-kv-scales", base, "-o", variant, "-q"))
    name = "0001-sm120-fp16-kv+drop-kv-scales"
    assert (variant / ".modelpatch/patches" / name / "record.json").is_file()
    _ok(cli("verify", variant), "match")
    _ok(cli("revert", variant, "-o", tmp_path / "back"), f"reverted {name}")
    assert diff(snapshot(tmp_path / "back"), expected) == []

    _ok(cli("apply", "sm120-fp16-kv", "drop-kv-scales", base, "--in-place", "-q"))
    _ok(cli("verify", base), "match")
    _ok(cli("revert", base), f"reverted {name}")
    assert diff(snapshot(base), expected) == []
