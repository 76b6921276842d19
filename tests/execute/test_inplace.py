"""apply --in-place and revert (in place), on a plain directory and on a Hugging Face cache
snapshot: byte-, link- and mode-identical round trips, stacked patches, blobs never touched."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from fs_snapshot import (
    MANIFEST,
    blobs,
    cli,
    copy_tree,
    diff,
    problem_lines,
    scan_warnings,
    snapshot,
)

from patcher import api
from patcher.errors import GuardRefused, LockHeld, VerifyMismatch
from patcher.model.safetensors_io import read_header

REPO_ID = "nvidia/Kimi-K2.5-NVFP4"
CONFIG_CHANGED = {"config.json", "hf_quant_config.json"}
SHARDS_CHANGED = {"model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
                  "model.safetensors.index.json"}


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


class Target:
    """A model directory to patch: a plain copy, or a snapshot of a hub cache (with a second
    revision sharing its blobs, which must never change)."""

    def __init__(self, root: Path, cache_root: Path | None = None,
                 repo: Path | None = None, other: Path | None = None):
        self.root, self.cache_root, self.repo, self.other = root, cache_root, repo, other

    @property
    def is_snapshot(self) -> bool:
        return self.repo is not None

    def blobs(self):
        return blobs(self.repo) if self.repo else {}

    def warnings(self):
        return scan_warnings(self.cache_root) if self.cache_root else []

    def others(self):
        """The other revision's view, followed through its links."""
        return snapshot_following(self.other) if self.other else {}


def snapshot_following(root: Path) -> dict:
    from fs_snapshot import sha256

    return {p.relative_to(root).as_posix(): sha256(p) for p in sorted(root.rglob("*"))
            if p.is_file()}


def make_target(kind: str, kimi_dir: Path, tmp_path: Path) -> Target:
    if kind == "plain":
        return Target(copy_tree(kimi_dir, tmp_path / "kimi"))
    from examples.generate import make_hf_cache_snapshot

    cache_root = tmp_path / "hub"
    root = make_hf_cache_snapshot(kimi_dir, cache_root, REPO_ID)
    other = make_hf_cache_snapshot(kimi_dir, cache_root, REPO_ID, commit="1" * 40)
    return Target(root, cache_root, root.parent.parent, other)


@pytest.fixture(params=["plain", "hf-snapshot"])
def target(request, kimi_dir, tmp_path) -> Target:
    return make_target(request.param, kimi_dir, tmp_path)


def _ok(result, *expect):
    assert result.returncode == 0, result.stderr
    for text in expect:
        assert text in result.stdout + result.stderr
    return result


def test_apply_in_place_then_revert_round_trip(target: Target):
    root = target.root
    before, blobs_before, warnings_before = snapshot(root), target.blobs(), target.warnings()
    other_before = target.others()

    _ok(cli("apply", "sm120-fp16-kv", root, "--in-place", "-q"))
    after = snapshot(root)
    for rel, entry in before.items():
        if rel in CONFIG_CHANGED:
            assert after[rel][0] == "f", rel                 # a new regular file (read-only)
            assert after[rel][1] == 0o444
        else:
            assert after[rel] == entry, rel                  # unchanged: same link or file
    if target.is_snapshot:
        assert all(before[rel][0] == "l" for rel in CONFIG_CHANGED)
        # The originals are kept as links to the very same blobs.
        originals = root / ".modelpatch/patches/0001-sm120-fp16-kv/originals"
        for rel in CONFIG_CHANGED:
            assert (originals / rel).is_symlink()
            assert os.path.realpath(originals / rel) == os.path.realpath(
                target.repo / "blobs" / Path(before[rel][1]).name)
    config = json.loads((root / "config.json").read_text())
    assert config["quantization_config"]["kv_cache_scheme"] is None
    assert json.loads((root / "hf_quant_config.json").read_text())["quantization"][
        "kv_cache_quant_algo"] is None
    _ok(cli("verify", root), "match")
    assert target.blobs() == blobs_before
    assert target.warnings() == warnings_before
    assert target.others() == other_before

    _ok(cli("revert", root), "reverted 0001-sm120-fp16-kv")
    assert diff(snapshot(root), before) == []
    assert not (root / ".modelpatch").exists()
    assert target.blobs() == blobs_before
    assert target.warnings() == warnings_before
    assert target.others() == other_before


def test_round_trip_through_the_python_api(target: Target):
    root = target.root
    before, blobs_before = snapshot(root), target.blobs()
    result = api.apply_in_place("sm120-fp16-kv", root)
    assert result.output == root and result.files == 12
    assert api.verify(root).ok
    with pytest.raises(GuardRefused):          # already applied: the guard refuses
        api.apply_in_place("sm120-fp16-kv", root)
    reverted = api.revert(root)
    assert reverted.reverted == ["0001-sm120-fp16-kv"]
    assert diff(snapshot(root), before) == []
    assert target.blobs() == blobs_before


def _kv_scales(root: Path) -> list[str]:
    names = []
    for shard in sorted(root.glob("*.safetensors")):
        names += [n for n in read_header(shard).tensors if n.endswith(("k_scale", "v_scale"))]
    return names


def test_stacked_in_place_patches_revert_one_by_one_and_all(target: Target):
    root = target.root
    original, blobs_before, warnings_before = snapshot(root), target.blobs(), target.warnings()
    assert _kv_scales(root)

    _ok(cli("apply", "sm120-fp16-kv", root, "--in-place", "-q"))
    first = snapshot(root)
    _ok(cli("apply", "drop-kv-scales", root, "--in-place", "-q", "-j", "2"))
    second = snapshot(root)
    assert _kv_scales(root) == []
    for rel in SHARDS_CHANGED:
        assert second[rel][0] == "f" and second[rel] != first[rel]
    for rel in set(first) - SHARDS_CHANGED - {MANIFEST} - {p for p in first
                                                          if p.startswith(".modelpatch")}:
        assert second[rel] == first[rel], rel    # unchanged shards stay links in a snapshot
    _ok(cli("verify", root), "match")
    assert target.warnings() == warnings_before

    _ok(cli("revert", root), "reverted 0002-drop-kv-scales")
    assert diff(snapshot(root), first) == []          # exactly the state after the first patch
    _ok(cli("verify", root), "match")
    _ok(cli("revert", root), "reverted 0001-sm120-fp16-kv")
    assert diff(snapshot(root), original) == []
    r = cli("revert", root)
    assert r.returncode == 2 and "nothing to revert" in r.stderr

    _ok(cli("apply", "sm120-fp16-kv", root, "--in-place", "-q"))
    _ok(cli("apply", "drop-kv-scales", root, "--in-place", "-q"))
    _ok(cli("revert", root, "--all"), "reverted 0002-drop-kv-scales, 0001-sm120-fp16-kv")
    assert diff(snapshot(root), original) == []
    assert not (root / ".modelpatch").exists()
    assert target.blobs() == blobs_before
    assert target.warnings() == warnings_before


def test_revert_refuses_a_modified_directory_unless_forced(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    original = snapshot(root)
    api.apply_in_place("sm120-fp16-kv", root)
    config = root / "config.json"
    os.chmod(config, 0o644)
    config.write_text(config.read_text().replace("{", "{ ", 1))
    os.chmod(config, 0o444)
    r = cli("revert", root)
    assert r.returncode == 1
    assert "changed since the patch" in r.stderr and "--ignore-changes" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    (root / "extra.txt").write_text("x")
    with pytest.raises(VerifyMismatch, match="1 modified, 0 missing, 1 extra"):
        api.revert(root)
    os.unlink(root / "extra.txt")
    _ok(cli("revert", root, "--ignore-changes"), "reverted")
    assert diff(snapshot(root), original) == []


def test_revert_in_place_refuses_an_out_of_place_variant(kimi_dir, tmp_path):
    base = copy_tree(kimi_dir, tmp_path / "base")
    variant = tmp_path / "variant"
    _ok(cli("apply", "sm120-fp16-kv", base, "-o", variant, "-q"))
    before = snapshot(variant)
    r = cli("revert", variant)
    assert r.returncode == 2
    assert "variant" in r.stderr and "revert DIR -o OUT" in r.stderr
    assert snapshot(variant) == before


def test_in_place_on_top_of_a_variant_reverts_to_the_variant(kimi_dir, tmp_path):
    base = copy_tree(kimi_dir, tmp_path / "base")
    variant = tmp_path / "variant"
    _ok(cli("apply", "sm120-fp16-kv", base, "-o", variant, "-q"))
    before = snapshot(variant)
    _ok(cli("apply", "drop-kv-scales", variant, "--in-place", "-q"))
    r = _ok(cli("revert", variant, "--all"), "reverted 0002-drop-kv-scales")
    assert "0001" not in r.stdout and "revert DIR -o OUT" in r.stderr
    assert diff(snapshot(variant), before) == []


def test_added_and_dropped_files_new_directories_and_nested_links(target: Target, tmp_path):
    """Adds a file in new directories; drops a top-level file and one in a subdirectory (in a
    snapshot, links whose originals must keep reaching their blobs from deeper down)."""
    root = target.root
    original, blobs_before, warnings_before = snapshot(root), target.blobs(), target.warnings()
    recipe = tmp_path / "add.yaml"
    recipe.write_text("modelpatch: 1\nname: add-notes\ndescription: d\nfiles:\n"
                      "  - add: notes/deep/README.md\n    content: hello\n"
                      "  - drop: tiktoken.model\n  - drop: docs/deploy_guidance.md\n")
    _ok(cli("apply", recipe, root, "--in-place", "-q"))
    assert (root / "notes/deep/README.md").read_text() == "hello"
    assert not os.path.lexists(root / "tiktoken.model")
    assert not os.path.lexists(root / "docs/deploy_guidance.md")
    _ok(cli("verify", root))
    assert target.warnings() == warnings_before
    originals = root / ".modelpatch/patches/0001-add-notes/originals"
    assert (originals / "docs/deploy_guidance.md").read_bytes()     # resolves
    _ok(cli("revert", root))
    assert diff(snapshot(root), original) == []
    assert target.blobs() == blobs_before
    assert target.warnings() == warnings_before


@pytest.mark.parametrize("point", ["file:config.json", "manifest", "hashing"])
def test_disk_full_while_preparing_changes_nothing(kimi_dir, tmp_path, point):
    root = copy_tree(kimi_dir, tmp_path / "m")
    original = snapshot(root)
    r = cli("apply", "sm120-fp16-kv", root, "--in-place", env={"MODELPATCH_FAULT":
                                                                 f"enospc@{point}"})
    assert r.returncode == 3, r.stderr
    lines = problem_lines(r.stderr)
    assert lines[0].startswith("modelpatch: error: ") and "No space left" in r.stderr
    assert "Traceback" not in r.stderr and len(lines) == 1
    assert diff(snapshot(root), original) == []


def test_io_error_during_the_switch_keeps_the_journal_and_the_next_command_completes(
        kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    r = cli("apply", "sm120-fp16-kv", root, "--in-place",
            env={"MODELPATCH_FAULT": "eio@journal:install:hf_quant_config.json"})
    assert r.returncode == 3 and "completes it" in r.stderr and "Traceback" not in r.stderr
    assert (root / ".modelpatch/journal.json").exists()
    r = _ok(cli("verify", root), "match")
    assert "completed the interrupted apply of 0001-sm120-fp16-kv" in r.stderr
    assert not (root / ".modelpatch/journal.json").exists()


def test_lock_is_held_for_the_whole_in_place_apply(kimi_dir, tmp_path, monkeypatch):
    """A second process (simulated by a second flock) is refused while the apply runs."""
    from patcher import faults
    from patcher.execute.locking import lock_directory

    root = copy_tree(kimi_dir, tmp_path / "m")
    seen = []

    def probe(name):
        if name == "journal:switch":
            with pytest.raises(LockHeld, match="another modelpatch process is working on"), \
                    lock_directory(root, exclusive=False):
                pass
            seen.append(name)

    monkeypatch.setattr(faults, "point", probe)
    api.apply_in_place("sm120-fp16-kv", root)
    assert seen == ["journal:switch"]


def test_refuses_a_symlinked_state_directory(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / ".modelpatch")
    r = cli("apply", "sm120-fp16-kv", root, "--in-place")
    assert r.returncode == 2 and ".modelpatch" in r.stderr
    assert not any((tmp_path / "elsewhere").iterdir())


def test_modes_of_written_files_are_read_only_and_originals_keep_theirs(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    os.chmod(root / "config.json", 0o640)
    api.apply_in_place("sm120-fp16-kv", root)
    assert stat.S_IMODE((root / "config.json").stat().st_mode) == 0o444
    kept = root / ".modelpatch/patches/0001-sm120-fp16-kv/originals/config.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    api.revert(root)
    assert stat.S_IMODE((root / "config.json").stat().st_mode) == 0o640


def test_a_plan_made_before_another_process_patched_is_not_applied(kimi_dir, tmp_path):
    """The plan carries what it read: a stale one (here: made before the same recipe was
    applied by someone else) is refused under the lock, never applied a second time."""
    from patcher.errors import PlanError
    from patcher.execute import inplace
    from patcher.model.model_dir import ModelDir

    root = copy_tree(kimi_dir, tmp_path / "m")
    stale_model = ModelDir.open(root)
    stale_plan = api.plan("sm120-fp16-kv", root, options={"in_place": True})
    api.apply_in_place("sm120-fp16-kv", root)
    patched = snapshot(root, vary=(MANIFEST,))
    with pytest.raises(PlanError, match="since the plan was made"):
        inplace.apply_in_place(stale_plan, stale_model)
    assert snapshot(root, vary=(MANIFEST,)) == patched


def test_failure_to_create_the_journal_is_a_clean_error(kimi_dir, tmp_path, monkeypatch):
    import errno

    from patcher.errors import OperationFailed
    from patcher.execute.journal import Journal

    root = copy_tree(kimi_dir, tmp_path / "m")
    original = snapshot(root)

    def refuse(self, root):
        raise PermissionError(errno.EACCES, "Permission denied", str(root / ".modelpatch"))

    monkeypatch.setattr(Journal, "create", refuse)
    with pytest.raises(OperationFailed, match="Permission denied"):
        api.apply_in_place("sm120-fp16-kv", root)
    assert diff(snapshot(root), original) == []


def test_leftovers_of_a_kill_before_the_journal_are_cleaned(kimi_dir, tmp_path):
    """A kill between creating .modelpatch/ and writing the journal leaves at most an empty
    state directory (or a journal.json.tmp): the next command removes it."""
    root = copy_tree(kimi_dir, tmp_path / "m")
    original = snapshot(root)
    (root / ".modelpatch").mkdir()
    (root / ".modelpatch/journal.json.tmp").write_text('{"op": "apply"')
    r = cli("verify", root)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert diff(snapshot(root), original) == []


def test_tampered_record_or_journal_cannot_reach_outside(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    api.apply_in_place("sm120-fp16-kv", root)
    record_path = root / ".modelpatch/patches/0001-sm120-fp16-kv/record.json"
    record = json.loads(record_path.read_text())
    record["added"] = ["../outside.txt"]
    os.chmod(record_path, 0o644)
    record_path.write_text(json.dumps(record))
    r = cli("revert", root)
    assert r.returncode == 2 and "not inside the directory" in r.stderr
    journal = {"version": 1, "op": "revert", "phase": "switching", "done": 0,
               "patch_dir": ".modelpatch/patches/0001-sm120-fp16-kv",
               "staging": ".modelpatch/staging-0001", "trash": ".modelpatch/trash-0001",
               "steps": [["discard", "../outside.txt"]], "remove_patch_dir": True}
    (root / ".modelpatch/journal.json").write_text(json.dumps(journal))
    r = cli("verify", root)
    assert r.returncode == 2 and "unreadable journal" in r.stderr
    assert outside.read_text() == "precious"
