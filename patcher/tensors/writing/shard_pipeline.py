"""The three stages of writing one shard, overlapped: read, compute, write and hash.

While batch ``i`` is computed (this thread, torch's intra-op threads), a reader thread reads the
sources of batch ``i + 1``, and a writer thread writes and hashes batch ``i - 1`` (and copies the
unchanged ranges in the kernel, hashing them from the page cache). A batch is a run of tensors
in shard order (``shard_writer.BATCH_BYTES`` of sources on the CPU, one computed tensor on a
GPU): handing each small tensor from thread to thread cost more than it overlapped. Both the
reader and the writer feed what they read to the base shard's ``SourceDigest``, which hashes the
gaps itself and skips what it has passed. Each stage runs its items in shard order in one
thread, so the output's digest sees the bytes in order. ``os.preadv``, ``os.write``, sha256
updates over 2 KiB and torch's kernels release the GIL, so the stages run on separate cores.

Memory stays bounded: at most ``READ_AHEAD`` batches' sources read ahead and ``WRITE_BEHIND``
computed batches waiting for the writer, besides the one being computed.

On CUDA the reader also starts the host-to-device copies: it reads each source into one of a few
reused page-locked (pinned) host buffers and copies it to the GPU with ``non_blocking`` on its own
stream; the compute stream waits for that copy's event only, so the next tensor travels to the
GPU while the current one is dequantized and the previous one is written.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

READ_AHEAD = 1
WRITE_BEHIND = 1


class Pipeline:
    """Ordered reader and writer stages around the caller's compute loop.

    ``read(fn)`` schedules ``fn`` on the reader thread and returns its future; ``write(fn)``
    schedules ``fn`` on the writer thread, first waiting (and raising its error) for the oldest
    write when ``WRITE_BEHIND`` are pending. ``finish()`` waits for every write. On an error the
    context manager cancels what has not started and waits for what has, then re-raises.
    """

    def __init__(self) -> None:
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="shard-read")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="shard-write")
        self._reads: deque[Future] = deque()      # scheduled, not yet taken by the caller
        self._writes: deque[Future] = deque()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            for future in (*self._reads, *self._writes):
                future.cancel()
        self._reader.shutdown(wait=True)
        self._writer.shutdown(wait=True)

    def read(self, fn: Callable[[], object]) -> Future:
        future = self._reader.submit(fn)
        self._reads.append(future)
        return future

    def take(self, future: Future):
        """The result of a read scheduled earlier, waited for; the pipeline keeps no reference
        to it (the caller frees the sources once computed)."""
        self._reads.remove(future)
        return future.result()

    def write(self, fn: Callable[[], None]) -> None:
        while len(self._writes) >= WRITE_BEHIND:
            self._writes.popleft().result()
        self._writes.append(self._writer.submit(fn))

    def finish(self) -> None:
        while self._writes:
            self._writes.popleft().result()


def read_ahead(jobs: list, read: Callable[[object], object], pipeline: Pipeline):
    """Yield ``(job, future of read(job))`` for ``jobs`` in order, with the reads of up to
    ``READ_AHEAD`` later jobs already scheduled."""
    scheduled: deque = deque()
    for job in jobs:
        scheduled.append((job, pipeline.read(lambda job=job: read(job))))
        if len(scheduled) > READ_AHEAD:
            yield scheduled.popleft()
    while scheduled:
        yield scheduled.popleft()
