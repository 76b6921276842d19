"""Tensor work: quantization schemes and their kernels (``quant/``), shard tasks and the kinds
of file tasks (``tasks``), the compute of one output tensor, and the shard writer with its
pipeline (``writing/``). The planning of a recipe's ``tensors:`` section is ``patcher.plan``'s.

May import what its row of docs/architecture.md §4 says (tests/test_architecture.py holds it
there): ``config``, ``model`` and ``integrity`` (hashing while writing); never ``plan``,
``recipe`` or ``gguf``."""
