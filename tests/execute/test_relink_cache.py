"""The digest cache keeps a base's digests across applies that replace a previous output.

Replacing an output (``--force``) unlinks the old variant's hardlinks to the base, which moves the
base files' ctime (a key of the cache) after the variant's own links did: the digests are recorded
again once the new output is committed. A same-size edit that puts the mtime back is still a
miss."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from gguf_fixtures import tiny_dir

from patcher import api
from patcher.integrity.digests.digest_cache import KnownDigests


def _age(root: Path) -> None:
    """Files older than the cache's racy window, as a downloaded model's are."""
    old = time.time() - 3600
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))


def _edit_keeping_mtime(path: Path) -> None:
    """A same-size in-place edit with the mtime put back (``cp -p``, ``rsync -a --inplace``)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_replacing_an_output_keeps_the_safetensors_base_digests(kimi_dir, tmp_path):
    base = tmp_path / "kimi"
    shutil.copytree(kimi_dir, base)
    _age(base)
    out = tmp_path / "v"
    first = api.apply("sm120-fp16-kv", base, out=out)
    api.apply("sm120-fp16-kv", base, out=out, force=True)   # unlinks the first variant's links
    third = api.apply("sm120-fp16-kv", base, out=out, force=True)
    assert first.bytes_hashed > 4_000_000
    assert third.bytes_hashed == 0
    assert api.verify(out).ok

    shard = base / "model-00004-of-00004.safetensors"
    _edit_keeping_mtime(shard)
    assert KnownDigests().lookup(shard, require_verified=True) is None


def test_replacing_an_output_keeps_the_gguf_base_digest(tmp_path):
    root = tiny_dir(tmp_path)
    _age(root)
    gguf_file = root / "tiny.gguf"
    out = tmp_path / "out"
    for _ in range(3):
        api.apply("gguf-context", root, out=out, force=True)
        known = KnownDigests().lookup(gguf_file, require_verified=True)
        assert known is not None and known.source == "cache"

    _edit_keeping_mtime(gguf_file)
    assert KnownDigests().lookup(gguf_file, require_verified=True) is None
