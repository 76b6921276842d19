"""Where a pulled variant came from: ``pull`` records the repository and commit in
``.modelpatch/hub/source.json`` (beside the hub's card, outside what verify checks), so that a
variant made from it can later be published with server-side copies from that repository."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...model.base_identity import check_repo_id
from ...errors import InputError

SOURCE_FILE = Path(".modelpatch") / "hub" / "source.json"
_COMMIT = re.compile(r"[0-9a-f]{40}")


def write_pulled_source(root: Path, repo_id: str, commit: str) -> None:
    path = root / SOURCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"repo_id": repo_id, "commit": commit}) + "\n", encoding="utf-8")


def read_pulled_source(root: Path) -> tuple[str, str] | None:
    """``(repo_id, commit)`` recorded in ``root`` by pull; None when absent or malformed (it
    only chooses where to copy from: publish checks every file's sha256 on the hub anyway)."""
    try:
        with open(root / SOURCE_FILE, encoding="utf-8") as f:
            data = json.loads(f.read(4096))
        repo_id, commit = data["repo_id"], data["commit"]
        check_repo_id(repo_id)
    except (OSError, ValueError, KeyError, TypeError, InputError):
        return None
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        return None
    return repo_id, commit
