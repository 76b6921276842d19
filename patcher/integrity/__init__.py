"""What makes a variant verifiable and revertible: ``digests/`` (hashing, also while writing, the
digest cache, source digests), the provenance manifest, its rules and its change log grouped per
rule (``change_log``), the patch records under ``.modelpatch/``, ``verify``, and shared-inode
detection.

May import what its row of docs/architecture.md §4 says (tests/test_architecture.py holds it
there): ``config``, ``model`` and ``names``; never ``tensors``, ``plan`` or
``execute``."""
