"""Signing a variant from the digests its manifest holds: no model byte is read to sign.

The resources are the manifest's subjects (each file of the variant, as verified against it),
less what OMS leaves out by default, plus the manifest itself by the sha256 of its bytes. So
the signature covers every file ``model_signing`` would enumerate, and its cost is the
manifest's size, not the model's. ``sign_directory`` verifies the directory against its
manifest first (fast, or full on request): a signature is never made over files that differ
from the digests it names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

from ..errors import InputError, VerifyMismatch
from ..fsops import replace_file, write_file
from ..model.layout import MANIFEST_NAME
from .bundle import SIGNATURE_NAME, encode, is_ignored, statement
from .keys import KeySigner

KEYLESS = "sigstore"
"""The signer value that means Sigstore keyless (``--sigstore``)."""


def resources_of(subjects: Mapping[str, tuple[str, int]], manifest_sha256: str) -> dict[str, str]:
    """``{relpath: sha256}`` in the signing scope: the subjects OMS does not leave out, and the
    manifest."""
    resources = {rel: entry[0] for rel, entry in subjects.items() if not is_ignored(rel)}
    resources[MANIFEST_NAME] = manifest_sha256
    return resources


def bundle_bytes(model_name: str, resources: Mapping[str, str], signer: KeySigner | str, *,
                 allow_symlinks: bool = False) -> bytes:
    """The OMS bundle over ``resources``, signed by ``signer`` (a key, or ``KEYLESS``)."""
    stmt = statement(model_name, resources, allow_symlinks=allow_symlinks)
    if signer == KEYLESS:
        from .keyless import sign_dsse

        return sign_dsse(json.dumps(stmt, separators=(",", ":"), sort_keys=True).encode())
    return encode(stmt, signer)


def write_new_signature(directory: Path, model_name: str, resources: Mapping[str, str],
                        signer: KeySigner | str) -> str:
    """Create ``directory/model.sig`` (a staging directory: it must not exist yet), read-only
    and fsynced; return its sha256."""
    import hashlib

    data = bundle_bytes(model_name, resources, signer,
                        allow_symlinks=any(os.path.islink(directory / r) for r in resources))
    write_file(directory / SIGNATURE_NAME, data)
    return hashlib.sha256(data).hexdigest()


def sign_directory(directory: str | os.PathLike, signer: KeySigner | str, *, full: bool = False,
                   jobs: int | None = None, name: str | None = None) -> Path:
    """Write ``directory/model.sig`` over the variant's manifest digests, after verifying the
    files against the manifest (``full``: rehash every file; else trust verified digest-cache
    rows). Replaces an older ``model.sig`` atomically. The caller holds the directory's lock.
    ``name``: the model's name in the signature (default: the directory's)."""
    from ..integrity.manifest import read_manifest
    from ..integrity.verify import verify_dir

    root = Path(directory)
    if not (root / MANIFEST_NAME).is_file():
        raise InputError(f"no {MANIFEST_NAME}: modelpatch signs the variants it verifies",
                         where=root, hint="sign other models with `model_signing sign`")
    report = verify_dir(root, jobs=jobs, fast=not full)
    if not report.ok:
        raise VerifyMismatch(f"not signed: {report.summary()}", where=root)
    manifest = read_manifest(root)
    resources = resources_of(manifest.subjects, manifest.sha256)
    name = name or os.path.basename(os.path.abspath(root))
    data = bundle_bytes(name, resources, signer,
                        allow_symlinks=any(os.path.islink(root / r) for r in resources))
    replace_file(root / SIGNATURE_NAME, data, mode=0o444, prefix=f".{SIGNATURE_NAME}.")
    return root / SIGNATURE_NAME
