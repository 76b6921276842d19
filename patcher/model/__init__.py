"""The model directory as read: its files and shard index, safetensors header I/O, ``inspect``,
and the base model's hub identity.

May import ``errors`` and ``config``; never ``execute`` or ``hub``."""
