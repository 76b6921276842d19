"""The one way modelpatch writes a small file durably (``patcher.fsops``)."""

from __future__ import annotations

import os
import stat

import pytest

from patcher import fsops


def test_replace_file_replaces_whole_with_its_mode_and_leaves_no_temp(tmp_path):
    target = tmp_path / "refs.json"
    target.write_bytes(b"old")
    fsops.replace_file(target, b"new contents", mode=0o444, prefix="json-")
    assert target.read_bytes() == b"new contents"
    assert stat.S_IMODE(target.stat().st_mode) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["refs.json"]


def test_replace_file_writes_its_temp_file_where_told(tmp_path, monkeypatch):
    (tmp_path / "tmp").mkdir()
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(fsops.os, "replace",
                        lambda src, dst: (seen.append(os.path.dirname(src)),
                                          real_replace(src, dst)))
    fsops.replace_file(tmp_path / "repo.json", b"{}", tmp_dir=tmp_path / "tmp")
    assert seen == [str(tmp_path / "tmp")] and (tmp_path / "repo.json").read_bytes() == b"{}"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch):
    target = tmp_path / "modelpatch.provenance.json"
    target.write_bytes(b"old")

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsops.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        fsops.replace_file(target, b"new", prefix=".modelpatch.provenance.json.")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_write_file_refuses_an_existing_path(tmp_path):
    fsops.write_file(tmp_path / "key", b"k" * 32, mode=0o600)
    assert stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        fsops.write_file(tmp_path / "key", b"other", mode=0o600)
    assert (tmp_path / "key").read_bytes() == b"k" * 32
