"""Writing rewritten shards: the shard writer (``shard_writer``), its read/compute/write pipeline
(``shard_pipeline``), the thread budget of its workers (``thread_budget``) and pinned-buffer
transfers to CUDA (``cuda_transfer``). torch is imported only inside the workers.

Part of ``patcher.tensors``; the same import rules."""
