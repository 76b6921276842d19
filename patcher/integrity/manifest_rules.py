"""The rules a provenance manifest must follow, checked on every read and before every write.

A manifest is an in-toto Statement v1 whose subjects and base files are normalized relative POSIX
paths inside the variant (never the manifest itself or ``.modelpatch/``), each with a lowercase
hex sha256 and a non-negative size; an embedded base statement follows the same rules.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..model.layout import MANIFEST_NAME, STATE_DIR, is_model_path
from ..names import name_problem
from .digests.hashing import is_sha256_hex

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BASE_PROVENANCE_ROLE = "base-provenance"


class DigestEntry(NamedTuple):
    """A file's sha256 (lowercase hex) and size in bytes; plain ``(sha256, size)`` tuples work too.
    """

    sha256: str
    size: int


# -- paths ---------------------------------------------------------------------------------------

def is_excluded(name: str) -> bool:
    """True for the names a manifest never lists: the manifest, ``model.sig``, ``.modelpatch/``,
    ``.git``, ``.cache/`` (what ``model_dir.is_model_path`` leaves out)."""
    return not is_model_path(name)


def check_relpath(name: object) -> str | None:
    """Return why ``name`` is not a normalized relative POSIX path inside a variant, else None:
    the check of every name from outside (``patcher.names``), dot-directories allowed (a model
    may ship ``.github/``), then the names a manifest never lists."""
    problem = name_problem(name, allow_dot_dirs=True)
    if problem is not None:
        return f"{'path' if isinstance(name, str) else 'name'} {problem}"
    if is_excluded(name):
        return (f"reserved path ({MANIFEST_NAME}, model.sig, {STATE_DIR}/, .git and .cache/ "
                f"are never listed)")
    return None


class Invalid(Exception):
    pass


def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise Invalid(f"{where}: expected an object")
    return value


def file_entry(entry: Any, where: str) -> tuple[str, DigestEntry]:
    """A statement's file entry ``{"name", "digest": {"sha256"}, "annotations": {"size"}}`` as
    ``(name, DigestEntry)``; ``Invalid`` naming ``where`` and what is wrong."""
    entry = _obj(entry, where)
    name = entry.get("name")
    label = f"{where} ({name!r})" if isinstance(name, str) else where
    problem = check_relpath(name)
    if problem:
        raise Invalid(f"{label}: {problem}")
    digest = entry.get("digest")
    sha256 = digest.get("sha256") if isinstance(digest, dict) else None
    if not is_sha256_hex(sha256):
        raise Invalid(f"{label}: digest.sha256 must be 64 lowercase hex characters, "
                       f"got {sha256!r}")
    annotations = entry.get("annotations")
    size = annotations.get("size") if isinstance(annotations, dict) else None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise Invalid(f"{label}: annotations.size must be a non-negative integer, got {size!r}")
    return name, DigestEntry(sha256, size)


def validate_statement(statement: Any, where: str = "") -> tuple[dict, dict, DigestEntry | None]:
    statement = _obj(statement, where or "top level")
    prefix = f"{where}." if where else ""
    if statement.get("_type") != STATEMENT_TYPE:
        raise Invalid(f"{prefix}_type is {statement.get('_type')!r}, expected {STATEMENT_TYPE!r}")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise Invalid(f"{prefix}predicateType is {statement.get('predicateType')!r}, "
                       f"expected {PREDICATE_TYPE!r}")
    subject = statement.get("subject")
    if not isinstance(subject, list):
        raise Invalid(f"{prefix}subject: expected a list")
    subjects: dict[str, DigestEntry] = {}
    for i, entry in enumerate(subject):
        name, value = file_entry(entry, f"{prefix}subject[{i}]")
        if name in subjects:
            raise Invalid(f"{prefix}subject[{i}] ({name!r}): duplicate name")
        subjects[name] = value

    predicate = _obj(statement.get("predicate"), f"{prefix}predicate")
    build = _obj(predicate.get("buildDefinition"), f"{prefix}predicate.buildDefinition")
    ext_where = f"{prefix}predicate.buildDefinition.externalParameters"
    external = _obj(build.get("externalParameters"), ext_where)
    recipe = _obj(external.get("recipe"), f"{ext_where}.recipe")
    if not isinstance(recipe.get("name"), str) or not isinstance(recipe.get("text"), str):
        raise Invalid(f"{ext_where}.recipe: name and text must be strings")
    if not is_sha256_hex(recipe.get("sha256")):
        raise Invalid(f"{ext_where}.recipe.sha256 must be 64 lowercase hex characters, "
                       f"got {recipe.get('sha256')!r}")

    deps_where = f"{prefix}predicate.buildDefinition.resolvedDependencies"
    deps = build.get("resolvedDependencies", [])
    if not isinstance(deps, list):
        raise Invalid(f"{deps_where}: expected a list")
    base_files: dict[str, DigestEntry] = {}
    link: DigestEntry | None = None
    for i, entry in enumerate(deps):
        annotations = entry.get("annotations") if isinstance(entry, dict) else None
        if isinstance(annotations, dict) and annotations.get("role") == BASE_PROVENANCE_ROLE:
            digest = entry.get("digest")
            sha256 = digest.get("sha256") if isinstance(digest, dict) else None
            size = annotations.get("size")
            if (not is_sha256_hex(sha256) or not isinstance(size, int) or isinstance(size, bool)
                    or size < 0):
                raise Invalid(f"{deps_where}[{i}] (base provenance link): bad digest or size")
            if link is not None:
                raise Invalid(f"{deps_where}[{i}]: a second base provenance link")
            link = DigestEntry(sha256, size)
            continue
        name, value = file_entry(entry, f"{deps_where}[{i}]")
        if name in base_files:
            raise Invalid(f"{deps_where}[{i}] ({name!r}): duplicate name")
        base_files[name] = value

    base = external.get("base_provenance")
    if base is not None:
        validate_statement(base, f"{ext_where}.base_provenance")
    return subjects, base_files, link
