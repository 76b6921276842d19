"""JSON documents that keep their style when edited, JSON Pointer, duplicate keys, and
quantization configs' module patterns. The recipe's config operations are carried out by
``patcher.recipe.config_ops``.

May import what its row of docs/architecture.md §4 says (tests/test_architecture.py holds it
there): nothing of ``patcher`` but the modules every module may import."""
