"""gguf-py (the ``gguf`` package), loaded for the GGUF code and the recipe's ``gguf:`` checks:
``require_gguf`` (the whole package) or ``gguf_constants`` (its constants alone). Below both
``patcher.gguf`` and ``patcher.recipe``; it imports only ``errors``."""

from __future__ import annotations

import sys

from .errors import InputError

INSTALL_HINT = "pip install -e '.[gguf]'"


def require_gguf(where: str | None = None):
    """The ``gguf`` module, or an InputError whose one line says how to install it."""
    try:
        import gguf
    except ImportError:
        raise InputError("GGUF support needs the gguf package (gguf-py)", where=where,
                         hint=INSTALL_HINT) from None
    if not hasattr(gguf, "constants"):      # loaded alone first (gguf_constants)
        gguf.constants = sys.modules["gguf.constants"]
    return gguf


def gguf_constants(where: str | None = None):
    """gguf-py's ``gguf.constants`` (value types, ggml types and their block sizes, key names),
    or the InputError of ``require_gguf``. Where the package is not imported yet, the module is
    loaded from its file alone: the package's ``__init__`` imports numpy and every reader and
    writer (a quarter of a second and more), which reading or rewriting a header in place never
    needs. The module is registered as ``gguf.constants``, so a later ``import gguf`` uses it:
    one set of enums in the process. It imports only the standard library."""
    loaded = sys.modules.get("gguf.constants")
    if loaded is not None and sys.modules.get("gguf", loaded) is not None:
        return loaded                   # (a ``gguf`` of None in sys.modules: not importable)
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("gguf")     # the package is located, not imported
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / "constants.py" if locations else None
    if path is None or not path.is_file():
        return require_gguf(where).constants
    module_spec = importlib.util.spec_from_file_location("gguf.constants", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["gguf.constants"] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["gguf.constants"]
        raise
    return module
