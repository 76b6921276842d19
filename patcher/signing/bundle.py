"""OMS v1.0 bundles: built from digests already known, encoded as a Sigstore bundle.

An OMS bundle (OpenSSF Model Signing spec v1.0) is a Sigstore bundle (media type
``application/vnd.dev.sigstore.bundle.v0.3+json``) whose DSSE envelope carries an in-toto
Statement v1 of predicate type ``https://model_signing/signature/v1.0``. The predicate lists one
resource ``{name, digest, algorithm}`` per file, sorted by name in code point order, and a
``serialization`` object (``method: files``, ``hash_type``, ``allow_symlinks``,
``ignore_paths``); the one subject is the model's directory name with the root digest, the
sha256 of the resources' raw digests concatenated in that order. The DSSE signature is over the
pre-authentication encoding ``DSSEv1 <len(type)> <type> <len(body)> <body>``.

Nothing here reads a model file: the digests come from the caller (a verified manifest).
The Sigstore bundle's JSON is the one ``sigstore_models`` (what ``model_signing`` uses) writes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Mapping

from ..errors import InputError
from .keys import KeySigner

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
SIGNATURE_NAME = "model.sig"
# Always left out, as top-level names (spec 6.2): git's files, and the signature itself.
DEFAULT_IGNORED = (".git", ".gitattributes", ".github", ".gitignore")
# What modelpatch also leaves out of a model (``model_dir.SKIPPED_DIRS``): its revert data and
# the huggingface_hub download cache; recorded in ``ignore_paths`` so other verifiers skip
# them too.
TOOL_IGNORED = (".modelpatch", ".cache")
IGNORE_PATHS = tuple(sorted({*DEFAULT_IGNORED, *TOOL_IGNORED, SIGNATURE_NAME}))


def is_ignored(name: str, ignore_paths: tuple[str, ...] | list[str] = IGNORE_PATHS) -> bool:
    """Whether the relative POSIX path ``name`` is out of the signing scope: under a default
    exclusion or one of ``ignore_paths`` (exact relative paths and their subtrees)."""
    if name.split("/", 1)[0] in DEFAULT_IGNORED:
        return True
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in ignore_paths)


def root_digest(resources: Mapping[str, str]) -> str:
    """sha256 over the raw bytes of every resource digest, in name order (spec 6.5.1)."""
    h = hashlib.sha256()
    for name in sorted(resources):
        h.update(bytes.fromhex(resources[name]))
    return h.hexdigest()


def statement(model_name: str, resources: Mapping[str, str], *, allow_symlinks: bool = False,
              ignore_paths: tuple[str, ...] = IGNORE_PATHS) -> dict:
    """The in-toto Statement of an OMS signature over ``resources`` (``{name: sha256}``)."""
    if not resources:
        raise InputError("nothing to sign: the model has no file in the signing scope")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": model_name or "model",
                     "digest": {"sha256": root_digest(resources)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "resources": [{"name": name, "algorithm": "sha256", "digest": resources[name]}
                          for name in sorted(resources)],
            "serialization": {"method": "files", "hash_type": "sha256",
                              "allow_symlinks": allow_symlinks,
                              "ignore_paths": list(ignore_paths)},
        },
    }


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of ``payload``."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode(statement_json: dict, signer: KeySigner) -> bytes:
    """The OMS bundle (JSON bytes) of ``statement_json`` signed by ``signer``: verification
    material ``publicKey.hint`` for a key, ``x509CertificateChain`` (leaf first) for a
    certificate.

    Written as the Sigstore bundle v0.3 protobuf-JSON mapping that ``sigstore_models`` (what
    ``model_signing`` writes with) produces, byte for byte: camelCase field names, bytes in
    standard base64, field order as declared, an empty ``tlogEntries`` and ``keyid``. Built
    directly, since those models cost more to import than signing costs."""
    payload = json.dumps(statement_json, ensure_ascii=False, separators=(",", ":"),
                         sort_keys=True).encode("utf-8")
    signature = signer.sign(pae(PAYLOAD_TYPE, payload))
    if signer.certificates:
        from .keys import der_of

        material: dict = {"x509CertificateChain": {"certificates": [
            {"rawBytes": _b64(der_of(c))} for c in signer.certificates]}}
    else:
        from .keys import fingerprint

        material = {"publicKey": {"hint": fingerprint(signer.public_key)}}
    material["tlogEntries"] = []
    bundle = {"mediaType": BUNDLE_MEDIA_TYPE, "verificationMaterial": material,
              "dsseEnvelope": {"payload": _b64(payload), "payloadType": PAYLOAD_TYPE,
                               "signatures": [{"sig": _b64(signature), "keyid": ""}]}}
    return json.dumps(bundle, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
