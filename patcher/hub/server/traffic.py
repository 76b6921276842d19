"""Byte counters of the embedded hub: request bodies received and response bodies sent, in
total, for ``app.state.traffic``. They measure what a client really transferred (a publish that
copies server-side, a pull that reuses local files), in tests and benchmarks."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Traffic:
    received: int = 0            # request body bytes, client -> hub
    sent: int = 0                # response body bytes, hub -> client
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, received: int = 0, sent: int = 0) -> None:
        with self._lock:
            self.received += received
            self.sent += sent

    def snapshot(self) -> tuple[int, int]:
        """``(received, sent)`` so far."""
        with self._lock:
            return self.received, self.sent


class CountBytes:
    """ASGI middleware adding every HTTP body chunk, either way, to ``traffic``."""

    def __init__(self, app: Any, traffic: Traffic):
        self.app = app
        self.traffic = traffic

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def _receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                self.traffic.add(received=len(message.get("body", b"")))
            return message

        async def _send(message: Any) -> None:
            if message["type"] == "http.response.body":
                self.traffic.add(sent=len(message.get("body", b"")))
            await send(message)

        await self.app(scope, _receive, _send)
