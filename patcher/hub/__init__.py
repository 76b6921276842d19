"""Hub integration: publish and pull variants, and the embedded hub (``modelpatch hub serve``).

The embedded hub (``server.py``) needs the optional ``modelpatch[hub]`` extra (Starlette,
uvicorn). Importing this package never imports them: ``create_app`` and ``serve`` load
``patcher.hub.server.app`` on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "serve"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "serve"):
        from .server import app as server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
