"""Checking a bundle's signature (spec 8.2) with what the user trusts: a public key, a CA
chain, or (Sigstore keyless) an identity and its OIDC issuer.

- key: the bundle's ``publicKey.hint`` must be the key's fingerprint (older bundles:
  ``rawBytes``, the key itself), and the DSSE signature must verify with the key.
- certificate: the bundle's leaf certificate must chain to one of the given CA certificates
  through the bundle's intermediates, be valid now (no trusted timestamp says when it signed),
  be meant for signing (key usage digitalSignature, or extended key usage codeSigning), and its
  key must verify the DSSE signature. Chain building is OpenSSL's (pyOpenSSL's X509Store), as
  in ``model_signing``.
- sigstore: sigstore-python's verifier, with the public-good trust root (needs the network).
"""

from __future__ import annotations

import datetime as dt

from ..errors import InputError, VerifyMismatch
from .bundle import PAYLOAD_TYPE, pae
from .keys import SIGN_EXTRA_HINT, check_curve, crypto, fingerprint, signature_hash, subject_of
from .keys import x509 as x509_module
from .parse import Bundle


def _ecdsa_verify(public_key, bundle: Bundle, who: str) -> None:
    from cryptography.exceptions import InvalidSignature

    _, _, ec = crypto()
    try:
        public_key.verify(bundle.signature, pae(PAYLOAD_TYPE, bundle.payload),
                          ec.ECDSA(signature_hash(public_key)))
    except InvalidSignature:
        raise VerifyMismatch(f"the signature does not verify with {who}: the payload was "
                             f"changed, or another key signed it") from None


def _refuse_method(bundle: Bundle, wanted: str, option: str) -> None:
    if bundle.method != wanted:
        option_for = {"key": "--key", "certificate": "--cert-chain",
                      "sigstore": "--identity and --issuer"}[bundle.method]
        what = {"key": "a key", "certificate": "a certificate",
                "sigstore": "a Sigstore identity"}[wanted]
        raise VerifyMismatch(f"signed by {bundle.claimed_signer()}, not by {what}: "
                             f"{option} cannot check it (pass {option_for})")


def check_key(bundle: Bundle, public_key) -> str:
    """Check ``bundle`` was signed by ``public_key``; return who signed."""
    _, serialization, _ = crypto()
    _refuse_method(bundle, "key", "--key")
    mine = fingerprint(public_key)
    if bundle.hint is not None and bundle.hint != mine:
        raise VerifyMismatch(f"signed by another key: fingerprint {bundle.hint}, not {mine}")
    if bundle.raw_key is not None and bundle.raw_key != public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        raise VerifyMismatch(f"signed by another key, not the one of fingerprint {mine}")
    _ecdsa_verify(public_key, bundle, f"the key of fingerprint {mine}")
    return f"key fingerprint {mine}"


def check_certificate(bundle: Bundle, anchors: list) -> str:
    """Check ``bundle``'s certificate chain against the CA certificates ``anchors`` and its
    signature against the leaf; return who signed (the leaf's subject)."""
    x509 = x509_module()
    _refuse_method(bundle, "certificate", "--cert-chain")
    try:
        from OpenSSL import crypto as ossl
    except ImportError:
        raise InputError("certificate verification needs the 'pyopenssl' package",
                         hint=SIGN_EXTRA_HINT) from None
    try:
        chain = [x509.load_der_x509_certificate(der) for der in bundle.certificates]
    except ValueError:
        raise VerifyMismatch("a certificate in the bundle is not DER X.509") from None
    leaf = chain[0]
    now = dt.datetime.now(dt.timezone.utc)
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        raise VerifyMismatch(f"the signing certificate {subject_of(leaf)} is not valid now "
                             f"({leaf.not_valid_before_utc:%Y-%m-%d} to "
                             f"{leaf.not_valid_after_utc:%Y-%m-%d})")
    store = ossl.X509Store()
    for anchor in anchors:
        store.add_cert(ossl.X509.from_cryptography(anchor))
    context = ossl.X509StoreContext(store, ossl.X509.from_cryptography(leaf),
                                    [ossl.X509.from_cryptography(c) for c in chain[1:]])
    try:
        context.verify_certificate()
    except ossl.X509StoreContextError as exc:
        raise VerifyMismatch(f"the signing certificate {subject_of(leaf)} does not chain to "
                             f"the given CA: {exc}") from None
    if not _for_signing(leaf, x509):
        raise VerifyMismatch(f"the certificate {subject_of(leaf)} is not meant for signing "
                             f"(no digitalSignature key usage, no codeSigning extended usage)")
    try:
        check_curve(leaf.public_key(), "the signing certificate")
    except InputError as exc:
        raise VerifyMismatch(exc.message) from None
    _ecdsa_verify(leaf.public_key(), bundle, f"the certificate {subject_of(leaf)}")
    return f"certificate {subject_of(leaf)}"


def _for_signing(leaf, x509) -> bool:
    from cryptography.x509.oid import ExtendedKeyUsageOID

    try:
        if leaf.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature:
            return True
    except x509.ExtensionNotFound:
        pass
    try:
        usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        return ExtendedKeyUsageOID.CODE_SIGNING in usage
    except x509.ExtensionNotFound:
        return False


def check_sigstore(bundle: Bundle, identity: str, issuer: str) -> str:
    """Sigstore keyless: the bundle verified by sigstore-python against the public-good trust
    root, for the certificate identity ``identity`` issued by ``issuer``."""
    import json

    _refuse_method(bundle, "sigstore", "--identity")
    from .keyless import verify_dsse

    payload_type, payload = verify_dsse(json.dumps(bundle.document), identity, issuer)
    if payload_type != PAYLOAD_TYPE or payload != bundle.payload:
        raise VerifyMismatch("the Sigstore verification returned another payload")
    return f"sigstore identity {identity} (issuer {issuer})"
