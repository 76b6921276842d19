"""``modelpatch verify --key|--cert-chain|--identity``: the signature first, then the files;
the base's signature of a variant (``--base-key``, ``apply --require-signed-base``).

The order is the spec's (8.1-8.4): the bundle is parsed and held to the OMS schemas, its
signature checked with what the user trusts, and only then are the files compared with the
signed digests. Any failure is one line (``VerifyMismatch``, exit code 1) naming it. Without
anything to check the signature with, the signer the bundle claims is reported as not checked.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, VerifyMismatch
from .bundle import SIGNATURE_NAME, is_ignored
from .files import FilesReport, check_files
from .parse import Bundle, read_bundle

BASE_SIGNATURE_KEY = "base_signature"
"""Where the provenance manifest records the base's signature (``externalParameters``)."""


@dataclass(frozen=True)
class Trust:
    """What a signature is checked with: a public key, CA certificates, or a Sigstore identity
    and issuer. Empty: nothing (the signer is then only reported, never verified)."""

    key: object = None
    anchors: tuple = ()
    identity: str | None = None
    issuer: str | None = None

    @classmethod
    def load(cls, *, key: str | os.PathLike | None = None,
             cert_chain: str | os.PathLike | None = None, identity: str | None = None,
             issuer: str | None = None) -> Trust:
        from .keys import load_certificates, load_public_key

        given = [x for x in (key, cert_chain, identity) if x is not None]
        if len(given) > 1:
            raise InputError("give one of --key, --cert-chain, --identity")
        if (identity is None) != (issuer is None):
            raise InputError("--identity and --issuer go together")
        return cls(key=load_public_key(key) if key is not None else None,
                   anchors=tuple(load_certificates(cert_chain)) if cert_chain else (),
                   identity=identity, issuer=issuer)

    @property
    def given(self) -> bool:
        return self.key is not None or bool(self.anchors) or self.identity is not None

    def check(self, bundle: Bundle) -> str:
        """Who signed ``bundle``, verified; ``VerifyMismatch`` otherwise."""
        from .check import check_certificate, check_key, check_sigstore

        if self.key is not None:
            return check_key(bundle, self.key)
        if self.anchors:
            return check_certificate(bundle, list(self.anchors))
        return check_sigstore(bundle, self.identity, self.issuer)


@dataclass(frozen=True)
class SignatureReport:
    signer: str
    """Who signed: verified when ``checked``, else as the bundle claims."""
    checked: bool
    files: FilesReport | None = None
    check_with: str = "--key"
    """The option that would check it (unchecked reports)."""

    def line(self) -> str:
        if not self.checked:
            return (f"{SIGNATURE_NAME}: signed by {self.signer} (not checked: pass "
                    f"{self.check_with})")
        return f"{SIGNATURE_NAME}: signature verified, signed by {self.signer}"


def verify_signed(directory: str | os.PathLike, trust: Trust, *, ignore_unsigned: bool = False,
                  fast: bool = False, jobs: int | None = None, on_progress=None,
                  also_ignore: tuple[str, ...] = ()) -> SignatureReport:
    """Check ``directory/model.sig`` with ``trust``, then every file against it. Raises
    ``VerifyMismatch`` naming what failed: the signature, or the first file that differs.
    ``also_ignore``: paths modelpatch itself put there after the signature (a pull's hub
    files), out of the signing scope."""
    root = Path(directory)
    bundle = read_bundle(root / SIGNATURE_NAME)
    try:
        signer = trust.check(bundle)
    except VerifyMismatch as exc:
        exc.where = exc.where or str(root / SIGNATURE_NAME)
        raise
    files = check_files(root, bundle, ignore_unsigned=ignore_unsigned, fast=fast, jobs=jobs,
                        on_progress=on_progress, also_ignore=also_ignore)
    if not files.ok:
        raise VerifyMismatch(f"signed by {signer}, but {files.summary()}", where=root)
    return SignatureReport(signer, True, files)


def claimed(directory: str | os.PathLike) -> SignatureReport | None:
    """The signer ``directory/model.sig`` claims (the bundle held to the OMS schemas, its
    signature not checked), or None without a ``model.sig``."""
    path = Path(directory) / SIGNATURE_NAME
    if not os.path.lexists(path):
        return None
    bundle = read_bundle(path)
    option = {"key": "--key", "certificate": "--cert-chain",
              "sigstore": "--identity and --issuer"}[bundle.method]
    return SignatureReport(bundle.claimed_signer(), False, check_with=option)


def base_signature(base: str | os.PathLike, trust: Trust | None = None, *, fast: bool = True,
                   jobs: int | None = None) -> dict | None:
    """What the provenance manifest records of the base's ``model.sig``: its sha256, size and
    signer, whether it was verified (``trust``: the signature, then the base's files) and that
    it is not carried into the variant (it would not match the variant's files). None for an
    unsigned base; with ``trust``, an unsigned base is refused."""
    root = Path(base)
    path = root / SIGNATURE_NAME
    if not os.path.lexists(path):
        if trust is not None:
            raise VerifyMismatch("the base is not signed (no model.sig); "
                                 "--require-signed-base refuses it", where=root)
        return None
    data = path.read_bytes()
    if trust is not None:
        signer = verify_signed(root, trust, fast=fast, jobs=jobs).signer
    else:
        signer = read_bundle(path).claimed_signer()
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "signer": signer,
            "verified": trust is not None, "carried": False}


def check_base(variant: str | os.PathLike, trust: Trust) -> str:
    """``verify --base-key``: the base of ``variant`` was signed with ``trust`` before the patch.
    The base's ``model.sig``, kept with the revert data, must be the one the provenance
    manifest recorded, verify with ``trust``, and name every base file the patch read with the
    digest the manifest records for it. Returns who signed the base."""
    from ..integrity.manifest import read_manifest
    from ..integrity.patch_record import patch_dirs

    root = Path(variant)
    manifest = read_manifest(root)
    external = manifest.predicate["buildDefinition"]["externalParameters"]
    record = external.get(BASE_SIGNATURE_KEY)
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        raise VerifyMismatch("the base was not signed when this variant was made (no "
                             "base_signature in the provenance manifest)", where=root)
    dirs = patch_dirs(root)
    kept = dirs[-1] / "originals" / SIGNATURE_NAME if dirs else None
    if kept is None or not kept.is_file():
        raise VerifyMismatch("the base's model.sig is missing from the revert data",
                             where=root)
    data = kept.read_bytes()
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise VerifyMismatch("the base's model.sig kept with the revert data is not the one "
                             "the provenance manifest recorded", where=kept)
    from .parse import parse_bundle

    bundle = parse_bundle(data, str(kept))
    signer = trust.check(bundle)
    for rel, (digest, _size) in sorted(manifest.base_files.items()):
        if is_ignored(rel):
            continue
        if bundle.resources.get(rel) != digest:
            raise VerifyMismatch(f"base file {rel} as the patch read it is not the one "
                                 f"{signer} signed", where=root)
    return signer
