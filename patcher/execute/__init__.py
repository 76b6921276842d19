"""Carrying out a plan: the out-of-place variant (``engine``), in place with its journal, revert,
output staging, locking, and linking of the base's unchanged files.

May import every package but ``hub``, ``cli`` and ``api``."""
