"""Bearer tokens of the embedded hub, read from ``ROOT/tokens.json``.

Format::

    {
      "tokens": {
        "hf_alice_secret": {"user": "alice", "write": true, "orgs": ["team"]},
        "sha256:9f86d081884c7d65...": {"user": "ci", "write": false}
      }
    }

- A key is the token itself, or ``sha256:`` + the hex sha256 of the token (so the file need not
  hold the secret). A hashed key is never a token itself: only a secret whose sha256 it is
  authenticates against it. Every comparison takes constant time (``hmac.compare_digest``).
- ``user`` (required) is the name ``whoami`` returns and the user's own namespace.
- ``write`` (default false): the token may create repos, commit, upload and manage branches.
- ``orgs`` (default []): further namespaces the token acts in; ``"*"`` means every namespace.

A token reads the private repos of its namespaces and writes (if ``write``) in them; public repos
are readable by anyone. A request with an unknown token is refused (401), as the Hub does.
The file is re-read when it changes, so tokens can be added without a restart; an unreadable or
malformed file denies every token until it is fixed (and fails ``create_app`` at start-up).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError

log = logging.getLogger("modelpatch.hub")

_USER = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
HASHED_PREFIX = "sha256:"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Identity:
    user: str
    write: bool = False
    orgs: tuple[str, ...] = ()

    def owns(self, namespace: str) -> bool:
        return namespace == self.user or namespace in self.orgs or "*" in self.orgs


def parse_tokens(data: bytes, where: Path) -> dict[str, Identity]:
    """Parse a tokens file; raises InputError naming the bad entry."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"invalid JSON: {exc}", where=where) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), dict):
        raise InputError('expected {"tokens": {"<token>": {"user": ...}}}', where=where)
    table: dict[str, Identity] = {}
    for n, (token, entry) in enumerate(doc["tokens"].items(), 1):
        what = f"token #{n}"  # never the token itself: messages end up in logs
        if not token or not isinstance(entry, dict):
            raise InputError(f"{what}: expected a non-empty token mapped to an object", where=where)
        if token.startswith(HASHED_PREFIX) and not _SHA256_HEX.fullmatch(
                token[len(HASHED_PREFIX):]):
            raise InputError(f"{what}: a 'sha256:' key needs 64 lowercase hex digits", where=where)
        user, write, orgs = entry.get("user"), entry.get("write", False), entry.get("orgs", [])
        if not isinstance(user, str) or not _USER.fullmatch(user):
            raise InputError(f"{what}: 'user' must be a valid user name", where=where)
        if not isinstance(write, bool):
            raise InputError(f"{what}: 'write' must be true or false", where=where)
        if not isinstance(orgs, list) or not all(isinstance(o, str) and o for o in orgs):
            raise InputError(f"{what}: 'orgs' must be a list of names", where=where)
        table[token] = Identity(user=user, write=write, orgs=tuple(orgs))
    return table


class TokenTable:
    """Looks up bearer tokens in ``path``, re-reading the file when it changes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._table: dict[str, Identity] = {}
        self._load(strict=True)

    def _load(self, strict: bool) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._table = None, {}
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        try:
            table = parse_tokens(self.path.read_bytes(), self.path)
        except (InputError, OSError) as exc:
            if strict:
                raise
            log.error("%s; every token is refused until it is fixed", exc)
            table = {}
        if st.st_mode & 0o077:
            log.warning("%s is readable by other users; chmod 600 it", self.path)
        self._stamp, self._table = stamp, table

    def lookup(self, token: str) -> Identity | None:
        """The identity ``token`` authenticates as: a plain key equal to it, or a hashed key
        holding its sha256. A hashed key sent verbatim matches nothing. Every key is compared,
        each in constant time, so the answer's timing says nothing about the keys."""
        with self._lock:
            self._load(strict=False)
            table = self._table
        secret = token.encode("utf-8", "surrogatepass")
        hashed = (HASHED_PREFIX + hashlib.sha256(secret).hexdigest()).encode()
        found = None
        for key, identity in table.items():
            candidate = hashed if key.startswith(HASHED_PREFIX) else secret
            if hmac.compare_digest(candidate, key.encode("utf-8", "surrogatepass")) \
                    and found is None:
                found = identity
        return found

    def __len__(self) -> int:
        return len(self._table)
