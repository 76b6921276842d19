"""Text from a model, a recipe, a rule file or a hub, made safe to show.

Every string that did not come from modelpatch itself passes ``printable`` before it reaches a
terminal, a log line or a model card: C0 and C1 control characters and DEL are written as
``\\xNN`` (``\\n`` and ``\\t`` too, unless the caller keeps line structure), so an ESC, OSC or
CSI sequence in a tensor name can never move the cursor, set the clipboard or plant a link.
Lone surrogates (from ``surrogateescape`` or JSON ``\\udXXX``) are written as ``\\udXXX``.
"""

from __future__ import annotations

import re

_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROLS_KEEP_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object, *, keep_lines: bool = False) -> str:
    """``str(text)`` with every control character (and lone surrogate) escaped; with
    ``keep_lines`` newlines and tabs stay as they are (multi-line output of our own layout)."""
    pattern = _CONTROLS_KEEP_LINES if keep_lines else _CONTROLS
    return pattern.sub(_escaped, str(text))


def printable_fields(data):
    """A copy of JSON-like ``data`` (a report as ``--json`` gives it) with every string, keys
    included, passed through ``printable``: what a renderer lays out on lines of its own then
    holds no newline or control character that came from outside."""
    if isinstance(data, str):
        return printable(data)
    if isinstance(data, dict):
        return {printable(k) if isinstance(k, str) else k: printable_fields(v)
                for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [printable_fields(v) for v in data]
    return data
