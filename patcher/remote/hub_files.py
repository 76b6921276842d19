"""The files of one hub repository at one commit, read by HTTP Range requests.

``HubFiles`` resolves ``hf://org/name[@rev]`` to a commit once (file names and sizes come with
it, in the same answer), so every later read is of that very commit. ``read(path, start, end)``
fetches bytes ``start..end-1`` with a ``Range`` request and refuses an answer that is not
exactly that range: a hub that ignores ``Range`` would otherwise send the whole shard. Every
byte of every response body is counted in ``transfer``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..errors import HubError, InputError
from ..model_ref import ModelRef


@dataclass
class Transfer:
    """What crossed the network: HTTP requests made (the repository listing included) and the
    file bytes received (the listing's own JSON is not counted)."""

    requests: int = 0
    bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes += nbytes


def parse_hf_url(text: str) -> tuple[str, str | None]:
    """(repo id, revision or None) of ``hf://ORG/NAME[@REVISION]`` (``patcher.model_ref``); an
    ``InputError`` else."""
    ref = ModelRef.parse(text)
    if not ref.is_hub:
        raise InputError(f"{text!r} is not hf://ORG/NAME[@REVISION]")
    return ref.repo_id, ref.revision        # type: ignore[return-value]


class HubFiles:
    """Names, sizes and ranged reads of the files of ``repo_id`` at one commit."""

    def __init__(self, repo_id: str, revision: str | None, endpoint: str | None,
                 what: str = "inspect"):
        from huggingface_hub.utils import build_hf_headers

        from ..hub.client import guard
        from ..hub.client.connection import client, hub_call
        from ..names import checked_digest, checked_name

        api = client(endpoint)
        self.repo_id, self.endpoint, self.what = repo_id, api.endpoint, what
        self.transfer = Transfer()
        # one deadline for the listing and every read after it (``guard``)
        self.deadline = guard.new_deadline()
        with guard.within(self.deadline):
            info = hub_call(what, repo_id, api.model_info, repo_id, revision=revision,
                             files_metadata=True)
        self.transfer.add(0)        # the repository listing (its body is not model bytes)
        self.commit: str = checked_digest(info.sha, what="the listing's commit id",
                                          lengths=(40,))
        self.sizes: dict[str, int] = {}
        for sibling in info.siblings or []:
            name = checked_name(sibling.rfilename, what="the hub's file listing entry",
                                allow_dot_dirs=True)
            if not isinstance(sibling.size, int) or sibling.size < 0:
                raise HubError("the hub lists files without their sizes", where=repo_id)
            self.sizes[name] = sibling.size
        self._headers = build_hf_headers(token=api.token, library_name="modelpatch")

    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``start`` to ``end - 1`` of ``path`` (default: to its end), by one request."""
        from ..hub.client import guard
        from ..hub.client.connection import hub_call

        size = self.sizes[path]
        end = size if end is None else end
        if end <= start:
            return b""
        with guard.within(self.deadline):
            return hub_call(self.what, self.repo_id, self._ranged_get, path, start, end, size)

    def _ranged_get(self, path: str, start: int, end: int, size: int) -> bytes:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import get_session, hf_raise_for_status

        url = hf_hub_url(self.repo_id, path, revision=self.commit, endpoint=self.endpoint)
        headers = {**self._headers, "Range": f"bytes={start}-{end - 1}"}
        with get_session().stream("GET", url, headers=headers, follow_redirects=True) as answer:
            hf_raise_for_status(answer)
            whole = start == 0 and end == size
            if answer.status_code != 206 and not (whole and answer.status_code == 200):
                raise HubError(f"{path}: the hub answered HTTP {answer.status_code} to a Range "
                               f"request (it must serve byte ranges)", where=self.repo_id)
            expected = f"bytes {start}-{end - 1}/{size}"
            if answer.status_code == 206 and answer.headers.get("Content-Range") != expected:
                raise HubError(f"{path}: asked for {expected}, the hub sent Content-Range "
                               f"{answer.headers.get('Content-Range')!r}", where=self.repo_id,
                               hint="the file changed, or the hub's listing is wrong")
            body = bytearray()
            for chunk in answer.iter_bytes():
                body += chunk
                if len(body) > end - start:
                    break
        self.transfer.add(len(body))
        if len(body) != end - start:
            raise HubError(f"{path}: asked for bytes {start}-{end - 1}, received {len(body)} "
                           f"bytes", where=self.repo_id)
        return bytes(body)
