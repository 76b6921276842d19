"""Publishing a variant to a hub and pulling one back, verified (``huggingface_hub``), and the
model card of a published variant.

May import every package but ``cli``, ``api`` and the hub server."""
