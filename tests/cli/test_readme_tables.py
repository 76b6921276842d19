"""The README's command table against the command line's own definitions: every command and
option a row names exists, and every command and option of the command line is in its row
(the global ``--debug``, ``-q`` and ``--help`` aside, and ``--json`` where it only shapes
errors)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from patcher.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
GLOBAL = {"--debug", "-q", "--quiet", "-h", "--help"}
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def commands(group: click.Group = main, path=()) -> dict[str, click.Command]:
    found = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(commands(command, (*path, name)))
        else:
            found[" ".join((*path, name))] = command
    return found


def readme_rows() -> dict[str, set[str]]:
    """Command name -> the options its rows of the "Commands" table name (``apply RECIPE``
    and ``apply PLAN.json`` are two rows of one command)."""
    text = README.read_text()
    table = text[text.index("## Commands"):]
    table = table[:table.index("\n## ")]
    rows: dict[str, set[str]] = {}
    known = commands()
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split(" | ")[0][2:]
        for usage in re.findall(r"`([^`]+)`", cell):
            words = usage.replace("\\|", "|").split()
            name = " ".join(words[:2]) if " ".join(words[:2]) in known else words[0]
            rows.setdefault(name, set()).update(OPTION.findall(usage[len(name):]))
    return rows


def cli_options(command: click.Command) -> set[frozenset[str]]:
    """Each option as the set of its spellings; the shared ``--json`` only where the command
    gives it a result of its own (an exposed parameter)."""
    return {frozenset(p.opts + p.secondary_opts) for p in command.params
            if isinstance(p, click.Option) and not set(p.opts) & GLOBAL
            and (p.name != "as_json" or p.expose_value)}


def test_the_table_lists_every_command_and_no_other():
    assert sorted(readme_rows()) == sorted(commands())


def test_every_option_of_a_row_exists_and_every_option_is_in_its_row():
    rows, known = readme_rows(), commands()
    for name, listed in rows.items():
        options = cli_options(known[name])
        spelled = set().union(*options) if options else set()
        assert listed <= spelled, (name, "not options of the command", listed - spelled)
        missing = sorted("/".join(sorted(o)) for o in options if not o & listed)
        assert missing == [], (name, "options the README row leaves out")
