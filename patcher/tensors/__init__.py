"""Tensor work: planning a recipe's ``tensors:`` section, resharding, quantization schemes and
their kernels (``quant/``), shard tasks, the virtual tensor view (``view``), the compute of one
output tensor, and the shard writer with its pipeline (``writing/``).

May import ``errors``, ``faults``, ``plan``, ``config``, ``model``, ``recipe`` and ``integrity``
(hashing while writing); never ``execute`` or ``hub``."""
