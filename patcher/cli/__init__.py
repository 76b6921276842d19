"""The command line (``modelpatch``): the click commands (``commands``; the hub commands in
``hub_commands``, ``recipes`` in ``recipe_commands``), the global options and exit codes,
error reports, human renderings and progress meters.

``main``, the console script's entry point and ``python -m patcher.cli``, is loaded on first use,
so that a library path importing ``render`` does not import the commands.

May import every other package; nothing else in ``patcher`` imports it (byte sizes for people are
in ``patcher.units``)."""

from __future__ import annotations

from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from .commands import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
