"""Where one command's shard tasks and file hashes run (``patcher.dispatch``): here (``local``),
or on a Ray cluster (``ray``; ray is imported only then)."""

from __future__ import annotations

import contextlib

from ..errors import InputError


def executing(name: str, address: str | None):
    """A context in which ``dispatch`` hands work to the executor ``name``."""
    if name == "ray":
        from .ray_executor import executing_on_ray

        return executing_on_ray(address)
    if name != "local":
        raise InputError(f"unknown executor {name!r}: local or ray")
    if address is not None:
        raise InputError("--ray-address needs --executor ray")
    return contextlib.nullcontext()
