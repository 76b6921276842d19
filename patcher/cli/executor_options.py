"""``--executor`` and ``--ray-address``, shared by ``apply``, ``verify`` and ``revert -o``."""

from __future__ import annotations

import click


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
