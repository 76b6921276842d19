"""The embedded hub's storage, without Starlette: content-addressed blobs, commits, refs,
Git object rules and names; small files are written with ``fsops`` (atomic, durable).

May import ``errors``, ``fsops`` and ``hub.request_errors``; never the server (Starlette)."""
