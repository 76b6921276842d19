"""Reading an OMS bundle: every structural rule of the OMS v1.0 JSON Schemas (bundle, envelope,
statement, predicate), then what a verifier must check beyond them (spec 8.1-8.4): the media
type, one resource per canonical relative path, the root digest, a method and hash this
verifier implements (``files``, ``sha256``; ``shards`` and other hashes are refused by name).

Nothing here trusts the bundle: the signature is checked by ``patcher.signing.check`` on the
bytes parsed here, and every failure is one line, exit code 1 (``VerifyMismatch``).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.jsonfile import parse_json
from ..errors import InputError, VerifyMismatch
from ..fsops import NotRegularFile, TooLarge, read_capped
from ..names import name_problem
from .bundle import PAYLOAD_TYPE, PREDICATE_TYPE, STATEMENT_TYPE, root_digest

MAX_BUNDLE_BYTES = 64 << 20          # ~400k resources; a model has far fewer files
MEDIA_TYPES = ("application/vnd.dev.sigstore.bundle+json;version=0.1",
               "application/vnd.dev.sigstore.bundle+json;version=0.2",
               "application/vnd.dev.sigstore.bundle+json;version=0.3",
               "application/vnd.dev.sigstore.bundle.v0.3+json")
HASHES = ("sha256", "blake2b", "blake3")
_HEX = re.compile(r"[0-9a-f]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class _NotOMS(Exception):
    """Why a bundle is not OMS v1.0 (the message is the one line shown)."""


@dataclass(frozen=True)
class Bundle:
    """A parsed, structurally valid OMS bundle; its signature is not checked yet."""

    method: str                         # key, certificate or sigstore
    payload: bytes = field(repr=False)
    signature: bytes = field(repr=False)
    statement: dict = field(repr=False)
    resources: dict[str, str] = field(repr=False)
    allow_symlinks: bool
    ignore_paths: tuple[str, ...]
    hint: str | None = None             # key: the key's fingerprint, as the bundle claims it
    raw_key: bytes | None = None        # key, older bundles: the DER public key
    certificates: tuple[bytes, ...] = ()  # certificate: DER, leaf first; sigstore: the one
    document: dict = field(default_factory=dict, repr=False)

    @property
    def model_name(self) -> str:
        return self.statement["subject"][0]["name"]

    def claimed_signer(self) -> str:
        """Who the bundle says signed it (not checked)."""
        if self.method == "key":
            if self.hint:
                return f"key fingerprint {self.hint}"
            import hashlib
            return f"key sha256:{hashlib.sha256(self.raw_key or b'').hexdigest()} (DER)"
        from .keys import subject_of, x509

        try:
            leaf = x509().load_der_x509_certificate(self.certificates[0])
        except ValueError:
            return f"{self.method} (unreadable certificate)"
        return f"{self.method} {subject_of(leaf)}"


def read_bundle(path: str | Path) -> Bundle:
    """Read and validate the bundle at ``path``."""
    try:
        data = read_capped(Path(path), MAX_BUNDLE_BYTES)
    except FileNotFoundError:
        raise InputError("no signature (model.sig)", where=path) from None
    except (IsADirectoryError, NotRegularFile):
        raise VerifyMismatch("not an OMS bundle: not a regular file", where=path) from None
    except TooLarge:
        raise InputError(f"signature larger than {MAX_BUNDLE_BYTES} bytes", where=path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", where=path) from None
    return parse_bundle(data, str(path))


def parse_bundle(data: bytes, where: str) -> Bundle:
    try:
        try:
            document = parse_json(data, where, constants=False)
        except InputError as exc:
            raise _NotOMS(f"not JSON ({exc.message})") from None
        return _bundle(document)
    except _NotOMS as exc:
        raise VerifyMismatch(f"not an OMS v1.0 bundle: {exc}", where=where) from None


def _obj(value: Any, where: str, keys: tuple[str, ...] | None = None,
         required: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise _NotOMS(f"{where}: expected an object")
    missing = [k for k in required if k not in value]
    if missing:
        raise _NotOMS(f"{where}: {missing[0]!r} is missing")
    if keys is not None and (extra := sorted(set(value) - set(keys))):
        raise _NotOMS(f"{where}: unexpected key {extra[0]!r}")
    return value


def _str(value: Any, where: str, pattern: re.Pattern | None = None) -> str:
    if not isinstance(value, str) or not value or (pattern and not pattern.fullmatch(value)):
        raise _NotOMS(f"{where}: expected a non-empty string" +
                     (" of lowercase hex" if pattern else ""))
    return value


def _b64(value: Any, where: str) -> bytes:
    try:
        return base64.b64decode(_str(value, where), validate=True)
    except (binascii.Error, ValueError):
        raise _NotOMS(f"{where}: not base64") from None


def _bundle(document: Any) -> Bundle:
    top = _obj(document, "bundle", ("mediaType", "verificationMaterial", "dsseEnvelope"),
               ("mediaType", "verificationMaterial", "dsseEnvelope"))
    if top["mediaType"] not in MEDIA_TYPES:
        raise _NotOMS(f"mediaType {str(top['mediaType'])[:80]!r} is not a Sigstore bundle's")
    material = _obj(top["verificationMaterial"], "verificationMaterial")
    method, hint, raw_key, certs = _material(material)
    env = _obj(top["dsseEnvelope"], "dsseEnvelope", ("payload", "payloadType", "signatures"),
               ("payload", "payloadType", "signatures"))
    if env["payloadType"] != PAYLOAD_TYPE:
        raise _NotOMS(f"dsseEnvelope.payloadType is not {PAYLOAD_TYPE!r}")
    sigs = env["signatures"]
    if not isinstance(sigs, list) or not sigs:
        raise _NotOMS("dsseEnvelope.signatures: expected at least one")
    for i, sig in enumerate(sigs):
        _obj(sig, f"dsseEnvelope.signatures[{i}]", ("sig", "keyid"), ("sig",))
        if not isinstance(sig.get("keyid", ""), (str, type(None))):
            raise _NotOMS(f"dsseEnvelope.signatures[{i}].keyid: expected a string or null")
    signature = _b64(sigs[0]["sig"], "dsseEnvelope.signatures[0].sig")
    payload = _b64(env["payload"], "dsseEnvelope.payload")
    try:
        stmt = parse_json(payload, "payload", constants=False)
    except InputError as exc:
        raise _NotOMS(f"the payload is not JSON ({exc.message})") from None
    resources, serialization = _statement(stmt)
    return Bundle(method=method, payload=payload, signature=signature, statement=stmt,
                  resources=resources, allow_symlinks=serialization["allow_symlinks"],
                  ignore_paths=tuple(serialization.get("ignore_paths", ())), hint=hint,
                  raw_key=raw_key, certificates=certs, document=top)


def _material(material: dict) -> tuple[str, str | None, bytes | None, tuple[bytes, ...]]:
    tlog = material.get("tlogEntries")
    if tlog is not None and not isinstance(tlog, list):
        raise _NotOMS("verificationMaterial.tlogEntries: expected a list")
    if "publicKey" in material:
        key = _obj(material["publicKey"], "verificationMaterial.publicKey")
        if "hint" in key:
            return "key", _str(key["hint"], "verificationMaterial.publicKey.hint"), None, ()
        if "rawBytes" in key:           # bundles of model_signing before 1.1
            return "key", None, _b64(key["rawBytes"], "verificationMaterial.publicKey"), ()
        raise _NotOMS("verificationMaterial.publicKey: neither 'hint' nor 'rawBytes'")
    if "x509CertificateChain" in material:
        chain = _obj(material["x509CertificateChain"], "verificationMaterial."
                     "x509CertificateChain", None, ("certificates",))["certificates"]
        if not isinstance(chain, list) or not chain:
            raise _NotOMS("verificationMaterial.x509CertificateChain: no certificate")
        return "certificate", None, None, tuple(
            _b64(_obj(c, "certificate", None, ("rawBytes",))["rawBytes"],
                 f"x509CertificateChain.certificates[{i}]") for i, c in enumerate(chain))
    if "certificate" in material:
        if not tlog:
            raise _NotOMS("a Sigstore bundle without transparency log entries (tlogEntries)")
        cert = _obj(material["certificate"], "verificationMaterial.certificate", None,
                    ("rawBytes",))
        return "sigstore", None, None, (_b64(cert["rawBytes"], "certificate.rawBytes"),)
    raise _NotOMS("verificationMaterial has no publicKey, x509CertificateChain or certificate")


def _statement(stmt: Any) -> tuple[dict[str, str], dict]:
    stmt = _obj(stmt, "statement", ("_type", "subject", "predicateType", "predicate"),
                ("_type", "subject", "predicateType", "predicate"))
    if stmt["_type"] != STATEMENT_TYPE:
        raise _NotOMS(f"statement _type is not {STATEMENT_TYPE!r}")
    if stmt["predicateType"] != PREDICATE_TYPE:
        raise _NotOMS(f"predicateType {str(stmt['predicateType'])[:80]!r} is not "
                     f"{PREDICATE_TYPE!r}")
    subject = stmt["subject"]
    if not isinstance(subject, list) or len(subject) != 1:
        raise _NotOMS("subject: expected exactly one entry")
    sub = _obj(subject[0], "subject[0]", None, ("name", "digest"))
    _str(sub["name"], "subject[0].name")
    digest = _obj(sub["digest"], "subject[0].digest")
    if not digest or any(not isinstance(v, str) or not _HEX.fullmatch(v)
                         for v in digest.values()):
        raise _NotOMS("subject[0].digest: expected lowercase hex digests")
    pred = _obj(stmt["predicate"], "predicate", ("resources", "serialization"),
                ("resources", "serialization"))
    ser = _obj(pred["serialization"], "serialization",
               ("method", "hash_type", "shard_size", "allow_symlinks", "ignore_paths"),
               ("method", "hash_type", "allow_symlinks"))
    if ser["method"] not in ("files", "shards") or ser["hash_type"] not in HASHES:
        raise _NotOMS("serialization: unknown method or hash_type")
    if not isinstance(ser["allow_symlinks"], bool):
        raise _NotOMS("serialization.allow_symlinks: expected true or false")
    ignore = ser.get("ignore_paths", [])
    if not isinstance(ignore, list) or any(not isinstance(p, str) or not p for p in ignore):
        raise _NotOMS("serialization.ignore_paths: expected a list of paths")
    if ser["method"] == "shards":
        raise _NotOMS("serialization method 'shards' is not supported by this verifier "
                     "(files only)")
    if ser["hash_type"] != "sha256":
        raise _NotOMS(f"hash_type {ser['hash_type']!r} is not supported by this verifier "
                     f"(sha256 only)")
    if not isinstance(pred["resources"], list) or not pred["resources"]:
        raise _NotOMS("predicate.resources: expected at least one file")
    resources: dict[str, str] = {}
    for i, res in enumerate(pred["resources"]):
        res = _obj(res, f"resources[{i}]", None, ("name", "digest", "algorithm"))
        name = _str(res["name"], f"resources[{i}].name")
        if res["algorithm"] != "sha256":
            raise _NotOMS(f"resources[{i}].algorithm is not the hash_type")
        why = name_problem(name, allow_dot_dirs=True)
        if why or name in resources:
            raise _NotOMS(f"resources[{i}] ({name[:80]!r}): {why or 'listed twice'}")
        resources[name] = _str(res["digest"], f"resources[{i}].digest", _SHA256)
    if digest.get("sha256") != root_digest(resources):
        raise _NotOMS("subject[0].digest.sha256 is not the root digest of the resources")
    return resources, ser


