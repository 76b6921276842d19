"""JSON documents that keep their style when edited, JSON Pointer, and the recipe's config
operations (set, drop, patch, rename).

May import ``errors`` and ``recipe.schema`` (the typed ops it carries out); never ``execute`` or
``hub``."""
