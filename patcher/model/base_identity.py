"""Which hub repository a base model is (``ORG/NAME``), for a variant's manifest and model card.

What can be known, in order:

1. ``--base-model ORG/NAME``, given to ``apply`` (recorded in the manifest as
   ``externalParameters.base_model``) or to ``publish``.
2. A Hugging Face cache snapshot: ``.../models--ORG--NAME/snapshots/<commit>``.
3. The base's own provenance manifest (a variant of a variant): its ``base_model``.

A directory that is none of these is not guessed at: its name says nothing reliable (``kimi``
for ``/models/kimi``). A ``huggingface_hub`` ``--local-dir`` download keeps, under
``.cache/huggingface/download/``, one ``<file>.metadata`` per file holding the commit hash, the
etag and a timestamp, but not the repository, so it is recognised (and its commit named in the
hint) without being identified.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

_CACHE_REPO = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
LOCAL_DIR_METADATA = Path(".cache") / "huggingface" / "download"


@dataclass(frozen=True)
class BaseIdentity:
    repo_id: str | None
    source: str            # where repo_id came from, or why it is unknown

    def hint(self, label: str) -> str:
        """Why there is no ``base_model``, and how to set it."""
        return (f"no base_model for {label}: {self.source}; pass --base-model ORG/NAME to "
                f"publish, or to apply to record it in the variant's manifest")


def check_repo_id(value: str) -> str:
    """``value`` if it is a hub model id ``ORG/NAME``; else an ``InputError``."""
    if not isinstance(value, str) or not _REPO_ID.match(value) or ".." in value \
            or "--" in value or value.endswith((".", "-")):
        raise InputError(f"base model {value!r} is not a hub repository id ORG/NAME")
    return value


def _valid(value) -> str | None:
    try:
        return check_repo_id(value)
    except InputError:
        return None


def from_cache_path(path: str) -> str | None:
    """``ORG/NAME`` of a Hugging Face cache snapshot directory, else None."""
    for candidate in (os.path.abspath(path), os.path.realpath(path)):
        match = _CACHE_REPO.search(candidate.replace(os.sep, "/"))
        if match:
            return _valid(f"{match.group(1)}/{match.group(2)}")
    return None


def from_statement(statement) -> str | None:
    """The ``base_model`` a provenance statement records (itself or one of its bases)."""
    while isinstance(statement, dict):
        params = (statement.get("predicate") or {}).get("buildDefinition", {}) \
            .get("externalParameters", {})
        if not isinstance(params, dict):
            return None
        found = _valid(params.get("base_model"))
        if found:
            return found
        statement = params.get("base_provenance")
    return None


def local_dir_commit(root: Path) -> str | None:
    """The commit a ``huggingface_hub`` ``--local-dir`` download of ``root`` came from (the
    first line of its download metadata), or None."""
    folder = root / LOCAL_DIR_METADATA
    for name in ("config.json.metadata", *sorted(p.name for p in folder.glob("*.metadata"))):
        try:
            with open(folder / name, encoding="utf-8") as f:
                first = f.readline(100).strip()
        except (OSError, UnicodeDecodeError):
            continue
        if _COMMIT.match(first):
            return first
    return None


def identify(root: str | os.PathLike, statement: dict | None = None) -> BaseIdentity:
    """What ``root`` (a base model directory, with its provenance ``statement`` if it has one)
    is known to be."""
    root = Path(root)
    found = from_cache_path(str(root))
    if found:
        return BaseIdentity(found, "the Hugging Face cache path")
    found = from_statement(statement)
    if found:
        return BaseIdentity(found, "the base's provenance manifest")
    commit = local_dir_commit(root)
    if commit:
        return BaseIdentity(None, f"{root} is a huggingface_hub --local-dir download of commit "
                                  f"{commit[:12]}, which does not record its repository")
    return BaseIdentity(None, f"{root} is not in a Hugging Face cache and records no hub "
                              f"repository")
