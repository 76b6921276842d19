"""File reconstructions as the CAS API answers them (hub-docs ``docs/xet/api.md``,
``download-protocol.md``): the terms covering a byte range of a file, and for each xorb the
byte ranges to fetch, each behind a URL signed for that range only (``/cas/xorbs/{hash}``).

Pure functions over a file record and the xorbs' chunk indexes; the routes are ``routes_cas.py``.
"""

from __future__ import annotations

import time
from typing import Any

from ...errors import XetFormatError
from ..request_errors import HubRequestError, RangeNotSatisfiable
from ..store.xet_store import XetStore
from ..xet.xorb import ChunkRecord
from .web import Hub

FETCH_URL_TTL_S = 3600


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``bytes=a-b`` or ``bytes=a-`` as an inclusive ``(a, b)`` clamped to the file; None for no
    header. One range only; its start must lie inside the file (416 otherwise)."""
    if header is None:
        return None
    unit, _, spec = header.strip().partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip().lower() != "bytes" or not dash or not first.isdigit() \
            or not (last.isdigit() or last == "") or "," in spec:
        raise RangeNotSatisfiable(f"unsupported Range {header[:80]!r}: one 'bytes=a-b' range")
    start = int(first)
    end = size - 1 if last == "" else min(int(last), size - 1)
    if start >= size or end < start:
        raise RangeNotSatisfiable(f"range start {start} is past the file's {size} bytes")
    return start, end


def _covering(records: list[ChunkRecord], lo: int, hi: int, base: int,
              want: tuple[int, int]) -> tuple[int, int, int, int]:
    """Of chunks ``[lo, hi)`` starting at file offset ``base``: the sub-range covering the file
    bytes ``want`` (inclusive), its size and the offset of its first byte in the file."""
    pos, first, last, first_at = base, None, hi, base
    for i in range(lo, hi):
        end = pos + records[i].size
        if first is None and end > want[0]:
            first, first_at = i, pos
        if end > want[1]:
            last = i + 1
            break
        pos = end
    if first is None:
        raise XetFormatError("a term ends before the range it was chosen for")
    return first, last, sum(r.size for r in records[first:last]), first_at


def plan_terms(xet: XetStore, record: dict[str, Any],
               want: tuple[int, int] | None) -> tuple[int, list[tuple[str, int, int, int]]]:
    """``(offset_into_first_range, [(xorb, chunk start, chunk end, size), ...])`` for the file
    bytes ``want`` (inclusive; None for all)."""
    if want is None:
        return 0, [tuple(t) for t in record["terms"]]
    out, pos, offset = [], 0, 0
    for xorb_hex, start, end, size in record["terms"]:
        if pos + size > want[0] and pos <= want[1]:
            records = xet.xorb_chunks(xorb_hex)
            first, last, sub_size, first_at = _covering(records, start, end, pos, want)
            if not out:
                offset = want[0] - first_at
            out.append((xorb_hex, first, last, sub_size))
        pos += size
        if pos > want[1]:
            break
    return offset, out


def _fetch_ranges(terms: list[tuple[str, int, int, int]]) -> dict[str, list[tuple[int, int]]]:
    """Per xorb, the merged chunk ranges the terms need."""
    wanted: dict[str, list[tuple[int, int]]] = {}
    for xorb_hex, start, end, _ in terms:
        wanted.setdefault(xorb_hex, []).append((start, end))
    merged: dict[str, list[tuple[int, int]]] = {}
    for xorb_hex, ranges in wanted.items():
        out: list[tuple[int, int]] = []
        for start, end in sorted(ranges):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[xorb_hex] = out
    return merged


def fetch_url(hub: Hub, cas: str, xorb_hex: str, first: int, last: int) -> str:
    """A URL for bytes ``first..last`` (inclusive) of a xorb, signed for that range only."""
    expires = str(int(time.time()) + FETCH_URL_TTL_S)
    rng = f"{first}-{last}"
    sig = hub.signer.sign("xorb", xorb_hex, rng, expires)
    return f"{cas}/xorbs/{xorb_hex}?r={rng}&e={expires}&s={sig}"


def reconstruction(hub: Hub, cas: str, record: dict[str, Any], want: tuple[int, int] | None,
                   version: int) -> dict[str, Any]:
    """The ``QueryReconstructionResponse`` (v1: ``fetch_info``, v2: ``xorbs``)."""
    xet = hub.store.xet
    try:
        offset, terms = plan_terms(xet, record, want)
        fetches: dict[str, list[dict[str, Any]]] = {}
        for xorb_hex, ranges in _fetch_ranges(terms).items():
            records = xet.xorb_chunks(xorb_hex)
            for start, end in ranges:
                first, last = records[start].offset, records[end - 1].end - 1
                url = fetch_url(hub, cas, xorb_hex, first, last)
                chunks = {"start": start, "end": end}
                if version == 1:
                    entry = {"range": chunks, "url": url,
                             "url_range": {"start": first, "end": last}}
                else:
                    entry = {"url": url, "ranges": [{"chunks": chunks,
                                                     "bytes": {"start": first, "end": last}}]}
                fetches.setdefault(xorb_hex, []).append(entry)
    except (XetFormatError, IndexError):
        raise HubRequestError("a xorb of this file is missing from the store", status=500) \
            from None
    out: dict[str, Any] = {
        "offset_into_first_range": offset,
        "terms": [{"hash": x, "unpacked_length": size, "range": {"start": s, "end": e}}
                  for x, s, e, size in terms],
    }
    out["fetch_info" if version == 1 else "xorbs"] = fetches
    return out
