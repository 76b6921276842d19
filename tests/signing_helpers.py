"""Keys, certificates and small models for the signing tests, made with ``cryptography``
(nothing from outside). A private key is written mode 0600, as ``modelpatch sign`` requires."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PEM = serialization.Encoding.PEM


def write_key(directory: Path, name: str = "signer", curve=None) -> tuple[Path, Path]:
    """``(private.pem, public.pem)`` of a new EC key (P-256 unless ``curve``)."""
    key = ec.generate_private_key(curve or ec.SECP256R1())
    private, public = directory / f"{name}.key.pem", directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    os.chmod(private, 0o600)
    public.write_bytes(key.public_key().public_bytes(
        PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool, days: int = 30):
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(days=1))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(directory: Path, name: str = "pki") -> dict[str, Path]:
    """A root CA, an intermediate CA and a code-signing leaf: ``{"key", "leaf", "chain"
    (the intermediate), "root"}`` as PEM files."""
    root_key, mid_key, leaf_key = (ec.generate_private_key(ec.SECP384R1()) for _ in range(3))
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} root")])
    root = _cert(f"{name} root", root_key, root_name, root_key, ca=True)
    mid = _cert(f"{name} intermediate", mid_key, root.subject, root_key, ca=True)
    leaf = _cert(f"{name} platform team", leaf_key, mid.subject, mid_key, ca=False)
    paths = {k: directory / f"{name}.{k}.pem" for k in ("key", "leaf", "chain", "root")}
    paths["key"].write_bytes(leaf_key.private_bytes(PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    os.chmod(paths["key"], 0o600)
    paths["leaf"].write_bytes(leaf.public_bytes(PEM))
    paths["chain"].write_bytes(mid.public_bytes(PEM))
    paths["root"].write_bytes(root.public_bytes(PEM))
    return paths


def small_model(root: Path) -> Path:
    """A directory of a few plain files, one in a subdirectory, and git's files."""
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama"}\n')
    (root / "generation_config.json").write_text('{"temperature": 0.7}\n')
    (root / "weights.bin").write_bytes(os.urandom(4096))
    (root / "sub" / "tokenizer.json").write_text('{"v": 1}\n')
    (root / ".gitattributes").write_text("*.bin filter=lfs\n")
    return root


def variant(base: Path, out: Path, **options) -> Path:
    """A variant of ``base`` (a ``small_model``) by a config-only recipe."""
    from patcher import api

    return api.apply("sampling-defaults", base, out=out, **options).output


def model_signing(*args: str | os.PathLike) -> subprocess.CompletedProcess:
    """The ``model_signing`` command line of the installed package."""
    return subprocess.run([sys.executable, "-m", "model_signing", *map(str, args)],
                          capture_output=True, text=True, timeout=300)
