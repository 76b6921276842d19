"""``modelpatch sign`` and the signature options of ``verify``, ``apply``, ``doctor --fix`` and
``pull``: OMS v1.0 ``model.sig`` files (``patcher.signing``). Registered by ``commands``.

A private key is named by its path only; its bytes are read once by ``patcher.signing.keys``,
never echoed, logged or copied.
"""

from __future__ import annotations

import click

from .group import emit_json
from .options import jobs_option, json_option
from .output import echo

KEY_PATH = click.Path(dir_okay=False, path_type=str)


def sign_options(f):
    """``--sign KEY`` (and ``--sign-cert``, ``--sign-chain``) for the commands that commit a
    variant: it is committed signed, or not at all."""
    f = click.option("--sign", "sign_key", type=KEY_PATH, default=None, metavar="PRIVATE.pem",
                     help="Sign the variant (OMS model.sig) with this private key as the last "
                          "step of the commit; 'sigstore' signs keyless.")(f)
    return f


def require_signed_base_option(f):
    return click.option("--require-signed-base", "base_key", type=KEY_PATH, default=None,
                        metavar="PUB.pem",
                        help="Refuse a base that is not signed by this key (its model.sig, "
                             "then its files).")(f)


def signer_from(sign_key: str | None):
    """The signer ``--sign`` names, loaded and checked before any work."""
    from .. import api

    return None if sign_key is None else api.signer_of(sign_key)


def verify_options(f):
    """``verify``'s signature options: what to check ``model.sig`` with."""
    for option in reversed([
        click.option("--key", "pub_key", type=KEY_PATH, default=None, metavar="PUB.pem",
                     help="Check model.sig with this public key, then every file against it."),
        click.option("--cert-chain", type=KEY_PATH, default=None, metavar="CA.pem",
                     help="Check model.sig's certificate chain against these CA certificates."),
        click.option("--identity", default=None,
                     help="Sigstore keyless: the signer's identity (needs the network)."),
        click.option("--issuer", default=None, help="Sigstore keyless: the identity's issuer."),
        click.option("--ignore-unsigned-files", is_flag=True,
                     help="With a signature check: files the signature does not list are "
                          "allowed (listed ones must still match)."),
        click.option("--base-key", type=KEY_PATH, default=None, metavar="PUB.pem",
                     help="Also check that the base was signed with this key before the patch."),
    ]):
        f = option(f)
    return f


def signature_checked(signature: dict) -> bool:
    return any(signature.get(k) for k in ("pub_key", "cert_chain", "identity"))


def signed_only(directory: str, signature: dict) -> bool:
    """A signature was checked and it alone decides: ``directory`` has no provenance manifest
    (a model signed by another tool), or unsigned files are allowed (which the manifest's check
    of extra files would refuse)."""
    import os

    from ..gguf.single_file import model_directory
    from ..model.model_dir import MANIFEST_NAME

    return signature_checked(signature) and (signature.get("ignore_unsigned_files") or not
                                             os.path.lexists(os.path.join(
                                                 model_directory(directory), MANIFEST_NAME)))


def verify_signature(directory: str, *, pub_key, cert_chain, identity, issuer,
                     ignore_unsigned_files, base_key, fast, jobs, on_progress) -> list[str]:
    """The signature lines ``verify`` prints; raises ``VerifyMismatch`` (exit 1) on a failure.
    Without a key, the signer ``model.sig`` claims, marked as not checked."""
    from .. import api
    from ..gguf.single_file import model_directory
    from ..signing.verify import Trust, check_base, claimed

    directory = str(model_directory(directory))
    trust = Trust.load(key=pub_key, cert_chain=cert_chain, identity=identity, issuer=issuer)
    lines = []
    if trust.given:
        report = api.verify_signature(directory, trust, ignore_unsigned=ignore_unsigned_files,
                                      fast=fast, jobs=jobs, on_progress=on_progress)
        lines += [report.line(), f"OK  {report.files.summary()}"]
    elif ignore_unsigned_files:
        raise click.UsageError("--ignore-unsigned-files goes with --key, --cert-chain or "
                               "--identity")
    else:
        report = claimed(directory)
        if report is not None:
            lines.append(report.line())
    if base_key is not None:
        signer = check_base(directory, Trust.load(key=base_key))
        lines.append(f"base: signed by {signer} before the patch (its model.sig kept with the "
                     f"revert data)")
    return lines


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--key", "key", type=KEY_PATH, default=None, metavar="PRIVATE.pem",
              help="Private key (ECDSA P-256, P-384 or P-521; mode 0600). An encrypted key's "
                   "passphrase: $MODELPATCH_KEY_PASSWORD.")
@click.option("--cert", type=KEY_PATH, default=None, metavar="LEAF.pem",
              help="Sign by certificate: the key's signing certificate.")
@click.option("--chain", type=KEY_PATH, default=None, metavar="CA.pem",
              help="With --cert: the CA certificates above it.")
@click.option("--sigstore", is_flag=True,
              help="Sigstore keyless (Fulcio and Rekor; needs the network and an OIDC login).")
@click.option("--full", is_flag=True,
              help="Rehash every file against the manifest before signing (default: trust "
                   "verified digest-cache rows, as verify --fast).")
@jobs_option()
@json_option()
def sign(directory, key, cert, chain, sigstore, full, jobs, as_json):
    """Write DIRECTORY/model.sig, an OpenSSF Model Signing (OMS v1.0) bundle over every file
    of the variant, from the digests of its verified manifest: no file is rehashed to sign."""
    from .. import signatures  # what api.sign is, without the rest of the API's imports
    from ..signing.sign import KEYLESS

    if sigstore == (key is not None):
        raise click.UsageError("give --key PRIVATE.pem or --sigstore")
    if (cert or chain) and key is None:
        raise click.UsageError("--cert and --chain go with --key")
    from ..signing.keys import load_signer

    signer = KEYLESS if sigstore else load_signer(key, cert=cert, chain=chain)
    path = signatures.sign(directory, signer, full=full, jobs=jobs)
    who = "Sigstore keyless" if sigstore else signer.describe()
    if as_json:
        emit_json({"signature": str(path), "signer": who})
    else:
        echo(f"signed {path} ({who})")
