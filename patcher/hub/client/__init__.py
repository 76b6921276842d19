"""Publishing a variant to a hub and pulling one back, verified (``huggingface_hub``), and the
model card of a published variant.

May import what the hub's row of docs/architecture.md §4 says: never ``plan``, ``recipe``,
``remote``, ``cli``, ``api`` or the hub server."""
