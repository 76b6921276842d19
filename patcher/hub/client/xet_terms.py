"""A file's Xet reconstruction as a hub answers it (hub-docs ``docs/xet/download-protocol.md``),
read as untrusted input: ``terms`` (a xorb hash, a chunk range ``[start, end)``, the range's
unpacked length), in file order, and ``fetch_info`` (per xorb, a URL and the inclusive byte
range to ask it for, covering a chunk range).

Every value is checked before anything is fetched or written: hashes are 64 lowercase hex
digits, ranges are non-empty and in order, a term's length is what its chunks can hold and the
terms' lengths add up to the file's size, every term has a fetch entry covering it, URLs are
http(s) without control characters, and a byte range is no longer than its chunks can be
serialized in. The number of terms is budgeted (``MODELPATCH_XET_MAX_TERMS``) and so, by the
listing budget, is the answer's size. A refusal is one ``HubError`` line naming the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from ...errors import HubError, InputError

MAX_TERMS_ENV = "MODELPATCH_XET_MAX_TERMS"
#: The most terms one file's reconstruction may have. A term is at least one chunk (8 KiB but
#: for a file's last): a 1 TB file is at most some 130 million chunks, but a reconstruction from
#: a real hub has one term per run of chunks in one xorb, a few per 64 MiB.
DEFAULT_MAX_TERMS = 1_000_000
MAX_CHUNK_SIZE = 128 * 1024            # hub-docs chunking.md: a chunk is at most 128 KiB
CHUNK_HEADER_SIZE = 8                  # xorb.md: version, sizes and compression scheme
#: What one chunk may take serialized: its header, and LZ4's worst case over 128 KiB.
MAX_SERIALIZED_CHUNK = CHUNK_HEADER_SIZE + MAX_CHUNK_SIZE + MAX_CHUNK_SIZE // 255 + 64
_HASH = re.compile(r"[0-9a-f]{64}")
_URL_OK = re.compile(r"[\x21-\x7e]+")


@dataclass(frozen=True)
class Term:
    xorb: str
    start: int
    end: int                 # exclusive
    length: int              # unpacked bytes of chunks [start, end)


@dataclass(frozen=True)
class Fetch:
    xorb: str
    start: int
    end: int                 # exclusive chunk index
    url: str
    first: int               # inclusive byte range of the xorb to ask for
    last: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Reconstruction:
    terms: tuple[Term, ...]
    fetches: dict[str, tuple[Fetch, ...]]

    def fetch_for(self, term: Term) -> Fetch:
        for fetch in self.fetches[term.xorb]:
            if fetch.start <= term.start and term.end <= fetch.end:
                return fetch
        raise ValueError("a checked reconstruction has a fetch entry for every term")


def max_terms() -> int:
    text = os.environ.get(MAX_TERMS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_TERMS
    if not text.isdigit() or int(text) <= 0:
        raise InputError(f"{MAX_TERMS_ENV}={text!r} is not a positive whole number")
    return int(text)


def parse_reconstruction(data, size: int, what: str) -> Reconstruction:
    """The reconstruction of a ``size``-byte file (``what`` names it in errors), checked."""
    def bad(why: str):
        return HubError(f"the hub's Xet reconstruction of {what} is refused: {why}",
                        hint="the hub's answer is malformed or its storage corrupted")

    if not isinstance(data, dict):
        raise bad("not a JSON object")
    if data.get("offset_into_first_range", 0) != 0:
        raise bad("a whole file's reconstruction starts at offset 0")
    terms_in, fetch_in = data.get("terms"), data.get("fetch_info")
    if not isinstance(terms_in, list) or not isinstance(fetch_in, dict):
        raise bad("'terms' must be a list and 'fetch_info' an object")
    budget = max_terms()
    if len(terms_in) > budget:
        raise HubError(f"the hub's Xet reconstruction of {what} has {len(terms_in)} terms, more "
                       f"than the budget of {budget}", hint=f"raise it with {MAX_TERMS_ENV}=N")
    terms = tuple(_term(t, bad) for t in terms_in)
    total = sum(t.length for t in terms)
    if total != size:
        raise bad(f"its terms hold {total} bytes, the file has {size}")
    needed = {t.xorb for t in terms}
    fetches: dict[str, tuple[Fetch, ...]] = {}
    for xorb, entries in fetch_in.items():
        if xorb not in needed:
            continue                        # nothing of it is fetched
        if not isinstance(xorb, str) or not _HASH.fullmatch(xorb) or not isinstance(entries, list) \
                or not entries or len(entries) > budget:
            raise bad("a fetch_info entry is not a xorb hash with a list of ranges")
        fetches[xorb] = tuple(_fetch(xorb, e, bad) for e in entries)
    recon = Reconstruction(terms, fetches)
    for term in terms:
        if not any(f.start <= term.start and term.end <= f.end for f in fetches.get(term.xorb, ())):
            raise bad(f"no fetch_info covers chunks {term.start}..{term.end} of xorb "
                      f"{term.xorb[:12]}")
    return recon


def _term(value, bad) -> Term:
    if not isinstance(value, dict):
        raise bad("a term is not an object")
    xorb, length = value.get("hash"), value.get("unpacked_length")
    start, end = _range(value.get("range"), bad)
    if not isinstance(xorb, str) or not _HASH.fullmatch(xorb):
        raise bad("a term's xorb hash is not 64 lowercase hex digits")
    if not _whole(length) or not 0 < length <= (end - start) * MAX_CHUNK_SIZE:
        raise bad(f"a term of {end - start} chunks cannot unpack to {length!r} bytes")
    return Term(xorb, start, end, length)


def _fetch(xorb: str, value, bad) -> Fetch:
    if not isinstance(value, dict):
        raise bad("a fetch_info range is not an object")
    start, end = _range(value.get("range"), bad)
    url, byte_range = value.get("url"), value.get("url_range")
    if not isinstance(url, str) or not _URL_OK.fullmatch(url) \
            or urlsplit(url).scheme.lower() not in ("http", "https") \
            or ".." in urlsplit(url).path.split("/"):
        raise bad("a fetch URL is not an http(s) URL without control characters or '..'")
    if not isinstance(byte_range, dict):
        raise bad("a fetch_info range has no url_range")
    first, last = byte_range.get("start"), byte_range.get("end")
    if not (_whole(first) and _whole(last) and first <= last):
        raise bad("a url_range is not two whole numbers in order")
    if last - first + 1 > (end - start) * MAX_SERIALIZED_CHUNK:
        raise bad(f"a url_range of {last - first + 1} bytes is longer than {end - start} "
                  f"chunks can be")
    return Fetch(xorb, start, end, url, first, last)


def _range(value, bad) -> tuple[int, int]:
    if not isinstance(value, dict):
        raise bad("a chunk range is not an object")
    start, end = value.get("start"), value.get("end")
    if not (_whole(start) and _whole(end) and start < end):
        raise bad("a chunk range is not two whole numbers, start < end")
    return start, end


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_hash(value) -> bool:
    """A Xet hash in its string form: 64 lowercase hex digits."""
    return isinstance(value, str) and bool(_HASH.fullmatch(value))
