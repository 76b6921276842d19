"""What the embedded hub accepts as repo ids, branch and tag names, and file paths in a repo."""

from __future__ import annotations

import re

from ..request_errors import BadRequest

REPO_KINDS = {"model": "models", "dataset": "datasets"}
DEFAULT_BRANCH = "main"
RESERVED_NAMESPACES = {"api", "models", "datasets", "spaces", "docs", "settings"}
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_REF = re.compile(r"[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*")
COMMIT_ID = re.compile(r"[0-9a-f]{40}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def split_repo_id(repo_id: str) -> tuple[str, str]:
    """``"ns/name"`` -> ``("ns", "name")``; raises BadRequest for anything the Hub would refuse."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise BadRequest(f"invalid repo id {repo_id!r}: expected 'namespace/name' of letters, "
                         "digits, '-', '_' and '.' (at most 96 each)")
    if any("--" in p or ".." in p for p in parts) or parts[1].endswith(".git"):
        raise BadRequest(f"invalid repo id {repo_id!r}: '--' and '..' are not allowed, and the "
                         "name cannot end with '.git'")
    return parts[0], parts[1]


def check_ref_name(name: str) -> str:
    """Validate a branch or tag name (git-like rules, no ``refs/`` prefix, not a commit id)."""
    if (len(name) > 200 or not _REF.fullmatch(name) or ".." in name or name.endswith(".lock")
            or any(seg.startswith(".") for seg in name.split("/"))
            or name.startswith("refs/") or COMMIT_ID.fullmatch(name)):
        raise BadRequest(f"invalid branch or tag name {name!r}")
    return name


def check_path(path: str) -> str:
    """Validate a file path inside a repo: relative, '/'-separated, no '.', '..' or '.git'."""
    segments = path.split("/")
    if (not path or len(path) > 1024 or "\0" in path or "\\" in path
            or any(seg in ("", ".", "..") for seg in segments) or segments[0] == ".git"):
        raise BadRequest(f"invalid path in repo {path!r}")
    return path
