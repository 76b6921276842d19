"""Run the embedded hub on 127.0.0.1 and point the real huggingface_hub client at it.

Import into a test module (the ``hub`` fixture is found by pytest once imported)::

    from hub_fixtures import hub, running_hub, configure_hf_client  # noqa: F401

    def test_publish(hub, tmp_path):
        api = hub.api("write-alice")          # a real huggingface_hub.HfApi
        api.create_repo("alice/variant")
        ...                                   # or hand hub.endpoint / a token to the CLI

- ``hub``: a fixture; the client is configured (no Xet, not offline, no ambient token or cache)
  and a hub with ``TOKENS`` serves ``tmp_path / "hub"`` for the test.
- ``running_hub(root, tokens)``: the same as a context manager, for other scopes or set-ups.
- ``configure_hf_client(monkeypatch, home)``: only the client configuration.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

# The client reads HF_HUB_DISABLE_XET when huggingface_hub is first imported; set it before.
os.environ["HF_HUB_DISABLE_XET"] = "1"

#: Tokens of the default hub: alice (write and read-only tokens) and bob (write).
TOKENS: dict[str, dict[str, Any]] = {
    "write-alice": {"user": "alice", "write": True, "orgs": ["team"]},
    "read-alice": {"user": "alice", "write": False},
    "write-bob": {"user": "bob", "write": True},
}


@dataclass
class RunningHub:
    endpoint: str
    root: Path
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    traffic: Any = None          # patcher.hub.traffic.Traffic: body bytes either way
    state: Any = None            # the app's state: .hub is the server's Hub (store, signer)

    def api(self, token: str | bool | None = False):
        """A real ``HfApi`` for this hub; ``token=False`` sends no token."""
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=token)


def configure_hf_client(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """Make the huggingface_hub client talk plain HTTP/LFS to a local hub: Xet off, offline mode
    off, no token or cache from the user's environment (``home`` replaces HF_HOME)."""
    from huggingface_hub import constants

    home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))


@contextmanager
def running_hub(root: Path, tokens: dict[str, dict[str, Any]] | None = None
                ) -> Iterator[RunningHub]:
    """Serve ``root`` with uvicorn in a background thread on a free 127.0.0.1 port.

    ``tokens`` (if given) is written to ``root/tokens.json`` first."""
    from patcher.hub.server.app import build_server

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if tokens is not None:
        path = root / "tokens.json"
        path.write_text(json.dumps({"tokens": tokens}))
        path.chmod(0o600)
    server, sock = build_server(root, "127.0.0.1", 0, log_level="warning")
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name=f"hub-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the hub did not start")
        time.sleep(0.01)
    try:
        yield RunningHub(endpoint=f"http://127.0.0.1:{port}", root=root, tokens=dict(tokens or {}),
                         traffic=server.config.app.state.traffic,
                         state=server.config.app.state)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningHub]:
    """A running hub (tokens: ``TOKENS``) with the client configured to use it."""
    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    with running_hub(tmp_path / "hub", TOKENS) as running:
        yield running


# ------------------------------------------------------------------ a hostile hub

@dataclass
class HostileHub:
    """What ``hostile_hub`` serves for its one repository ``repo`` at commit ``commit``.

    ``files``: listed name -> bytes (a name may be ``../x`` or ``/x``); ``lfs``: listed names
    served as LFS files, with the sha256 the listing claims (default: their own). The
    ``/resolve/`` answers send ``etag`` / ``linked_etag`` / ``repo_commit`` / ``location`` where
    set (else honest values). ``listing``: raw bytes for every listing answer instead of JSON;
    ``padding``: bytes of JSON whitespace added to each listing; ``drip``: seconds between the
    bytes of every answer, status line included; ``oid``: the oid of every LFS batch object and
    tree entry. ``requests``: ``(method, path)`` of every request."""

    endpoint: str = ""
    repo: str = "evil/model"
    commit: str = "c" * 40
    files: dict[str, bytes] = field(default_factory=dict)
    lfs: dict[str, str | None] = field(default_factory=dict)
    etag: str | None = None
    linked_etag: str | None = None
    repo_commit: str | None = None
    location: str | None = None
    listing: bytes | None = None
    padding: int = 0
    drip: float | None = None
    oid: str | None = None
    requests: list = field(default_factory=list)

    def entries(self) -> list[dict]:
        import hashlib

        out = []
        for name, data in self.files.items():
            entry = {"rfilename": name, "path": name, "type": "file", "size": len(data),
                     "blobId": self.oid or _git_sha1(data), "oid": self.oid or _git_sha1(data)}
            if name in self.lfs:
                sha = self.lfs[name] or hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"sha256": sha, "oid": sha, "size": len(data), "pointerSize": 130}
            out.append(entry)
        return out


def _git_sha1(data: bytes) -> str:
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@contextmanager
def hostile_hub(hub: HostileHub | None = None) -> Iterator[HostileHub]:
    """Serve ``hub`` (a ``HostileHub``) on a free 127.0.0.1 port with ``http.server``: the
    routes huggingface_hub and modelpatch call (model info, paths-info, tree, ``/resolve/``
    HEAD and GET with ranges, preupload, LFS batch, repository creation), every answer as the
    hostile settings say."""
    import http.server
    import re as _re
    import urllib.parse

    hub = hub or HostileHub()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self._answer(head=True)

        def do_GET(self):
            self._answer()

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self._answer()

        def _answer(self, head: bool = False):
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            resolve = _re.match(rf"/{_re.escape(hub.repo)}/resolve/[^/]+/(.+)$", path)
            if resolve:
                return self._file(resolve.group(1), head)
            if path.endswith("/info/lfs/objects/batch"):
                oid = hub.oid or "0" * 64
                return self._json({"transfer": "basic",
                                   "objects": [{"oid": oid, "size": 1, "actions": {}}]})
            if "/preupload/" in path:
                return self._json({"files": [{"path": name, "uploadMode": "regular",
                                              "shouldIgnore": False} for name in hub.files]})
            if "/paths-info/" in path or "/tree/" in path:
                return self._listing(hub.entries())
            if _re.fullmatch(rf"/api/models/{_re.escape(hub.repo)}(/revision/.+)?", path):
                return self._listing({"id": hub.repo, "modelId": hub.repo, "sha": hub.commit,
                                      "private": False, "siblings": hub.entries()})
            if path == "/api/repos/create":
                return self._json({"url": f"{hub.endpoint}/{hub.repo}"})
            if path == "/api/whoami-v2":
                return self._json({"name": "evil", "type": "user", "auth": {}})
            return self._json({"error": "not found"}, status=404)

        def _file(self, name: str, head: bool):
            data = hub.files.get(name)
            if data is None:
                return self._json({"error": "Entry not found"}, status=404,
                                  headers={"X-Error-Code": "EntryNotFound",
                                           "X-Repo-Commit": hub.repo_commit or hub.commit})
            etag = hub.etag or _git_sha1(data)
            headers = {"ETag": etag if etag.startswith('W/"') else f'"{etag}"',
                       "X-Repo-Commit": hub.repo_commit or hub.commit,
                       "Accept-Ranges": "bytes"}
            if hub.linked_etag is not None:
                headers["X-Linked-Etag"] = f'"{hub.linked_etag}"'
            if hub.location is not None:
                headers["Location"] = hub.location
                return self._send(302, b"", headers, head)
            status, body = 200, data
            ranged = _re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
            if ranged:
                start, end = int(ranged.group(1)), int(ranged.group(2))
                status, body = 206, data[start:end + 1]
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(status, body, headers, head, length=len(body))

        def _listing(self, value):
            body = hub.listing if hub.listing is not None else \
                json.dumps(value).encode() + b" " * hub.padding
            self._send(200, body, {"Content-Type": "application/json"})

        def _json(self, value, status: int = 200, headers: dict | None = None):
            self._send(status, json.dumps(value).encode(),
                       {"Content-Type": "application/json", **(headers or {})})

        def _send(self, status, body, headers, head=False, length=None):
            lines = [f"HTTP/1.1 {status} X"]
            lines += [f"{k}: {v}" for k, v in headers.items()]
            lines += [f"Content-Length: {len(body) if length is None else length}", "", ""]
            raw = "\r\n".join(lines).encode("latin-1") + (b"" if head else body)
            try:
                if hub.drip is None:
                    self.wfile.write(raw)
                    return
                for i in range(len(raw)):
                    self.wfile.write(raw[i:i + 1])
                    self.wfile.flush()
                    time.sleep(hub.drip)
            except OSError:
                self.close_connection = True

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            # A client that refuses an answer (over a budget, past a deadline) closes its
            # connection with bytes unread, so the next read here is reset: expected, and
            # socketserver's default would print a traceback into the output under test.
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="hostile-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(autouse=True)
def own_digest_cache(tmp_path, monkeypatch):
    """Autouse in the modules that import it: a digest cache of the test's own, and no progress
    position inherited from the environment."""
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))
    monkeypatch.delenv("TQDM_POSITION", raising=False)


@pytest.fixture
def variant(kimi_dir, tmp_path) -> Path:
    """The bundled Kimi example with ``sm120-fp16-kv`` applied (a copy of the base beside it)."""
    import shutil

    from patcher import api

    base = tmp_path / "kimi"
    shutil.copytree(kimi_dir, base)
    return api.apply("sm120-fp16-kv", base, out=tmp_path / "kimi-fixed").output
