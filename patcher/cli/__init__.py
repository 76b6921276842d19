"""The command line (``modelpatch``): the click commands, the global options and exit codes,
error reports, human renderings and progress meters.

``main``, the console script's entry point and ``python -m patcher.cli``, is loaded on first use,
so that a library path importing ``render`` does not import the commands.

May import every other package; nothing in ``patcher`` imports it except ``render.human_bytes``
and, lazily, the progress meter types."""

from __future__ import annotations

from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from .commands import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
