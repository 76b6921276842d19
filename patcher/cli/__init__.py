"""The command line (``modelpatch``): the click commands (``commands``; the hub commands in
``hub_commands``, ``recipes`` in ``recipe_commands``), the global options and exit codes,
error reports, human renderings and progress meters.

``main``, the console script's entry point and ``python -m patcher.cli``, is loaded on first use,
so that a library path importing ``render`` does not import the commands.

May import every other package; nothing else in ``patcher`` imports it (byte sizes for people are
in ``patcher.units``)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name == "main":
        if _run_as_program():
            from .. import interrupts

            interrupts.install()        # before the imports: a Ctrl-C there waits for them
        from .commands import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _run_as_program() -> bool:
    """Whether this process is the ``modelpatch`` console script (not a program importing us)."""
    script = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    return script.replace("\\", "/").rsplit("/", 1)[-1] in ("modelpatch", "modelpatch.exe")
