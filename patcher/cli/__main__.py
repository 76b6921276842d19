"""``python -m patcher.cli``: the ``modelpatch`` command."""

from .. import interrupts

interrupts.install()        # before the imports: a Ctrl-C there waits for them

from .commands import main  # noqa: E402

main()
