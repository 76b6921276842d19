"""Resharding GGUF models with --max-shard-size: the files gguf-py's own
GGUFWriter writes for the same model and limit, byte for byte; merging a split set into one
file; verify and revert."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from fs_snapshot import cli, diff, snapshot
from gguf_fixtures import gguf, needs_gguf, read_back, write_tiny

from patcher import api
from patcher.cli import main
from patcher.gguf.format import read_header

pytestmark = needs_gguf
SAME_NAME = "gguf:\n  metadata:\n    - {set: general.name, value: tiny}\n"  # changes nothing


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _recipe(tmp_path, body=SAME_NAME):
    path = tmp_path / "r.yaml"
    path.write_text(f"modelpatch: 1\nname: r\ndescription: test\n{body}")
    return path


def _model(tmp_path, name, **kw):
    root = tmp_path / name
    root.mkdir(parents=True)
    write_tiny(root / "tiny.gguf", **kw)
    return root


def _gguf_files(root):
    return sorted(n for n in os.listdir(root) if n.endswith(".gguf"))


@pytest.mark.parametrize("limit", [20_000, 40_000])
def test_splitting_writes_what_gguf_py_writes(tmp_path, limit):
    root = _model(tmp_path, "single")
    expected = _model(tmp_path, "by-gguf-py", split_max_size=limit)
    out = api.apply(_recipe(tmp_path), root, out=tmp_path / "out", max_shard_size=limit).output
    names = _gguf_files(out)
    assert names == _gguf_files(expected) and len(names) > 2
    for name in names:
        assert (out / name).read_bytes() == (expected / name).read_bytes(), name
    assert api.verify(out).ok
    tensors = {}
    for name in names:                       # gguf-py's reader takes every file
        tensors.update(read_back(out / name)[1])
    assert tensors == read_back(root / "tiny.gguf")[1]


def test_merging_a_split_set_writes_the_single_file(tmp_path):
    split = _model(tmp_path, "split", split_max_tensors=8)
    single = _model(tmp_path, "single")
    out = api.apply(_recipe(tmp_path), split, out=tmp_path / "out", max_shard_size=10**9).output
    assert _gguf_files(out) == ["tiny.gguf"]
    assert (out / "tiny.gguf").read_bytes() == (single / "tiny.gguf").read_bytes()
    meta, _ = read_back(out / "tiny.gguf")
    assert not any(k.startswith("split.") for k in meta)
    back = api.revert(out, out=tmp_path / "back").output
    assert diff(snapshot(split), snapshot(back)) == []


def test_resharding_with_a_metadata_change_and_a_drop(tmp_path):
    root = _model(tmp_path, "glm", arch="glm4moe", nextn=1, split_max_tensors=10)
    out = api.apply("gguf-strip-mtp", root, out=tmp_path / "out", max_shard_size=30_000).output
    names = _gguf_files(out)
    headers = [read_header(out / n) for n in names]
    count = len(names)
    assert [h.get("split.no") for h in headers] == list(range(count))
    assert {h.get("split.count") for h in headers} == {count}
    total = sum(len(h.tensors) for h in headers)
    assert {h.get("split.tensors.count") for h in headers} == {total}
    assert headers[0].get("glm4moe.block_count") == 2
    assert all(set(h.kv) == {"split.no", "split.count", "split.tensors.count"}
               for h in headers[1:])
    assert not any("nextn" in t for h in headers for t in h.tensors)
    assert all(sum(t.nbytes for t in h.tensors.values()) <= 30_000 or len(h.tensors) == 1
               for h in headers)


def test_a_split_set_keeps_its_layout_without_the_option(tmp_path):
    root = _model(tmp_path, "split", split_max_tensors=8)
    plan = api.plan("gguf-context", root).to_json()
    assert {f["path"]: f["action"] for f in plan["files"]} == {
        "tiny-00001-of-00003.gguf": "rewrite-shard", "tiny-00002-of-00003.gguf": "link",
        "tiny-00003-of-00003.gguf": "link"}


def test_in_place_reshard_reverts_byte_identical(tmp_path):
    root = _model(tmp_path, "single")
    before = snapshot(root)
    api.apply_in_place("gguf-context", root, max_shard_size=25_000)
    assert len(_gguf_files(root)) > 2 and api.verify(root).ok
    api.revert(root)
    assert diff(before, snapshot(root)) == []


def test_a_new_name_that_is_another_file_is_refused(tmp_path):
    root = _model(tmp_path, "split", split_max_tensors=8)
    write_tiny(root / "tiny.gguf", arch="clip", blocks=1,      # a projector, not the model
               extra_kv={"general.type": (gguf.GGUFValueType.STRING, "mmproj")})
    result = CliRunner().invoke(main, ["plan", "gguf-context", str(root),
                                       "--max-shard-size", "1GB"])
    assert result.exit_code == 2, result.output
    assert "would write tiny.gguf" in result.stderr and "Traceback" not in result.stderr


def test_a_merged_file_from_gguf_split_is_read(tmp_path):
    """llama.cpp's gguf-split --merge leaves split.count = 0 in the merged file."""
    root = tmp_path / "merged"
    root.mkdir()
    write_tiny(root / "tiny.gguf", extra_kv={
        "split.no": (gguf.GGUFValueType.UINT16, 0), "split.count": (gguf.GGUFValueType.UINT16, 0),
        "split.tensors.count": (gguf.GGUFValueType.INT32, 21)})
    out = api.apply("gguf-context", root, out=tmp_path / "out").output
    assert read_back(out / "tiny.gguf")[0]["llama.context_length"] == 8192


def _in_place_reshard_points(tmp_path):
    """The fault points a complete in-place reshard passes, and the tree it leaves."""
    root = _model(tmp_path / "trace", "single")
    trace = tmp_path / "trace.txt"
    r = cli("apply", "gguf-context", root, "--in-place", "--max-shard-size", "25KB",
            env={"MODELPATCH_FAULT_TRACE": str(trace),
                 "MODELPATCH_CACHE_DIR": str(tmp_path / "dc")})
    assert r.returncode == 0, r.stderr
    counts, points = {}, []
    for name in trace.read_text().splitlines():
        counts[name] = counts.get(name, 0) + 1
        points.append(f"{name}#{counts[name]}")
    return points, snapshot(root, vary=VARY)


VARY = ("modelpatch.provenance.json", "record.json")


def _kill_in_place_reshard_at(tmp_path, point, after):
    case = tmp_path / point.replace("/", "_").replace(":", "_")
    root = _model(case, "single")
    before = snapshot(root, vary=VARY)
    env = {"MODELPATCH_CACHE_DIR": str(case / "dc")}
    r = cli("apply", "gguf-context", root, "--in-place", "--max-shard-size", "25KB",
            env={**env, "MODELPATCH_FAULT": f"kill@{point}"})
    assert r.returncode == -9, (point, r.stderr)
    check = cli("verify", root, env=env)                 # recovers first
    assert "Traceback" not in check.stderr, check.stderr
    state = snapshot(root, vary=VARY)
    assert state in (before, after), (point, diff(before, state)[:4], diff(after, state)[:4])
    if state == after:
        assert check.returncode == 0, check.stdout
    rerun = cli("apply", "gguf-context", root, "--in-place", "--max-shard-size", "25KB", env=env)
    assert rerun.returncode == (0 if state == before else 1), rerun.stderr   # 1: nothing to do


def test_kill_9_during_an_in_place_reshard_leaves_the_base_or_the_result(tmp_path):
    points, after = _in_place_reshard_points(tmp_path)
    # preparing (rolled back), switching (rolled forward), cleaning up; -m slow: every point
    wanted = ["tensor:", "journal:install:tiny-00003", "journal:finish"]
    chosen = [next(p for p in points if p.startswith(w)) for w in wanted]
    for point in chosen:
        _kill_in_place_reshard_at(tmp_path, point, after)


@pytest.mark.slow
def test_kill_9_at_every_point_of_an_in_place_reshard(tmp_path):
    points, after = _in_place_reshard_points(tmp_path)
    for point in points:
        _kill_in_place_reshard_at(tmp_path, point, after)
