"""Signing a variant and checking a signature, as the commands of ``patcher.api`` do it
(``api.sign``, ``api.verify_signature``, and ``apply``'s ``sign`` and ``require_signed_base``):
keys loaded and checked before any work, the directory recovered and locked first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .opening import recovered

if TYPE_CHECKING:
    from .model.model_dir import ModelDir


def signer_of(sign):
    """A ``KeySigner`` for a private key path (checked now: mode, type, passphrase),
    ``"sigstore"`` for keyless, or ``sign`` as given."""
    from .signing.keys import load_signer
    from .signing.sign import KEYLESS

    if sign is None or sign == KEYLESS or not isinstance(sign, (str, os.PathLike)):
        return sign
    return load_signer(sign)


def trust_of(key):
    """A ``Trust`` for a public key path, or ``key`` as given (None, or a ``Trust``)."""
    from .signing.verify import Trust

    return Trust.load(key=key) if isinstance(key, (str, os.PathLike)) else key


def base_signature_of(base: ModelDir, trust, jobs: int | None) -> dict | None:
    if trust is None:
        return None         # the builder records what the base's model.sig claims
    from .signing.verify import base_signature

    return base_signature(base.root, trust, fast=True, jobs=jobs)


def sign(directory: str | os.PathLike, signer, *, full: bool = False,
         jobs: int | None = None) -> Path:
    """Write ``directory/model.sig`` (OMS v1.0) from its verified manifest's digests
    (``patcher.signing.sign``); ``signer`` as ``apply``'s ``sign``."""
    from .execute.locking import lock_directory
    from .signing.sign import sign_directory

    signer = signer_of(signer)
    recovered(directory)
    with lock_directory(Path(directory), exclusive=True):
        return sign_directory(directory, signer, full=full, jobs=jobs)


def verify_signature(directory: str | os.PathLike, trust, *, ignore_unsigned: bool = False,
                     fast: bool = False, jobs: int | None = None, on_progress=None):
    """Check ``directory/model.sig`` with ``trust`` (a ``Trust``, or a public key path), then
    the files against it; returns a ``SignatureReport`` or raises ``VerifyMismatch``."""
    from .execute.locking import lock_directory
    from .signing.verify import verify_signed

    recovered(directory)
    with lock_directory(Path(directory), exclusive=False):
        return verify_signed(directory, trust_of(trust), ignore_unsigned=ignore_unsigned,
                             fast=fast, jobs=jobs, on_progress=on_progress)
