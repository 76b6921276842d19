"""The one way the command line writes text: every line passes ``patcher.display.printable``.

A tensor name, an architecture, a GGUF key, a recipe's message or a rule's evidence may hold
ESC, OSC or CSI sequences; written raw they would set the clipboard (OSC 52), plant links
(OSC 8) or clear the screen, and click strips only CSI styles, only when not on a terminal.
So ``echo`` escapes every C0/C1 control and DEL (keeping our own newlines and tabs), log
records by ``EscapingFormatter``, and ``--json`` output is
``json.dumps`` with ``ensure_ascii`` (every control, C1 included, becomes ``\\uXXXX``: the
document stays valid JSON and is never escaped twice). ``tests/cli/test_escaped_output.py``
fails when a module writes to a terminal any other way.
"""

from __future__ import annotations

import json
import logging

import click

from .. import interrupts
from ..display import printable


def echo(text: object = "", *, err: bool = False, nl: bool = True) -> None:
    """``text`` on stdout (stderr with ``err``), every control character escaped but the line
    breaks and tabs of our own layout. Stdout holds results only, written once the work is
    done: from the first result on, a Ctrl-C is ignored (``interrupts.finish``), so a result
    is printed whole and its command exits 0."""
    if not err:
        interrupts.finish()
    click.echo(printable(text, keep_lines=True), err=err, nl=nl)


def echo_json(data) -> None:
    """A ``--json`` document on stdout: ASCII only, each control as a JSON ``\\uXXXX`` escape."""
    interrupts.finish()
    click.echo(json.dumps(data, indent=2, ensure_ascii=True))


class EscapingFormatter(logging.Formatter):
    """Log lines with every control character escaped, newlines too (a record is one line; a
    traceback under it keeps its lines). A formatter, not a filter: tqdm's
    ``logging_redirect_tqdm`` carries a handler's formatter over to its own handler, not its
    filters."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), keep_lines=True)


def escape_log_lines(fmt: str) -> None:
    """Give the root logger's plain stream handlers (``logging.basicConfig``'s) an
    ``EscapingFormatter`` with ``fmt``."""
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler and not isinstance(handler.formatter,
                                                                      EscapingFormatter):
            handler.setFormatter(EscapingFormatter(fmt))
