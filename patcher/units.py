"""Byte sizes and counts for people: ``5GB``/``2GiB`` read (``parse_shard_size``), bytes and
counts written (``human_bytes``, ``human_count``), and a count with its noun in the right
number (``plural``: ``1 file``, ``2 files``).

The standard library only: every package may import it (the CLI's renderings, the executors'
warnings, the hub client's summaries, recipe validation)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_shard_size(value: str | int) -> int:
    """Bytes from ``5GB`` (decimal units, as transformers reads them), ``2GiB`` (binary units) or
    an integer byte count. Raises ``ValueError`` with a sentence that can be shown as is."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"max_shard_size must be a size such as 5GB or 2GiB; got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        m = _SIZE_RE.fullmatch(value)
        unit = m.group(2).upper() if m else None
        if m is None or unit not in SIZE_UNITS:
            raise ValueError(f"max_shard_size {value!r} is not a size such as 5GB, 500MB or 2GiB "
                             f"(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
        try:
            size = int(Decimal(m.group(1)) * SIZE_UNITS[unit])
        except InvalidOperation:  # pragma: no cover - the regex admits only decimals
            raise ValueError(f"max_shard_size {value!r} is not a number") from None
    if size <= 0:
        raise ValueError(f"max_shard_size must be positive; got {value!r}")
    return size


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_count(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


_IRREGULAR = {"was": "were", "is": "are", "has": "have", "does": "do"}


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 file``, ``0 files``, ``2 files``; ``nouns`` where adding "s" is wrong
    (``plural(n, "patch", "patches")``)."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {nouns or _IRREGULAR.get(noun) or noun + 's'}"
