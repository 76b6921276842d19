"""How the command line reports an error: plain lines on stderr, and under ``--json`` also one
``{"error": {...}}`` object on stdout.

Without ``--debug``: the first problem, the first did-you-mean among the others when the first
has none (a misspelled key usually shows up as "needs 'value'" first), and a count of the rest.
``--debug``: every problem. ``--debug --debug`` or ``MODELPATCH_TRACEBACK=1``: the traceback too.

The library words its messages in terms of its Python API (``force=True``); ``as_flags`` rewrites
those to the command-line flags (``--force``), in errors and in log lines alike.
"""

from __future__ import annotations

import logging
import os
import re
import traceback
from dataclasses import dataclass, field

import click

from ..display import printable
from ..errors import PatchError
from .output import echo, echo_json

# library parameter -> command-line flag; a value other than True follows the flag
PARAMETER_FLAGS = {"force": "--force", "force_copy": "--copy", "all_patches": "--all",
                   "device": "--device", "endpoint": "--endpoint", "jobs": "--jobs",
                   "max_shard_size": "--max-shard-size", "allow_noop": "--allow-noop",
                   "port": "--port", "host": "--host", "ignore_changes": "--ignore-changes",
                   "base": "--base"}
_PARAMETER = re.compile(r"\b(%s)=('?)([^'\s,;)]*)\2" % "|".join(PARAMETER_FLAGS))
_FUNCTION_WORDS = {"apply_in_place()": "--in-place", "verify()": "`modelpatch verify`"}


def as_flags(text: str) -> str:
    """``force=True`` -> ``--force``, ``device='cpu'`` -> ``--device cpu``, ``apply_in_place()``
    -> ``--in-place``, ``verify()`` -> ``modelpatch verify``: a library message as a
    command-line user reads it."""
    def flag(m: re.Match) -> str:
        name, value = PARAMETER_FLAGS[m.group(1)], m.group(3)
        return name if value in ("True", "") else f"{name} {value}"

    for function, words in _FUNCTION_WORDS.items():
        text = text.replace(function, words)
    return _PARAMETER.sub(flag, text)


class FlagWording(logging.Filter):
    """A handler filter that rewrites library parameters in log lines to flags."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        flagged = as_flags(message)
        if flagged != message:
            record.msg, record.args = flagged, None
        return True


@dataclass
class ErrorReport:
    """One error as the command line shows it."""

    type: str
    message: str
    exit_code: int
    where: str | None = None
    hint: str | None = None
    tensor: str | None = None
    problems: list[str] = field(default_factory=list)   # every problem, for a recipe

    def as_json(self) -> dict:
        return {"error": {"type": self.type, "message": self.message, "where": self.where,
                          "hint": self.hint, "exit_code": self.exit_code,
                          "tensor": self.tensor, "problems": self.problems}}

    def first_line(self) -> str:
        parts = [f"{self.where}: " if self.where else "",
                 f"tensor {self.tensor!r}: " if self.tensor else "", self.message,
                 f" ({self.hint})" if self.hint else ""]
        return "".join(parts).replace("\n", " ")


def describe(exc: BaseException, exit_code: int | None = None) -> ErrorReport:
    """The ``ErrorReport`` of a ``PatchError``, an ``OSError`` or a click usage error."""
    if isinstance(exc, PatchError):
        problems = [as_flags(p) for p in getattr(exc, "errors", None) or []]
        message = exc.message
        if len(problems) > 1:      # the library counts the rest in its message; so do we, below
            message = re.sub(r" \(and \d+ more\)$", "", message)
        return ErrorReport(type(exc).__name__, as_flags(message), exc.exit_code, exc.where,
                           as_flags(exc.hint) if exc.hint else None, exc.tensor, problems)
    if isinstance(exc, OSError):
        return ErrorReport(type(exc).__name__, str(exc.strerror or exc), 3,
                           os.fsdecode(exc.filename) if exc.filename else None)
    if isinstance(exc, click.ClickException):
        return ErrorReport(type(exc).__name__, getattr(exc, "one_line", None)
                           or exc.format_message(), exc.exit_code,
                           hint=getattr(exc, "hint", None))
    return ErrorReport(type(exc).__name__, str(exc) or "interrupted", exit_code or 1)


def text_lines(report: ErrorReport, debug: int) -> list[str]:
    """The stderr lines: every problem under ``--debug``, else the first, the first
    did-you-mean after it, and how many more there are."""
    if len(report.problems) <= 1:
        return [f"modelpatch: error: {report.first_line()}"]
    if debug:
        return [f"modelpatch: error: {p}" for p in report.problems]
    shown = report.problems[:1]
    if "did you mean" not in shown[0]:
        shown += [p for p in report.problems[1:] if "did you mean" in p][:1]
    rest = len(report.problems) - len(shown)
    if rest:            # on the last line: one problem stays one line
        shown[-1] += f" (and {rest} more; --debug lists them all)"
    return [f"modelpatch: error: {p}" for p in shown]


def wants_traceback(debug: int) -> bool:
    return debug >= 2 or os.environ.get("MODELPATCH_TRACEBACK", "") not in ("", "0")


def emit(exc: BaseException, obj: dict | None, *, text: bool = True,
         exit_code: int | None = None) -> ErrorReport:
    """Print ``exc``: the plain lines on stderr (unless ``text`` is False: click prints its own
    usage errors), the JSON object on stdout under ``--json``, the traceback when asked for."""
    obj = obj or {}
    report = describe(exc, exit_code)
    debug = int(obj.get("debug") or 0)
    if wants_traceback(debug):
        echo("".join(traceback.format_exception(exc)).rstrip("\n"), err=True)
    if text:
        for line in text_lines(report, debug):
            echo(printable(line), err=True)
    if obj.get("json"):
        echo_json(report.as_json())
    return report
