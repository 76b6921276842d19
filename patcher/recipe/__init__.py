"""Recipes: the typed model (frozen dataclasses, ``schema``), safe YAML loading and the built-in
recipe lookup (``yaml_safe``, ``load``), validation (``checks``, ``sections``), regex bounds and
guards (``requires:``); ``params/``: parameters, includes, templates and binding; ``tensor_ops/``:
the ``tensors:`` section and the dtype vocabulary.

May import ``errors``, ``fsops``, ``units``, ``config``, ``model``, ``gguf`` (its recipe
section) and ``tensors.schemes`` (the scheme names); never the rest of ``tensors``, nor ``plan``,
``execute``, ``hub``, ``cli`` or ``api``."""
