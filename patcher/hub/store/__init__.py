"""The embedded hub's storage, pure standard library: content-addressed blobs, commits, refs,
Git object rules, names, and the durable small files they are kept in.

May import ``errors`` and ``hub.request_errors``; never the server (Starlette)."""
