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
The Sigstore bundle's JSON is written by ``sigstore_models``, the models ``model_signing`` uses.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Mapping

from ..errors import InputError
from .keys import SIGN_EXTRA_HINT, KeySigner

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


def _models():
    try:
        from sigstore_models.bundle import v1 as bundle_v1
        from sigstore_models.common import v1 as common_v1
        from sigstore_models.intoto import Envelope, Signature
    except ImportError:
        raise InputError("signing needs the 'sigstore-models' package",
                         hint=SIGN_EXTRA_HINT) from None
    return bundle_v1, common_v1, Envelope, Signature


def encode(statement_json: dict, signer: KeySigner) -> bytes:
    """The OMS bundle (JSON bytes) of ``statement_json`` signed by ``signer``: verification
    material ``publicKey.hint`` for a key, ``x509CertificateChain`` (leaf first) for a
    certificate."""
    from .keys import crypto
    bundle_v1, common_v1, Envelope, Signature = _models()
    payload = json.dumps(statement_json, ensure_ascii=False, separators=(",", ":"),
                         sort_keys=True).encode("utf-8")
    signature = signer.sign(pae(PAYLOAD_TYPE, payload))
    b64 = base64.b64encode
    if signer.certificates:
        _, _, serialization, _ = crypto()
        chain = common_v1.X509CertificateChain(certificates=[
            common_v1.X509Certificate(raw_bytes=b64(c.public_bytes(serialization.Encoding.DER)))
            for c in signer.certificates])
        material = bundle_v1.VerificationMaterial(x509_certificate_chain=chain, tlog_entries=[])
    else:
        from .keys import fingerprint
        material = bundle_v1.VerificationMaterial(
            public_key=common_v1.PublicKeyIdentifier(hint=fingerprint(signer.public_key)),
            tlog_entries=[])
    bundle = bundle_v1.Bundle(
        media_type=BUNDLE_MEDIA_TYPE, verification_material=material,
        dsse_envelope=Envelope(payload=b64(payload), payload_type=PAYLOAD_TYPE,
                               signatures=[Signature(sig=b64(signature), keyid="")]))
    return bundle.to_json().encode("utf-8")
