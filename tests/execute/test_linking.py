"""How a variant carries the base's files: ``plan`` predicts the method for
the actual output path, ``apply`` warns before a large copy, ``--link`` chooses, and the
``--json`` byte counts say what was linked and what was copied."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli import main
from patcher.execute.linking import can_reflink_in

SHARD = "model-00001-of-00004.safetensors"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.fixture
def kimi(kimi_dir, tmp_path) -> Path:
    dst = tmp_path / "kimi"
    shutil.copytree(kimi_dir, dst, symlinks=True)
    return dst


@pytest.fixture
def other_fs(tmp_path) -> Path:
    """A directory on another filesystem than ``tmp_path`` (/dev/shm here), removed after."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) \
            or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no writable /dev/shm on another filesystem than the tmp dir")
    path = Path(tempfile.mkdtemp(prefix="modelpatch-test-", dir=shm))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(*args, code: int = 0):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == code, result.output + (result.stderr or "")
    return result


def plan_json(kimi: Path, out: Path, *extra) -> dict:
    return json.loads(run("plan", "sm120-fp16-kv", kimi, "-o", out, "--json", *extra).stdout)


def test_same_filesystem_plan_predicts_a_link_and_apply_links(kimi, tmp_path):
    out = tmp_path / "v"
    plan = plan_json(kimi, out)
    expected = "reflink" if can_reflink_in(tmp_path) else "hardlink"
    assert plan["link"]["method"] == expected and plan["link"]["output"] == str(out)
    b = plan["bytes"]
    assert b["copied"] == 0 and b["linked"] >= b["unchanged"] > 0
    text = run("plan", "sm120-fp16-kv", kimi, "-o", out).stdout
    assert f"link: {expected} into {out}" in text
    result = json.loads(run("apply", "sm120-fp16-kv", kimi, "-o", out, "--json").stdout)
    assert result["link_method"] == expected
    assert result["bytes_linked"] == b["linked"] and result["bytes_copied"] == 0
    if expected == "hardlink":
        assert (out / SHARD).stat().st_ino == (kimi / SHARD).stat().st_ino
        assert "editing one edits both" in text and "--link copy" in text


def test_other_filesystem_plan_predicts_a_copy_and_apply_warns(kimi, other_fs, caplog,
                                                              monkeypatch):
    out = other_fs / "v"
    plan = plan_json(kimi, out)
    assert plan["link"]["method"] == "copy"
    assert "another filesystem" in plan["link"]["reason"]
    b = plan["bytes"]
    assert b["linked"] == 0 and b["copied"] >= b["unchanged"] > 0
    text = run("plan", "sm120-fp16-kv", kimi, "-o", out).stdout
    assert "copied." in text and "linked" not in text.splitlines()[-2]

    monkeypatch.setenv("MODELPATCH_COPY_WARN_BYTES", str(b["copied"] - 1))
    with caplog.at_level(logging.WARNING, logger="modelpatch"):
        result = api.apply("sm120-fp16-kv", kimi, out=out)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "copying 4.24 MiB instead of linking" in warning and str(other_fs) in warning
    assert result.link_method == "copy"
    assert result.bytes_copied == b["copied"] and result.bytes_linked == 0
    assert (out / SHARD).stat().st_dev != (kimi / SHARD).stat().st_dev
    assert api.verify(out).ok


def test_no_warning_below_the_threshold_or_for_an_explicit_copy(kimi, other_fs, caplog,
                                                                monkeypatch):
    with caplog.at_level(logging.WARNING, logger="modelpatch"):
        api.apply("sm120-fp16-kv", kimi, out=other_fs / "below")     # default: 1 GiB
        monkeypatch.setenv("MODELPATCH_COPY_WARN_BYTES", "0")
        api.apply("sm120-fp16-kv", kimi, out=other_fs / "asked", link="copy")
    assert not [r for r in caplog.records if "copying" in r.getMessage()]


def test_strict_link_modes_refuse_to_fall_back(kimi, other_fs, tmp_path):
    for command in ("plan", "apply"):
        result = run(command, "sm120-fp16-kv", kimi, "-o", other_fs / "v", "--link", "hardlink",
                     code=2)
        assert "hardlinks cannot cross filesystems" in result.stderr
    assert not (other_fs / "v").exists()
    if not can_reflink_in(tmp_path):
        result = run("apply", "sm120-fp16-kv", kimi, "-o", tmp_path / "v", "--link", "reflink",
                     code=2)
        assert "cannot clone files" in result.stderr and not (tmp_path / "v").exists()


def test_link_copy_and_its_copy_alias(kimi, tmp_path):
    for flag, out in ((["--link", "copy"], tmp_path / "a"), (["--copy"], tmp_path / "b")):
        plan = plan_json(kimi, out, *flag[:2]) if flag[0] == "--link" else None
        result = json.loads(run("apply", "sm120-fp16-kv", kimi, "-o", out, "--json",
                                *flag).stdout)
        assert result["link_method"] == "copy" and result["bytes_linked"] == 0
        assert result["bytes_copied"] > 0
        if plan is not None:
            assert plan["link"]["method"] == "copy" and plan["bytes"]["copied"] == \
                result["bytes_copied"]
        assert (out / SHARD).stat().st_ino != (kimi / SHARD).stat().st_ino
    result = run("apply", "sm120-fp16-kv", kimi, "-o", tmp_path / "c", "--copy", "--link",
                 "hardlink", code=2)
    assert "--copy is --link copy" in result.output
