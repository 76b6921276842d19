"""Tensor work: planning a recipe's ``tensors:`` section, resharding, quantization schemes and
their kernels (``quant/``), shard tasks, the compute of one output tensor, and the shard writer.

May import ``errors``, ``faults``, ``plan``, ``config``, ``model``, ``recipe`` and ``integrity``
(hashing while writing); never ``execute`` or ``hub``."""
