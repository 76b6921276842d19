"""Signing keys and certificates: loaded once, checked, never logged or copied.

A private key file is refused when its group or others may read or write it, as ssh refuses an
unprotected identity file: a key anyone on the machine can read signs for anyone. An encrypted
key's passphrase comes from ``$MODELPATCH_KEY_PASSWORD`` (never a recipe, never the command
line, where ``ps`` shows it). Key types: the elliptic curves the OMS algorithm registry marks
REQUIRED (P-256, P-384, P-521), each with the hash of its size, as ``model_signing`` pairs them.
The key's fingerprint (the bundle's ``publicKey.hint``) is the sha256 of its PEM
SubjectPublicKeyInfo text, as ``model_signing`` computes it, so both tools name a key alike.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field

from ..errors import InputError, OperationFailed

PASSWORD_ENV = "MODELPATCH_KEY_PASSWORD"
MAX_PEM_BYTES = 1 << 20          # a key or a certificate chain; more is not a PEM file
CURVES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}
SIGN_EXTRA_HINT = "install the signing extra: pip install 'modelpatch[sign]'"


def crypto():
    """The ``cryptography`` modules keys and signatures need (``hashes``, ``serialization``,
    ``ec``), or one line saying how to install them. Certificates' ``x509`` is ``x509()``: it
    alone imports more than the rest, and signing with a bare key does not use it."""
    try:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        raise InputError("signing needs the 'cryptography' package",
                         hint=SIGN_EXTRA_HINT) from None
    return hashes, serialization, ec


def x509():
    """``cryptography.x509`` (certificates), or one line saying how to install it."""
    try:
        from cryptography import x509 as module
    except ImportError:
        raise InputError("signing needs the 'cryptography' package",
                         hint=SIGN_EXTRA_HINT) from None
    return module


def der_of(certificate) -> bytes:
    """A certificate's DER bytes (the bundle's ``rawBytes``)."""
    _, serialization, _ = crypto()
    return certificate.public_bytes(serialization.Encoding.DER)


def _read(path: str | os.PathLike, what: str, *, private: bool = False) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"no such {what}", where=path) from None
    except OSError as exc:
        raise OperationFailed(f"cannot read the {what}: {exc.strerror or exc}",
                              where=path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"the {what} is not a regular file", where=path)
        if private and st.st_mode & 0o077:
            raise InputError(f"the private key file is accessible by others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); refusing to use it", where=path,
                             hint=f"chmod 600 {os.fspath(path)}")
        if private and st.st_uid not in (os.getuid(), 0):
            raise InputError("the private key file belongs to another user; refusing to use it",
                             where=path)
        data = f.read(MAX_PEM_BYTES + 1)
    if len(data) > MAX_PEM_BYTES:
        raise InputError(f"the {what} is larger than {MAX_PEM_BYTES} bytes", where=path)
    return data


def check_curve(public_key, where) -> None:
    _, _, ec = crypto()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise InputError(f"unsupported key type {type(public_key).__name__.lstrip('_')}: OMS "
                         f"signs with ECDSA on P-256, P-384 or P-521", where=where)
    if public_key.curve.name not in CURVES:
        raise InputError(f"unsupported curve {public_key.curve.name}: OMS signs with P-256, "
                         f"P-384 or P-521", where=where)


def signature_hash(public_key):
    """The hash ECDSA signs with on this curve (SHA-256, -384, -512 by key size)."""
    hashes, _, _ = crypto()
    size = public_key.curve.key_size
    return hashes.SHA256() if size == 256 else hashes.SHA384() if size == 384 else hashes.SHA512()


def fingerprint(public_key) -> str:
    """sha256 hex of the key's PEM SubjectPublicKeyInfo: the bundle's ``publicKey.hint``."""
    _, serialization, _ = crypto()
    pem = public_key.public_bytes(serialization.Encoding.PEM,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def load_public_key(path: str | os.PathLike):
    """A PEM public key (or the key of a PEM certificate) of a supported curve."""
    _, serialization, _ = crypto()
    data = _read(path, "public key")
    try:
        key = (x509().load_pem_x509_certificate(data).public_key()
               if b"-----BEGIN CERTIFICATE" in data else serialization.load_pem_public_key(data))
    except ValueError:
        raise InputError("not a PEM public key", where=path) from None
    check_curve(key, path)
    return key


def load_certificates(path: str | os.PathLike, what: str = "certificate chain") -> list:
    data = _read(path, what)
    try:
        certs = x509().load_pem_x509_certificates(data)
    except ValueError:
        raise InputError(f"not a PEM {what}", where=path) from None
    return certs


@dataclass(frozen=True)
class KeySigner:
    """A private key (and, to sign by certificate, its leaf certificate and CA chain). ``repr``
    never shows the key."""

    key: object = field(repr=False)
    where: str
    certificates: tuple = field(default=(), repr=False)
    """Leaf first, then its chain: empty for a bare key."""

    @property
    def public_key(self):
        return self.key.public_key()

    @property
    def method(self) -> str:
        return "certificate" if self.certificates else "key"

    def describe(self) -> str:
        """Who signs, for the provenance manifest and the model card."""
        if self.certificates:
            return f"certificate {subject_of(self.certificates[0])}"
        return f"key fingerprint {fingerprint(self.public_key)}"

    def sign(self, message: bytes) -> bytes:
        _, _, ec = crypto()
        return self.key.sign(message, ec.ECDSA(signature_hash(self.public_key)))


def load_signer(key: str | os.PathLike, *, cert: str | os.PathLike | None = None,
                chain: str | os.PathLike | None = None) -> KeySigner:
    """The private key at ``key`` (mode 0600 or stricter), with ``cert`` and ``chain`` to sign
    by certificate. Checked before any work: a wrong key fails before an apply writes."""
    _, serialization, _ = crypto()
    if chain is not None and cert is None:
        raise InputError("--chain needs --cert (the signing certificate)")
    data = _read(key, "private key", private=True)
    password = os.environ.get(PASSWORD_ENV)
    try:
        private = serialization.load_pem_private_key(
            data, password.encode("utf-8") if password else None)
    except TypeError:
        raise InputError(f"the private key is encrypted: set ${PASSWORD_ENV}" if not password
                         else "the private key is not encrypted: unset "
                              f"${PASSWORD_ENV}", where=key) from None
    except ValueError:
        raise InputError("not a PEM private key, or a wrong passphrase", where=key) from None
    finally:
        del data
    check_curve(private.public_key(), key)
    certificates: tuple = ()
    if cert is not None:
        leaf = load_certificates(cert, "signing certificate")
        if len(leaf) != 1:
            raise InputError("expected one certificate (the signing one)", where=cert)
        if leaf[0].public_key() != private.public_key():
            raise InputError("the certificate is not the private key's", where=cert)
        certificates = (leaf[0], *(load_certificates(chain) if chain is not None else ()))
    return KeySigner(private, str(key), certificates)


def subject_of(certificate) -> str:
    """The certificate's subject as RFC 4514 text (untrusted: escape before display)."""
    return certificate.subject.rfc4514_string() or f"serial {certificate.serial_number:x}"
