"""Signed variants: OpenSSF Model Signing (OMS v1.0) bundles made from the digests a verified
manifest holds, and checked the way the spec says.

- ``bundle``: the in-toto statement, the DSSE encoding and the Sigstore bundle written;
- ``parse``: a bundle read and held to the OMS schemas;
- ``keys``: private keys (refused when others can read them), public keys, certificates;
- ``check``: a signature checked with a key, a CA chain or a Sigstore identity;
- ``files``: a directory compared with the signed resources;
- ``sign`` and ``verify``: the commands' work; ``keyless``: Sigstore keyless signing.

``cryptography``, ``sigstore-models``, ``pyopenssl`` (certificates) and ``sigstore`` (keyless)
are imported only here, only when a signature is made or checked: the ``sign`` extra.
"""
