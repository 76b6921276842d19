"""The embedded hub the hub benchmarks measure: served from ``root`` on a free 127.0.0.1 port,
in a thread of the benchmark's own process, with one write token for ``alice``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

TOKEN = "bench-token"


def start_hub(root: Path):
    """Serve a new hub at ``root``; returns the server (``should_exit = True`` stops it) and
    its port once it accepts connections."""
    from patcher.hub.server.app import build_server

    root.mkdir(parents=True)
    (root / "tokens.json").write_text(json.dumps(
        {"tokens": {TOKEN: {"user": "alice", "write": True}}}))
    (root / "tokens.json").chmod(0o600)
    server, sock = build_server(root, "127.0.0.1", 0, log_level="warning")
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, sock.getsockname()[1]
