"""Recipes: the typed model (frozen dataclasses, ``schema``), safe YAML loading and the built-in
recipe lookup (``yaml_safe``, ``load``), validation (``checks``, ``sections``), the ``config:``
operations parsed and carried out on a JSON document (``config_ops``, ``config_arrays``), the
``gguf:`` section (``gguf_section``), regex bounds and guards (``requires:``); ``params/``:
parameters, includes, templates and binding; ``tensor_ops/``: the ``tensors:`` section and the
dtype vocabulary.

May import what its row of docs/architecture.md §4 says (tests/test_architecture.py holds it
there): ``config``, ``model``, ``names``, ``gguf_py`` and ``tensors.schemes`` (the scheme
names); never ``plan``, ``gguf`` or the rest of ``tensors``."""
