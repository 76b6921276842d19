"""Copies between host and GPU for the CUDA path of shard rewrites, overlapped with the kernels.

The reader thread of a shard (``patcher.shard_pipeline``) reads each computed tensor's sources
into a slot of page-locked (pinned) host memory and starts their copy to the GPU on a stream of
its own (``non_blocking``), recording an event. The computing thread waits for that event on its
own stream only (``ready``), so the copy of the next tensor overlaps the kernels of this one and
the disk writes of the previous one. Slots are reused in turn; a slot is refilled only after its
last copy finished. What the computing thread needs to read from the sources (the overflow bound's
largest scale) it reads from the pinned host copies, so it never waits for the GPU before the
writer does. Copies from pageable memory would be staged through a driver buffer in small
synchronous pieces instead.

The way back is the same: the computing thread only enqueues the copy of a computed tensor into
one of two page-locked host buffers on a stream of its own (``ToHost``); the writer thread waits
for that copy (``_OnHost.wait``) and writes it, while the computing thread goes on with the next
tensor.
Each shard being written computes on a stream of its own (``compute_stream``), so the shards in
flight (``--jobs``) overlap on the GPU too.
"""

from __future__ import annotations

import torch

from .shard_pipeline import READ_AHEAD, WRITE_BEHIND

# Slots: the tensor being computed, those read ahead, and the one being read. This counts one
# tensor per pipeline item: on a GPU the shard writer's batches hold one computed tensor each
# (``shard_writer._batches`` with limit 0); a batch of several would refill a slot whose copy or
# whose job is still in use.
SLOTS = READ_AHEAD + 2


class ToDevice:
    """Called by the reader with a job's source tensors (read through ``pinned``); returns a
    handle whose ``ready()`` gives them on the GPU, safe to use on the current stream."""

    def __init__(self, device: str, largest: int):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self.slots = [None] * SLOTS
        self.events: list = [None] * SLOTS
        self.size = largest + 64 * 8        # room for each source's alignment
        self.slot, self.used = 0, 0

    def pinned(self, nbytes: int):
        """``nbytes`` of the current slot, 64-byte aligned, as a writable buffer."""
        index = self.slot
        if self.slots[index] is None:
            self.slots[index] = torch.empty(self.size, dtype=torch.uint8, pin_memory=True)
        if self.used == 0 and self.events[index] is not None:
            self.events[index].synchronize()       # its previous copy to the GPU is done
        start = -(-self.used // 64) * 64
        self.used = start + nbytes
        return self.slots[index][start:start + nbytes].numpy()

    def __call__(self, tensors: list[torch.Tensor]) -> "_OnDevice":
        with torch.cuda.stream(self.stream):
            on_device = [t.to(self.device, non_blocking=True) for t in tensors]
            event = torch.cuda.Event()
            event.record(self.stream)
        self.events[self.slot] = event
        self.slot, self.used = (self.slot + 1) % SLOTS, 0
        return _OnDevice(on_device, event, tensors)


class _OnDevice:
    """A job's sources on the GPU (``ready()``), and their pinned host copies (``host``). The
    host copies stay valid while the job is computed: their slot is refilled only ``SLOTS``
    jobs later. Reading a value from them costs no wait for the GPU, which reading one from a
    GPU tensor does (``float()``, ``bool()``)."""

    def __init__(self, tensors: list[torch.Tensor], event, host: list[torch.Tensor]):
        self.tensors, self.event, self.host = tensors, event, host

    def ready(self) -> list[torch.Tensor]:
        stream = torch.cuda.current_stream(self.tensors[0].device if self.tensors else None)
        stream.wait_event(self.event)
        for t in self.tensors:
            t.record_stream(stream)     # the allocator keeps them until this stream is past
        return self.tensors


def compute_stream(device: str):
    """A context making a new stream of ``device`` the current one: this thread's kernels wait
    only for their own work, not for the other shards'."""
    return torch.cuda.stream(torch.cuda.Stream(torch.device(device)))


class ToHost:
    """Called by the computing thread with a computed GPU tensor: enqueues its copy into one of
    two page-locked host buffers (used in turn) behind the kernels that made it, and returns at
    once. A buffer is refilled only after the writer is done with it: the shard pipeline waits
    for the write of a tensor before it hands the next one's to the writer
    (``shard_pipeline.WRITE_BEHIND`` = 1), so the tensor before the previous one is written."""

    SLOTS = WRITE_BEHIND + 1

    def __init__(self, device: str, largest: int):
        self.stream = torch.cuda.Stream(torch.device(device))
        self.size, self.slots, self.turn = largest, [None] * self.SLOTS, 0

    def __call__(self, tensor: torch.Tensor) -> "_OnHost":
        index, self.turn = self.turn, (self.turn + 1) % self.SLOTS
        if self.slots[index] is None:
            self.slots[index] = torch.empty(self.size, dtype=torch.uint8, pin_memory=True)
        nbytes = tensor.numel() * tensor.element_size()
        host = self.slots[index][:nbytes].view(tensor.dtype).view(tensor.shape)
        self.stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(self.stream):
            host.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        tensor.record_stream(self.stream)   # not freed for reuse before the copy is done
        return _OnHost(host, done)


class _OnHost:
    def __init__(self, host: torch.Tensor, done):
        self.host, self.done = host, done

    def wait(self) -> torch.Tensor:
        """The tensor in host memory, once its copy is done."""
        self.done.synchronize()
        return self.host
