"""Host-to-device copies for the CUDA path of shard rewrites, overlapped with the kernels.

The reader thread of a shard (``patcher.shard_pipeline``) reads each computed tensor's sources
into a slot of page-locked (pinned) host memory and starts their copy to the GPU on a stream of
its own (``non_blocking``), recording an event. The computing thread waits for that event on its
own stream only (``ready``), so the copy of the next tensor overlaps the kernels of this one and
the disk writes of the previous one. Slots are reused in turn; a slot is refilled only after its
last copy finished. Copies from pageable memory would be staged through a driver buffer in small
synchronous pieces instead.
"""

from __future__ import annotations

import torch

from .shard_pipeline import READ_AHEAD

# Slots: the tensor being computed, those read ahead, and the one being read.
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
        return _OnDevice(on_device, event)


class _OnDevice:
    def __init__(self, tensors: list[torch.Tensor], event):
        self.tensors, self.event = tensors, event

    def ready(self) -> list[torch.Tensor]:
        stream = torch.cuda.current_stream(self.tensors[0].device if self.tensors else None)
        stream.wait_event(self.event)
        for t in self.tensors:
            t.record_stream(stream)     # the allocator keeps them until this stream is past
        return self.tensors
