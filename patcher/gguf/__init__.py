"""GGUF as a model format: strict reading, recipe ``gguf:`` sections, writing.

gguf-py (the ``gguf`` package, ``pip install -e '.[gguf]'``) supplies the format's constants:
value types, ggml tensor types and their block sizes, key names. The header itself is parsed here
(``patcher.gguf.format``), bounded and strict, for the reasons given there.
"""

from __future__ import annotations

from ..errors import InputError

INSTALL_HINT = "pip install -e '.[gguf]'"


def require_gguf(where: str | None = None):
    """The ``gguf`` module, or an InputError whose one line says how to install it."""
    try:
        import gguf
    except ImportError:
        raise InputError("GGUF support needs the gguf package (gguf-py)", where=where,
                         hint=INSTALL_HINT) from None
    return gguf
