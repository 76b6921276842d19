"""The download meter counts what huggingface_hub writes, not its bookkeeping."""

from __future__ import annotations

import os
from pathlib import Path

from patcher.hub.client.growth import reported_growth, tree_bytes


def test_counts_downloaded_and_incomplete_files_only(tmp_path: Path) -> None:
    download = tmp_path / ".cache" / "huggingface" / "download"
    download.mkdir(parents=True)
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    (download / "abc.etag.incomplete").write_bytes(b"y" * 30)
    (download / "model.safetensors.metadata").write_text("commit\netag\n1.0\n")
    (download / "model.safetensors.lock").write_text("")
    (tmp_path / ".cache" / "huggingface" / ".gitignore").write_text("*")
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "main").write_text("0" * 40)
    os.symlink("model.safetensors", tmp_path / "link.safetensors")
    assert tree_bytes(tmp_path) == 130
    assert tree_bytes(tmp_path / "absent") == 0


def test_reports_each_byte_once(tmp_path: Path) -> None:
    (tmp_path / "before").write_bytes(b"z" * 7)          # already there: not counted
    seen: list[int] = []
    with reported_growth(tmp_path, seen.append):
        (tmp_path / "a").write_bytes(b"a" * 50)
        (tmp_path / "b").write_bytes(b"b" * 25)
    assert sum(seen) == 75
    with reported_growth(tmp_path, None):                 # no callback: nothing watched
        (tmp_path / "c").write_bytes(b"c")
