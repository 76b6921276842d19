"""Sigstore keyless signing and verification, through sigstore-python (a dependency of
``model_signing``): a short-lived Fulcio certificate for the signer's OIDC identity, the DSSE
envelope logged in Rekor, the bundle checked against the public-good trust root.

Both directions need the network (Fulcio, Rekor, the OIDC issuer, the TUF trust root), which
this project's tests do not have: this path is written against sigstore-python's API but is
not exercised by the test suite (README says so). It plugs into the same bundle and
file checks as the key and certificate methods.
"""

from __future__ import annotations

from ..errors import InputError, OperationFailed, VerifyMismatch
from .keys import SIGN_EXTRA_HINT


def _sigstore():
    try:
        import sigstore  # noqa: F401
    except ImportError:
        raise InputError("Sigstore keyless signing needs the 'sigstore' package",
                         hint=SIGN_EXTRA_HINT) from None


def sign_dsse(payload: bytes) -> bytes:
    """The Sigstore bundle (JSON bytes) of the in-toto statement ``payload``, signed with an
    identity token from the ambient environment (CI) or the browser flow."""
    _sigstore()
    from sigstore import dsse, oidc
    from sigstore.models import ClientTrustConfig
    from sigstore.sign import SigningContext

    try:
        token = oidc.detect_credential()
        config = ClientTrustConfig.production()
        context = SigningContext.from_trust_config(config)
        identity = (oidc.IdentityToken(token) if token else
                    oidc.Issuer(config.signing_config.get_oidc_url()).identity_token())
        with context.signer(identity) as signer:
            bundle = signer.sign_dsse(dsse.Statement(payload))
    except Exception as exc:            # network, OIDC and Sigstore errors of many kinds
        raise OperationFailed(f"Sigstore signing failed: {type(exc).__name__}: {exc}") from None
    return bundle.to_json().encode("utf-8")


def verify_dsse(bundle_json: str, identity: str, issuer: str) -> tuple[str, bytes]:
    """(payload type, payload) of a Sigstore bundle verified for ``identity`` and ``issuer``."""
    _sigstore()
    from sigstore.errors import VerificationError
    from sigstore.models import Bundle
    from sigstore.verify import Verifier, policy

    try:
        bundle = Bundle.from_json(bundle_json)
        verifier = Verifier.production()
        return verifier.verify_dsse(bundle, policy.Identity(identity=identity, issuer=issuer))
    except VerificationError as exc:
        raise VerifyMismatch(f"the Sigstore signature does not verify: {exc}") from None
    except Exception as exc:
        raise OperationFailed(f"Sigstore verification failed: {type(exc).__name__}: "
                              f"{exc}") from None
