"""The options several commands share, each written once: ``-o/--output``, ``--force``,
``--link``/``--copy``, ``--json`` and ``--endpoint`` have the same spelling, parameter name, type,
default and meaning on every command that takes them. A command may say in its help what the
option is for there (where its output goes); never what it means.

- ``-o/--output OUT``: the directory the command creates; it must not exist, unless ``--force``.
- ``--force``: replace an existing OUT that modelpatch wrote earlier, never anything else.
- ``--link MODE`` / ``--copy``: how the base's unchanged files are carried into OUT.
- ``--json``: the result as one JSON document on stdout (errors too, as ``{"error": {...}}``).
- ``--endpoint URL``: the hub, for ``hf://`` models and the hub commands.
- ``-j/--jobs N``: how many workers (parameter ``jobs``; default: the command's own choice).
"""

from __future__ import annotations

import click

LINK_MODES = ("auto", "reflink", "hardlink", "copy")

FORCE_HELP = ("Replace an existing output that modelpatch wrote earlier (never a directory it "
              "did not write).")
JSON_RESULT_HELP = "Machine-readable result on stdout (errors too, as {\"error\": {...}})."
ENDPOINT_HELP = ("Hub URL for hf://ORG/NAME[@REV] (default: huggingface.co, or "
                 "$HF_ENDPOINT).")
LINK_HELP = ("How to carry the base's unchanged files: reflink, else hardlink (the variant's "
             "file IS the base's), else copy (auto, the default); reflink or hardlink fail "
             "rather than fall back; copy gives independent files.")
COPY_HELP = "Same as --link copy."
HASHING_JOBS_HELP = "Parallel hashing workers (default: all cores)."


def output_option(help: str):
    """``-o/--output OUT`` (parameter ``out``); ``help`` says where the command writes."""
    return click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
                        metavar="OUT", help=help)


def force_option(help: str = FORCE_HELP):
    return click.option("--force", is_flag=True, help=help)


def json_option(help: str = JSON_RESULT_HELP):
    """``--json`` (parameter ``as_json``): also set by the group's ``--json``
    (``group.add_shared_options``)."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def endpoint_option(help: str = ENDPOINT_HELP):
    return click.option("--endpoint", default=None, envvar="HF_ENDPOINT", metavar="URL",
                        help=help)


def jobs_option(help: str = HASHING_JOBS_HELP):
    return click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help=help)


def link_options(command):
    """``--link MODE`` and ``--copy`` (parameters ``link`` and ``force_copy``); ``link_mode``
    makes them one mode."""
    command = click.option("--copy", "force_copy", is_flag=True, help=COPY_HELP)(command)
    return click.option("--link", "link", type=click.Choice(LINK_MODES), default=None,
                        help=LINK_HELP)(command)


def link_mode(link: str | None, force_copy: bool) -> str:
    """The one link mode ``--link`` and ``--copy`` give (``auto`` when neither)."""
    if force_copy and link not in (None, "copy"):
        raise click.UsageError(f"--copy is --link copy; it excludes --link {link}")
    return "copy" if force_copy else link or "auto"
