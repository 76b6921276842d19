"""The provenance manifest, ``modelpatch.provenance.json`` at a variant's root.

It is an in-toto Statement v1 whose predicate is SLSA Provenance v1 (docs/architecture.md §3):

.. code-block:: text

    _type          https://in-toto.io/Statement/v1
    subject        one ResourceDescriptor per output file, sorted by name:
                   {"name": relpath, "digest": {"sha256": hex}, "annotations": {"size": n}}
    predicateType  https://slsa.dev/provenance/v1
    predicate
      buildDefinition
        buildType             BUILD_TYPE
        externalParameters    {"recipe": {name, sha256, text}, "options": {...},
                               "base_model": "ORG/NAME" (when known),
                               "base_provenance": <the base's whole statement, if any>}
        resolvedDependencies  base files {"name", "digest", "annotations": {"size"}}, and when the
                              base is itself a variant, a link to its manifest
                              {"name": MANIFEST_NAME, "digest", "mediaType",
                               "annotations": {"size", "role": "base-provenance"}}
      runDetails
        builder     {"id": BUILDER_ID, "version": {"modelpatch", "python", "safetensors", ...}}
        metadata    {"invocationId", "startedOn", "finishedOn"}   (RFC 3339, UTC)
        byproducts  [{"name": "modelpatch.changes", "mediaType": "application/json",
                      "digest": {"sha256": <of the change list's canonical JSON>},
                      "annotations": {"changes": [<the change log, per rule>]}}]

SLSA requires every byproduct to be a ResourceDescriptor (one of uri, digest or content), so the
change log travels as the ``changes`` annotation of one descriptor rather than as bare entries.
The log records tensor changes per rule (``patcher.integrity.change_log.grouped``: kind, recipe
line, dtypes, count, digest of the sorted names), so the manifest grows with files and rules, not
tensors; manifests written before that list every tensor, and read the same way.

Subjects and base files exclude the manifest itself and everything under ``.modelpatch/``.
The file is canonical JSON (sorted keys, indent 2, UTF-8, final newline), written atomically,
fsynced and read-only (0444); its sha256 is what a later variant's base link records.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from .. import __version__
from ..config.jsonfile import parse_json
from ..errors import InputError, OperationFailed
from ..fsops import NotRegularFile, TooLarge, read_capped, replace_file
from ..model.layout import MANIFEST_NAME, STATE_DIR
from .canonical_json import canonical_json as _canonical_json
from .canonical_json import encode_array
from .digests.hashing import is_sha256_hex
from .manifest_rules import (
    BASE_PROVENANCE_ROLE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    DigestEntry,
    Invalid,
    check_relpath,
    is_excluded,
    validate_statement,
)

__all__ = [
    "BUILDER_ID",
    "BUILD_TYPE",
    "CHANGES_BYPRODUCT",
    "DigestEntry",
    "MANIFEST_NAME",
    "Manifest",
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "STATE_DIR",
    "build_statement",
    "canonical_json",
    "check_relpath",
    "is_excluded",
    "read_manifest",
    "tool_versions",
    "write_manifest",
]

# No project domain exists yet; URNs avoid claiming someone else's. Change both in one place.
BUILD_TYPE = "urn:modelpatch:buildtype:apply:v1"
BUILDER_ID = "urn:modelpatch:builder:local"
CHANGES_BYPRODUCT = "modelpatch.changes"
IN_TOTO_MEDIA_TYPE = "application/vnd.in-toto+json"
MAX_MANIFEST_BYTES = 256 << 20

_VERSIONED_DISTS = ("safetensors", "huggingface_hub", "jsonpatch", "ruamel.yaml", "torch")


def _posix_name(path: str | os.PathLike) -> str:
    return PurePosixPath(os.fspath(path)).as_posix() if not isinstance(path, str) else path


# -- building ------------------------------------------------------------------------------------

def canonical_json(obj: Any) -> bytes:
    """The manifest serialization: sorted keys, indent 2, UTF-8, no NaN, final newline
    (``patcher.canonical_json``: the standard library's bytes, faster)."""
    return _canonical_json(obj)


def _rfc3339(t: _dt.datetime | float | int | str) -> str:
    if isinstance(t, str):
        t = _dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    elif isinstance(t, (int, float)):
        t = _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc)
    if t.tzinfo is None:
        raise ValueError(f"naive datetime {t!r}: pass an aware datetime (UTC)")
    t = t.astimezone(_dt.timezone.utc)
    fraction = f".{t.microsecond:06d}" if t.microsecond else ""
    return t.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def tool_versions() -> dict[str, str]:
    """Versions of modelpatch, Python and the libraries that shape its output.

    torch is never imported here: its version comes from the loaded module if something already
    imported it, else from the installed distribution's metadata. Libraries not installed are
    left out (SLSA's version map holds strings only).
    """
    import importlib.metadata  # here (and platform): verify and read_manifest never need it
    import platform

    versions = {"modelpatch": __version__, "python": platform.python_version()}
    for dist in _VERSIONED_DISTS:
        module = sys.modules.get(dist)
        version = getattr(module, "__version__", None) if module is not None else None
        if not isinstance(version, str):
            try:
                version = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                version = None
        if version:
            versions[dist] = version
    return versions


def _file_entries(files: Mapping[Any, tuple[str, int]], what: str) -> list[dict]:
    entries: dict[str, dict] = {}
    for raw_name, value in files.items():
        name = _posix_name(raw_name)
        if is_excluded(name):
            continue
        problem = check_relpath(name)
        if problem:
            raise ValueError(f"{what} {name!r}: {problem}")
        sha256, size = value
        if not is_sha256_hex(sha256):
            raise ValueError(f"{what} {name!r}: not a sha256 hex digest: {sha256!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"{what} {name!r}: bad size {size!r}")
        if name in entries:
            raise ValueError(f"{what} {name!r} listed twice")
        entries[name] = {"name": name, "digest": {"sha256": sha256}, "annotations": {"size": size}}
    return [entries[n] for n in sorted(entries)]


def build_statement(*, subjects: Mapping[Any, tuple[str, int]],
                    base_files: Mapping[Any, tuple[str, int]],
                    recipe: Mapping[str, Any],
                    options: Mapping[str, Any],
                    changes: list[dict],
                    started: _dt.datetime | float | str,
                    finished: _dt.datetime | float | str,
                    base_statement: "dict | Manifest | None" = None,
                    invocation_id: str | None = None,
                    versions: Mapping[str, str] | None = None,
                    base_model: str | None = None,
                    base_signature: Mapping[str, Any] | None = None) -> dict:
    """Build the provenance statement of a variant (a plain dict, ready for :func:`write_manifest`).

    Args:
        subjects: ``{relpath: (sha256, size)}`` of every output file. The manifest and
            ``.modelpatch/...`` are dropped if present; other names must be normalized relative
            POSIX paths (``ValueError`` otherwise: that is a bug in the caller).
        base_files: the same for the base model's files.
        recipe: ``{"name", "sha256", "text"}`` (extra keys are kept).
        options: the apply options that shaped the output (JSON values).
        changes: the change log, plain JSON dicts; tensor changes are recorded per rule
            (``patcher.integrity.change_log.grouped``), everything else as given.
        started, finished: aware datetimes, epoch seconds or ISO strings; written as RFC 3339 UTC.
        base_statement: when the base is itself a variant, its :class:`Manifest` (preferred: the
            link then records the sha256 of its file as read) or its statement dict (the link
            records the sha256 of its canonical serialization, which is the file's if
            :func:`write_manifest` wrote it).
        invocation_id: default, a fresh UUID.
        versions: builder versions; default :func:`tool_versions`.
        base_model: the hub repository ``ORG/NAME`` the original base is, when known
            (``patcher.model.base_identity``); recorded as ``externalParameters.base_model``.
        base_signature: the base's ``model.sig`` (sha256, size, signer, whether verified; never
            carried into the variant), recorded as ``externalParameters.base_signature``.
    """
    _check_recipe(recipe)
    external: dict[str, Any] = {"recipe": dict(recipe), "options": dict(options)}
    if base_model:
        external["base_model"] = base_model
    if base_signature:
        external["base_signature"] = dict(base_signature)
    dependencies = _file_entries(base_files, "base file")
    if base_statement is not None:
        base_dict, base_link = _base_provenance_link(base_statement)
        external["base_provenance"] = base_dict
        dependencies.append(base_link)

    changes_byproduct = _changes_byproduct(changes)
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": _file_entries(subjects, "output file"),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "resolvedDependencies": dependencies,
            },
            "runDetails": _run_details(versions, invocation_id, started, finished,
                                       changes_byproduct),
        },
    }
    canonical_json(statement)  # fails now (ValueError/TypeError) if something is not JSON
    return statement


def _check_recipe(recipe: Mapping[str, Any]) -> None:
    for key in ("name", "sha256", "text"):
        if key not in recipe:
            raise ValueError(f"recipe lacks {key!r}")
    if not isinstance(recipe["name"], str) or not isinstance(recipe["text"], str):
        raise ValueError("recipe name and text must be strings")
    if not is_sha256_hex(recipe["sha256"]):
        raise ValueError(f"recipe sha256 is not a sha256 hex digest: {recipe['sha256']!r}")


def _base_provenance_link(base_statement: dict | Manifest) -> tuple[dict, dict]:
    """The base's statement (embedded as ``base_provenance``) and the resolved dependency that
    links its manifest file by digest and size."""
    if isinstance(base_statement, Manifest):
        link_sha, link_size = base_statement.sha256, base_statement.size
        base_dict = base_statement.statement
    else:
        data = canonical_json(base_statement)
        link_sha, link_size = hashlib.sha256(data).hexdigest(), len(data)
        base_dict = base_statement
    link = {
        "name": MANIFEST_NAME,
        "digest": {"sha256": link_sha},
        "mediaType": IN_TOTO_MEDIA_TYPE,
        "annotations": {"size": link_size, "role": BASE_PROVENANCE_ROLE},
    }
    return base_dict, link


def _changes_byproduct(changes: list[dict]) -> dict:
    """The change log as a ResourceDescriptor: digest of its canonical JSON, entries as the
    ``changes`` annotation."""
    from .change_log import grouped  # writing only: reading a manifest does not need it

    changes, data = encode_array(grouped(changes))
    changes_sha = hashlib.sha256(data).hexdigest()
    return {
        "name": CHANGES_BYPRODUCT,
        "mediaType": "application/json",
        "digest": {"sha256": changes_sha},
        "annotations": {"changes": changes},
    }


def _run_details(versions: Mapping[str, str] | None, invocation_id: str | None,
                 started: _dt.datetime | float | str, finished: _dt.datetime | float | str,
                 changes_byproduct: dict) -> dict:
    import uuid

    return {
        "builder": {"id": BUILDER_ID,
                    "version": dict(versions) if versions is not None else tool_versions()},
        "metadata": {
            "invocationId": invocation_id or str(uuid.uuid4()),
            "startedOn": _rfc3339(started),
            "finishedOn": _rfc3339(finished),
        },
        "byproducts": [changes_byproduct],
    }


# -- reading -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Manifest:
    """A provenance manifest as read (and validated) by :func:`read_manifest`."""

    path: Path
    statement: dict = field(repr=False)
    sha256: str
    """sha256 of the manifest file's bytes."""
    size: int
    subjects: dict[str, DigestEntry] = field(repr=False)
    """``{relpath: (sha256, size)}`` of the variant's files."""
    base_files: dict[str, DigestEntry] = field(repr=False)
    base_manifest: DigestEntry | None
    """Digest and size of the base's manifest, when the base was a variant."""

    @property
    def predicate(self) -> dict:
        return self.statement["predicate"]

    @property
    def recipe(self) -> dict:
        return self.predicate["buildDefinition"]["externalParameters"]["recipe"]

    @property
    def options(self) -> dict:
        return self.predicate["buildDefinition"]["externalParameters"].get("options", {})

    @property
    def base_statement(self) -> dict | None:
        return self.predicate["buildDefinition"]["externalParameters"].get("base_provenance")

    @property
    def changes(self) -> list[dict]:
        for item in self.predicate.get("runDetails", {}).get("byproducts", []):
            if item.get("name") == CHANGES_BYPRODUCT:
                return item.get("annotations", {}).get("changes", [])
        return []


def read_manifest(directory: str | os.PathLike) -> Manifest:
    """Read and strictly validate ``<directory>/modelpatch.provenance.json``.

    Checks: UTF-8 JSON without duplicate keys; ``_type`` and ``predicateType``; every subject and
    base file named by a normalized relative POSIX path (not absolute, no ``..``, no empty or
    ``.`` component, no backslash, not the manifest or under ``.modelpatch/``) listed once, with a
    64-lowercase-hex sha256 and a non-negative integer size; the recipe; an embedded base statement
    (recursively).

    Raises:
        InputError: a one-line message naming the manifest file and the bad entry.
        OperationFailed: the file exists but cannot be read.
    """
    path = Path(directory) / MANIFEST_NAME
    try:
        data = read_capped(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise InputError("no provenance manifest; not a modelpatch variant", where=path,
                         hint="run `modelpatch apply` to create a variant") from None
    except IsADirectoryError:
        raise InputError("provenance manifest is a directory", where=path) from None
    except NotRegularFile:
        raise InputError("provenance manifest is not a regular file", where=path) from None
    except TooLarge:
        raise InputError(f"provenance manifest larger than {MAX_MANIFEST_BYTES} bytes",
                         where=path) from None
    except OSError as exc:
        raise OperationFailed(f"cannot read: {exc.strerror or exc}", where=path) from exc
    statement = parse_json(data, str(path))
    try:
        subjects, base_files, link = validate_statement(statement)
    except Invalid as exc:
        raise InputError(str(exc), where=path) from None
    return Manifest(path=path, statement=statement, sha256=hashlib.sha256(data).hexdigest(),
                    size=len(data), subjects=subjects, base_files=base_files, base_manifest=link)


# -- writing -------------------------------------------------------------------------------------

def write_manifest(directory: str | os.PathLike, statement: dict) -> DigestEntry:
    """Write ``statement`` as ``<directory>/modelpatch.provenance.json``; return its (sha256, size).

    The statement is validated with the reader's rules first (``ValueError`` if it would not read
    back). The file is written to a temporary name in the same directory, made read-only (0444),
    fsynced, renamed over any previous manifest, and the directory is fsynced.

    Raises:
        OperationFailed: an I/O error (nothing is left behind but the previous manifest).
    """
    try:
        validate_statement(statement)
    except Invalid as exc:
        raise ValueError(f"invalid statement: {exc}") from None
    data = canonical_json(statement)
    directory = Path(directory)
    final = directory / MANIFEST_NAME
    try:
        replace_file(final, data, mode=0o444, prefix=f".{MANIFEST_NAME}.")
    except OSError as exc:
        raise OperationFailed(f"cannot write the provenance manifest: {exc.strerror or exc}",
                              where=final) from exc
    return DigestEntry(hashlib.sha256(data).hexdigest(), len(data))
