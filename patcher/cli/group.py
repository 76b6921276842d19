"""The command group behind ``modelpatch``: global options that work before and after the
subcommand, and errors turned into their documented exit codes (rendered by ``error_report``).

``--debug`` (repeatable), ``-q/--quiet`` and ``--json`` are options of the group and of every
subcommand alike (``modelpatch --json plan R M`` and ``modelpatch plan R M --json``); each records
itself in the root context's ``obj``. A subcommand's own ``--json`` keeps its parameter and is
also set by the group's.
"""

from __future__ import annotations

import logging
import sys

import click

from .. import interrupts
from ..errors import PatchError
from .error_report import emit
from .output import echo, echo_json


def _root_obj(ctx: click.Context) -> dict:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = {}
    return root.obj


def set_debug(ctx: click.Context, _param, value: int) -> int:
    if value:
        obj = _root_obj(ctx)
        obj["debug"] = int(obj.get("debug") or 0) + value
    return value


def set_quiet(ctx: click.Context, _param, value: bool) -> bool:
    if value:
        _root_obj(ctx)["quiet"] = True
        logging.getLogger().setLevel(logging.ERROR)
        logging.getLogger("modelpatch").setLevel(logging.ERROR)
    return value


def set_json(ctx: click.Context, _param, value: bool) -> bool:
    if value:
        _root_obj(ctx)["json"] = True
    return value


DEBUG_HELP = ("List every problem of a bad input; twice (or MODELPATCH_TRACEBACK=1) adds the "
              "traceback.")
QUIET_HELP = "No progress bars or informational logs."
JSON_HELP = "Machine-readable output; errors too, as {\"error\": {...}} on stdout."
JSON_ERRORS_HELP = ("Errors as {\"error\": {...}} on stdout (what this command prints otherwise "
                    "is unchanged: it has no result of its own to shape).")


def _shared_options() -> list[click.Option]:
    """The global options a subcommand lacks; its ``--json`` then shapes errors only."""
    return [click.Option(["--debug"], count=True, expose_value=False, callback=set_debug,
                         help=DEBUG_HELP),
            click.Option(["-q", "--quiet"], is_flag=True, expose_value=False,
                         callback=set_quiet, help=QUIET_HELP),
            click.Option(["--json", "as_json"], is_flag=True, expose_value=False,
                         callback=set_json, help=JSON_ERRORS_HELP)]


def _with_group_json(callback):
    """A command callback whose ``as_json`` is also true when the group's ``--json`` is."""
    def invoke(*args, **kwargs):
        if (click.get_current_context().find_root().obj or {}).get("json"):
            kwargs["as_json"] = True
        return callback(*args, **kwargs)

    invoke.__wrapped__ = callback
    return invoke


def add_shared_options(group: click.Group) -> None:
    """Give every subcommand of ``group`` (nested groups included) the options it lacks of
    ``--debug``, ``-q`` and ``--json``; hook the ``--json`` options commands declare themselves."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            add_shared_options(command)
            continue
        taken = {opt for param in command.params for opt in param.opts}
        for option in _shared_options():
            if not taken.intersection(option.opts):
                command.params.append(option)
        for param in command.params:
            if param.name == "as_json" and param.expose_value and param.callback is None:
                param.callback = set_json
                command.callback = _with_group_json(command.callback)


class ModelpatchGroup(click.Group):
    """Turns modelpatch errors into their messages and the documented exit codes, under the
    interrupt policy (``patcher.interrupts``): any error after a Ctrl-C is the interruption."""

    def main(self, args=None, *rest, **kwargs):
        took = interrupts.install()
        try:
            return super().main(args, *rest, **kwargs)
        finally:
            if args is None:            # the program: its result is out, it only exits now
                interrupts.finish()
            elif took:                  # called with arguments (a test, a program): hand back
                interrupts.restore()

    def make_context(self, *args, **kwargs) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:   # a Ctrl-C during start-up, raised once the imports ended
            echo("modelpatch: interrupted", err=True)
            interrupts.finish()
            raise click.exceptions.Exit(130) from None
        except click.ClickException as exc:     # a bad command line, before any context
            args = args[1] if len(args) > 1 else kwargs.get("args") or []
            _click_error(exc, {"json": True} if "--json" in args else {})

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except KeyboardInterrupt as exc:
            _interrupted(ctx, exc)
        except PatchError as exc:
            if interrupts.interrupted():
                _interrupted(ctx, KeyboardInterrupt())
            ctx.exit(emit(exc, ctx.obj).exit_code)
        except click.ClickException as exc:
            _click_error(exc, ctx.obj)
        except BrokenPipeError:
            # The reader of stdout went away (`modelpatch recipes list | head`): stop quietly,
            # as other command-line tools do.
            sys.stderr.close()
            ctx.exit(141)
        except OSError as exc:
            # An I/O error no layer below turned into an OperationFailed: still one line and
            # exit code 3, never a traceback (the commands leave their directories consistent
            # or journaled whatever raises).
            if interrupts.interrupted():
                _interrupted(ctx, KeyboardInterrupt())
            ctx.exit(emit(exc, ctx.obj).exit_code)
        except Exception:
            if interrupts.interrupted():    # a half-finished step the interrupt broke
                _interrupted(ctx, KeyboardInterrupt())
            raise


# click >= 8.2 raises this (a UsageError) for a group given no command; it prints the help
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _click_error(exc: click.ClickException, obj: dict | None) -> None:
    """A usage error (bad option, missing argument, options that exclude each other) as every
    other error: one ``modelpatch: error:`` line naming the help to read, exit 2. The help a
    group shows when given no command is no error: click prints it."""
    if isinstance(exc, _NO_ARGS_IS_HELP):
        raise exc
    if isinstance(exc, click.UsageError):
        names, ctx = [], exc.ctx        # the subcommands' names; the program's is modelpatch
        while ctx is not None and ctx.parent is not None:
            names.insert(0, ctx.info_name)
            ctx = ctx.parent
        exc.one_line = usage_message(exc.format_message())
        exc.hint = f"see `{' '.join(['modelpatch', *names, '--help'])}`"
    emit(exc, obj)
    raise click.exceptions.Exit(exc.exit_code)


def usage_message(text: str) -> str:
    """click's ``No such option '--bogus'.`` as our messages read: lower case first, one line,
    no final full stop, its ``Did you mean`` after a comma."""
    text = " ".join(text.split()).replace(". Did you mean", ", did you mean")
    if text[:1].isupper() and text[1:2].islower():
        text = text[0].lower() + text[1:]
    return text.removesuffix(".")


def _interrupted(ctx: click.Context, exc: KeyboardInterrupt) -> None:
    """Ctrl-C: 130; SIGTERM/SIGHUP (``KeyboardInterrupt("signal N")``): 128 + N, as a shell
    reports a process that signal ended."""
    interrupts.finish()         # the cleanup is done; a second Ctrl-C changes nothing now
    signum = str(exc).removeprefix("signal ")
    code = 128 + int(signum) if signum.isdigit() else 130
    echo("modelpatch: interrupted", err=True)
    if (ctx.obj or {}).get("json"):
        emit(exc, ctx.obj, text=False, exit_code=code)
    ctx.exit(code)


quiet_option = click.option("-q", "--quiet", is_flag=True, expose_value=False,
                            callback=set_quiet, help=QUIET_HELP)

base_model_option = click.option(
    "--base-model", default=None, metavar="ORG/NAME",
    help="The hub repository the base model is, for the model card's base_model (read from a "
         "Hugging Face cache path or the base's manifest when not given; never guessed).")


def executor_options(command):
    """Add ``--executor local|ray`` and ``--ray-address`` to ``command`` (click decorators)."""
    command = click.option(
        "--ray-address", default=None, metavar="ADDRESS",
        help="With --executor ray: the cluster, auto or ray://HOST:PORT "
             "(default: $RAY_ADDRESS, else auto).")(command)
    return click.option(
        "--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
        help="Where shard rewrites and file hashes run: this machine, or a Ray cluster whose "
             "nodes mount the model and the output at the same paths (the ray extra: "
             "pip install -e '.[ray]').")(command)


def refuse_in_place(in_place: bool, executor: str) -> None:
    if in_place and executor != "local":
        raise click.UsageError(f"--executor {executor} writes a new variant; it excludes "
                               f"--in-place")


def emit_json(data) -> None:
    """A command's ``--json`` result on stdout."""
    echo_json(data)
