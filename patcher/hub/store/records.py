"""Records the hub store keeps for a repo: its metadata and its commits (ids, timestamps)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RepoMeta:
    kind: str  # "model" | "dataset"
    id: str
    private: bool
    created_at: str
    dir: Path

    @property
    def namespace(self) -> str:
        return self.id.split("/")[0]


@dataclass(frozen=True)
class Commit:
    id: str
    parent: str | None
    message: str
    description: str
    author: str
    time: str
    tree: dict[str, dict[str, Any]]  # path -> {"sha256", "size", "git_oid", "lfs"}


def commit_id_of(record: dict[str, Any]) -> str:
    """The id of a commit record: the first 40 hex digits of the sha256 of its canonical JSON,
    so the same record always gets the same id."""
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:40]


def utc_timestamp() -> str:
    """Now, as the Hub writes times: ``2024-01-31T12:34:56.789Z``."""
    now = datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
