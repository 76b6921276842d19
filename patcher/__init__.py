"""modelpatch: declarative, verifiable, reversible patches for model checkpoints."""

__version__ = "0.2.0"
