"""Recipes: the typed model (frozen dataclasses), safe YAML loading, validation, regex bounds,
dtype names, guards (``requires:``) and the built-in recipe lookup.

May import ``errors``, ``fsops``, ``config``, ``model`` and ``tensors.resharding`` (shard sizes);
never ``execute`` or ``hub``."""
