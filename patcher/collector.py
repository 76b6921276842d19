"""The garbage collector's policy: paused while many long-lived objects are made, and, in a
process that runs one command (the command line, a shard worker), frozen once they are made.

A full collection scans every tracked object. After torch is imported and a model's headers are
parsed that is millions of objects, and the tensor work that follows allocates enough to trigger
a few full collections: 0.43 s of them in a 2-core fp8-block-to-bf16 of a 24-shard model of
16,823 tensors (gc.callbacks), which took 5.9-7.1 CPU-s unfrozen against 5.9-6.3 frozen (four
alternating runs each). ``gc.freeze`` moves what exists into a generation no collection scans;
reference counting still frees it. Importing torch under ``paused`` saves its own three full
collections (``patcher.tensors.writing.shard_pool.load_torch``). A long-running
process (the hub server, a library user) must not freeze: a frozen cycle is never collected.

Imports nothing from ``patcher``.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

#: True in a process that runs one command and ends (the command line sets it; shard workers
#: do too): only there does ``paused`` freeze on its way out.
ONE_COMMAND = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside: what is made here (parsed headers) lives as long as the
    model, so a collection would only rescan it (about 40% of the time at 273k tensors). In a
    one-command process it is then frozen: taken out of every later collection's scan."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if ONE_COMMAND:
            gc.freeze()
        if enabled:
            gc.enable()
