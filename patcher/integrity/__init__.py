"""What makes a variant verifiable and revertible: ``digests/`` (hashing, also while writing, the
digest cache, source digests), the provenance manifest and its rules, the patch records under
``.modelpatch/``, ``verify``, and shared-inode detection.

May import ``errors``, ``fsops``, ``faults``, ``config``, ``model`` and ``tensors.tasks``; never
``execute`` or ``hub``."""
