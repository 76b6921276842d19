"""Git and Git LFS object rules the Hub's answers follow: blob ids, LFS pointers, which files are
stored with LFS, and the tree entries of a commit record."""

from __future__ import annotations

import fnmatch
from typing import Any

from huggingface_hub.utils.sha import git_hash  # a blob's git object id: sha1("blob N\0" + data)


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The Git LFS pointer file git stores in place of an LFS file."""
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\n"
            f"size {size}\n").encode()


# Hugging Face's default .gitattributes (plus a few), the files the Hub stores with LFS.
_LFS_PATTERNS = tuple(
    "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gguf *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model "
    "*.msgpack *.npy *.npz *.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar "
    "*.safetensors *.tar *.tar.* *.tflite *.tgz *.wasm *.xz *.zip *.zst *tfevents*".split())
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024


def upload_mode(path: str, size: int, sample: bytes) -> str:
    """``"lfs"`` or ``"regular"`` for a file, as the Hub's preupload endpoint decides it:
    empty files are regular; large, binary or LFS-pattern files are LFS."""
    if size == 0:
        return "regular"
    name = path.rsplit("/", 1)[-1]
    if (size >= LFS_SIZE_THRESHOLD or b"\0" in sample
            or any(fnmatch.fnmatchcase(name, pat) for pat in _LFS_PATTERNS)
            or path.startswith("saved_model/")):
        return "lfs"
    return "regular"


def regular_entry(sha256: str, data: bytes) -> dict[str, Any]:
    return {"sha256": sha256, "size": len(data), "git_oid": git_hash(data), "lfs": False}


def lfs_entry(sha256: str, size: int) -> dict[str, Any]:
    return {"sha256": sha256, "size": size, "git_oid": git_hash(lfs_pointer(sha256, size)),
            "lfs": True}
