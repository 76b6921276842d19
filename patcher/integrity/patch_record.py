"""The patch stack under ``.modelpatch/``: what each applied patch replaced, so it can be undone.

Layout, one directory per patch, oldest first::

    .modelpatch/patches/0001-sm120-fp16-kv/record.json
    .modelpatch/patches/0001-sm120-fp16-kv/originals/<relpath>   # the base's replaced files

``record.json`` lists every base file (digest, size, mode, symlink target), the files this patch
replaced or dropped (kept under ``originals/``) and the files it added. For a variant, originals
are hardlinks (or reflinks) to the base's files, so they cost no space while both share a
filesystem, and they outlive the base. After an in-place patch they are the very files, moved
aside by rename; a replaced symlink (a Hugging Face snapshot's link into ``blobs/``) is kept as an
equivalent symlink, its original text in ``links``.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config.jsonfile import parse_json
from ..errors import InputError
from ..model.layout import STATE_DIR

PATCHES_DIR = f"{STATE_DIR}/patches"
RECORD_NAME = "record.json"
RECORD_VERSION = 1
# <sequence>-<recipe name>; several recipes applied as one are named by their names joined
# with "+" (``recipe.params.bind.combine``), so "+" separates names here too.
_PATCH_DIR_RE = re.compile(r"^(\d{4})-[a-z0-9._-]+(?:\+[a-z0-9._-]+)*$")


@dataclass(frozen=True)
class BaseFile:
    sha256: str
    size: int
    mode: int
    link_target: str | None = None


@dataclass
class PatchRecord:
    """One entry of the patch stack."""

    sequence: int
    recipe: dict                          # {name, sha256}
    mode: str                             # "variant" or "in-place"
    base_files: dict[str, BaseFile]
    replaced: list[str] = field(default_factory=list)   # kept under originals/
    added: list[str] = field(default_factory=list)      # did not exist in the base
    base_manifest: bool = False           # the base's own provenance is under originals/
    base_path: str | None = None          # where the base was, for messages
    # In place: the exact text of each replaced or dropped file that was a symlink (for
    # example into a Hugging Face blob). Its original under originals/ is an equivalent
    # symlink whose target is relative to that place; revert restores this text.
    links: dict[str, str] = field(default_factory=dict)
    # In place: directories the patch created (for added files); revert removes them.
    made_dirs: list[str] = field(default_factory=list)
    # sha256 of the provenance manifest this patch wrote: ``verify`` checks the manifest
    # against it (older records have none).
    manifest_sha256: str | None = None
    # In place: files of which only the header region was rewritten (a GGUF's metadata): rel ->
    # length of the base's bytes kept under headers/<rel> (not in replaced nor originals/).
    headers: dict[str, int] = field(default_factory=dict)
    # The base's OMS signature (model.sig) is under originals/: a variant never carries it, and
    # revert restores it byte for byte.
    base_signature: bool = False

    @property
    def dirname(self) -> str:
        return f"{self.sequence:04d}-{self.recipe['name']}"

    def to_json(self) -> dict:
        data = asdict(self)
        data["version"] = RECORD_VERSION
        return data

    @classmethod
    def from_json(cls, data: dict, where: str) -> PatchRecord:
        try:
            files = {k: BaseFile(**v) for k, v in data["base_files"].items()}
            record = cls(sequence=int(data["sequence"]), recipe=dict(data["recipe"]),
                       mode=str(data["mode"]), base_files=files,
                       replaced=list(data["replaced"]), added=list(data["added"]),
                       base_manifest=bool(data.get("base_manifest", False)),
                       base_path=data.get("base_path"),
                       links={str(k): str(v) for k, v in (data.get("links") or {}).items()},
                       made_dirs=[str(d) for d in data.get("made_dirs") or []],
                       manifest_sha256=_optional_sha256(data.get("manifest_sha256")),
                       headers={str(k): _length(v)
                                for k, v in (data.get("headers") or {}).items()},
                       base_signature=bool(data.get("base_signature", False)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"malformed patch record: {exc}", where=where) from None
        outside = [p for p in [*record.base_files, *record.replaced, *record.added,
                               *record.links, *record.made_dirs, *record.headers]
                   if not _inside(p)]
        if outside:
            raise InputError(f"malformed patch record: path {outside[0]!r} is not inside the "
                             f"directory", where=where)
        if not set(record.headers) <= set(record.base_files) - set(record.replaced):
            raise InputError("malformed patch record: a header kept for revert is not of an "
                             "unreplaced base file", where=where)
        return record


def _length(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"header length {value!r} is not a positive integer")
    return value


def _optional_sha256(value: object) -> str | None:
    if value is None:
        return None
    if not (isinstance(value, str) and len(value) == 64
            and all(c in "0123456789abcdef" for c in value)):
        raise ValueError(f"manifest_sha256 {value!r} is not a sha256")
    return value


def _inside(rel: object) -> bool:
    return (isinstance(rel, str) and bool(rel) and not rel.startswith("/")
            and "\0" not in rel and posixpath.normpath(rel) == rel and rel != ".."
            and not rel.startswith("../") and rel.split("/", 1)[0] != STATE_DIR)


def patch_dirs(root: Path) -> list[Path]:
    """The patch directories under ``root``, oldest first."""
    base = root / PATCHES_DIR
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if _PATCH_DIR_RE.match(p.name))


def read_record(patch_dir: Path) -> PatchRecord:
    path = patch_dir / RECORD_NAME
    if not path.is_file():
        raise InputError("patch record is missing", where=path)
    return PatchRecord.from_json(parse_json(path.read_bytes(), str(path)), str(path))


def encode_record(record: PatchRecord) -> bytes:
    return (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode()


def next_sequence(root: Path) -> int:
    dirs = patch_dirs(root)
    return int(_PATCH_DIR_RE.match(dirs[-1].name).group(1)) + 1 if dirs else 1
