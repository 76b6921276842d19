"""``python -m patcher.cli``: the ``modelpatch`` command."""

from .commands import main

main()
