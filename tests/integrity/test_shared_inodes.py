"""A hardlinked variant and its base are the same files: ``verify`` of either
side names the other path that changed with a modified file, when it can tell: the variant from
its patch record, the base from the variants log beside the digest cache or a ``<base>-*``
directory beside it. A Hugging Face snapshot without a manifest is verified against its blob
names."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli import main
from patcher.execute.linking import can_reflink_in
from patcher.integrity.shared_inodes import registry_path

EDITED = "generation_config.json"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))
    if can_reflink_in(tmp_path):
        pytest.skip("the tmp dir reflinks: variants share no inode with their base")


def append(path: Path) -> None:
    os.chmod(path, 0o644)           # a variant's files are read-only; a user's edit is not
    with open(path, "ab") as f:
        f.write(b"\n")


def verify_json(directory: Path) -> dict:
    result = CliRunner().invoke(main, ["verify", str(directory), "--json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_verify_of_a_snapshot_base_names_the_variant_that_shares_the_edited_file(kimi_dir,
                                                                                 tmp_path):
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(kimi_dir, tmp_path / "hf", "nvidia/Kimi-K2.5-NVFP4")
    assert verify_json(snap)["ok"]
    assert "files match their Hugging Face blob names" in \
        CliRunner().invoke(main, ["verify", str(snap)]).stdout
    variant = tmp_path / "work" / "kimi-fixed"
    variant.parent.mkdir()
    assert api.apply("sm120-fp16-kv", snap, out=variant).link_method == "hardlink"
    append(variant / EDITED)

    report = verify_json(snap)
    [modified] = report["modified"]
    assert modified["path"] == EDITED and modified["reason"] == "git blob sha1 differs"
    assert modified["shared_with"] == [str(variant / EDITED)]
    [back] = verify_json(variant)["modified"]
    assert back["shared_with"] == [str(snap / EDITED)]
    text = CliRunner().invoke(main, ["verify", str(snap)]).stdout
    assert f"shares its inode (hardlink) with {variant / EDITED}: changed there too" in text


def test_verify_of_a_variant_base_names_its_variants_from_the_log_and_beside_it(kimi_dir,
                                                                             tmp_path):
    base = tmp_path / "kimi"
    shutil.copytree(kimi_dir, base)
    v1 = api.apply("sm120-fp16-kv", base, out=tmp_path / "v1").output
    beside = api.apply("drop-kv-scales", v1, out=tmp_path / "v1-more").output
    (tmp_path / "elsewhere").mkdir()
    far = api.apply("drop-kv-scales", v1, out=tmp_path / "elsewhere" / "v").output
    append(beside / EDITED)

    # v1's own base (its patch record), then its variants (the log, in the order written).
    [modified] = verify_json(v1)["modified"]
    assert modified["shared_with"] == [str(base / EDITED), str(beside / EDITED),
                                       str(far / EDITED)]

    registry_path().unlink()              # variants written before the log: only those beside
    [modified] = verify_json(v1)["modified"]
    assert modified["shared_with"] == [str(base / EDITED), str(beside / EDITED),
                                       "1 other hardlink"]
