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
                         traffic=server.config.app.state.traffic)
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
