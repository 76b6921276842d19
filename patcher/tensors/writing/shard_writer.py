"""Writes one ``ShardTask``: streams its output shard tensor by tensor, hashing while writing.

The header is written first (the layout is known from the plan), then each tensor: unchanged
tensors are copied in bulk from the source range (consecutive tensors that are contiguous in the
same source file as one range), computed ones are produced one at a time from their source
ranges, handed between the pipeline's threads in batches (``BATCH_BYTES``). Peak memory is
bounded by a few batches and the largest tensor involved, never the shard. The sha256 comes
from the bytes as they are written; nothing is read back.

``shard_pool.run_shard_tasks`` runs a rewrite's tasks, one after another or several at a time.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

from ...errors import OperationFailed, ShardStopped
from ...integrity.digests.hash_writer import HashingWriter, hash_while_copying
from ...integrity.digests.hashing import HashResult
from ...integrity.digests.source_digest import SourceDigest
from ..tasks import ShardTask, TaskKind, TensorJob, single_source_in_order
from .shard_pipeline import Pipeline, read_ahead
from .thread_budget import apply_threads

# safetensors dtype name -> torch dtype attribute name
_TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                 "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U8": "uint8",
                 "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
                 "F8_E8M0": "float8_e8m0fnu",
                 "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}

# Computed tensors are hashed and written in pieces of this size, so each piece is hashed while
# it is still in the CPU cache and no single write(2) is huge.
WRITE_PIECE = 4 << 20

# On the CPU the reader, the computing thread and the writer hand each other runs of tensors
# whose sources add up to this many bytes (or one bigger tensor), not single tensors. Each
# hand-over wakes a thread, and threads that run Python between short GIL-releasing calls at the
# same time queue for the GIL (a futex sleep per turn). fp8-block-to-bf16 on 2 cores, 3
# alternating runs each: a 0.25 GB model of 16,823
# tensors (shards of 10 MB) took 10.3-12.6 s and 121k context switches one tensor at a time,
# 7.5-9.4 s at 4 MiB, 6.8-8.0 s and 1.6k switches at 16 MiB (a whole shard: no overlap); a 1 GB
# model of 3,917 tensors (shards of 125 MB) 10.9-12.3 s one at a time, 9.6-10.3 s at 16 MiB,
# 11.9-12.6 s at 64 MiB; its peak RSS 290 MB one at a time, 414 MB at 16 MiB.
BATCH_BYTES = 16 << 20

# The kernel is asked to start writing the output to disk every this many bytes, so the fsync
# at the end of a shard finds little left to do (disk I/O overlaps hashing and computing).
WRITEBACK_STEP = 32 << 20


def write_shard(task: ShardTask, target: Path,
                on_progress: Callable[[int], None] | None = None,
                hash_sources: frozenset[str] = frozenset(), *,
                stop: threading.Event | None = None, fsync: bool = True
                ) -> tuple[str, str | None, HashResult | None]:
    """Write ``task``'s shard to ``target`` (which must not exist), reading, computing and
    writing in a pipeline (``patcher.tensors.writing.shard_pipeline``); ``ShardStopped`` is
    raised at the next tensor once ``stop`` is set (another shard failed, or Ctrl-C). The file
    is made read-only and fsynced, unless ``fsync`` is False: then the caller makes it durable.

    Returns its sha256, and the task's source file with that file's digest if it is in
    ``hash_sources`` and could be hashed along the way (else None, None)."""
    if task.kind is not TaskKind.SAFETENSORS:   # a patcher.gguf.task.GGUFTask writes itself
        return task.write(target, on_progress, hash_sources, fsync=fsync)
    header = task.header
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb", buffering=0) as raw:
        writer = HashingWriter(raw)
        writer.write(header)
        if on_progress:
            on_progress(len(header))
        sources: dict[str, int] = {}
        source = single_source_in_order(task)
        try:
            digest = (SourceDigest(_fd(sources, source))
                      if source is not None and source in hash_sources else None)
            _write_jobs(task, writer, Writeback(fd), sources, digest, on_progress, target, stop)
            source_result = digest.result() if digest is not None else None
        finally:
            for src_fd in sources.values():
                os.close(src_fd)
        if fsync:
            os.fsync(raw.fileno())
        os.fchmod(raw.fileno(), 0o444)
    return writer.sha256, source if source_result else None, source_result


def _write_jobs(task: ShardTask, writer: HashingWriter, writeback, sources: dict[str, int],
                digest: SourceDigest | None, on_progress, target: Path,
                stop: threading.Event | None) -> None:
    """Every tensor of ``task`` after the header, batch by batch (``_batches``): the reader
    thread reads the sources of the computed tensors, this thread computes, the writer thread
    copies the unchanged ranges and writes the computed bytes, in shard order. Both the reader
    and the writer feed ``digest`` what they read, so the base shard is read once even when
    nothing is computed."""
    from ... import faults

    groups = list(_groups(task.jobs))
    computed = [g[0] for g in groups if g[0].op != "copy"]
    device, cache = task.device, {}
    transfer, to_host, stream = _transfers(device, computed)
    batches = list(_batches(groups, BATCH_BYTES if device == "cpu" else 0))

    def read(job: TensorJob):
        if not _reads_sources(job):
            return None         # a scale, usually taken from the weight job's cache: read if needed
        return transfer([_read(sources, s, digest, pinned=transfer.pinned, first=i == 0)
                         for i, s in enumerate(job.inputs)])

    def read_batch(batch: list[list[TensorJob]]) -> list:
        return [read(g[0]) for g in batch if g[0].op != "copy"]

    def store(group: list[TensorJob], data) -> None:
        before = writer.size
        expected = sum(j.out.nbytes for j in group)
        if data is None:
            first = group[0].inputs[0]
            copied = [0]

            def progress(n: int) -> None:
                copied[0] += n
                writeback(before + copied[0])

            hash_while_copying(_fd(sources, first.path), first.offset, expected, writer,
                               on_progress=progress, source_digest=digest)
        else:
            if not isinstance(data, memoryview):
                data = _as_bytes(data.wait())       # its copy from the GPU, once done
            _write_pieces(writer, data, writeback)
        if writer.size - before != expected:
            raise OperationFailed(f"wrote {writer.size - before} bytes, expected {expected}",
                                  where=target, tensor=group[0].out.name)
        if on_progress:
            on_progress(expected)

    def store_batch(done: list) -> None:
        for group, data in done:
            store(group, data)

    with Pipeline() as pipeline, stream:
        reads = read_ahead(batches, read_batch, pipeline)
        for batch, future in reads:
            inputs = deque(pipeline.take(future))     # popped as computed: freed early
            del future
            done = []
            for group in batch:
                if stop is not None and stop.is_set():
                    raise ShardStopped(target.name)
                for job in group:
                    faults.point(f"tensor:{job.out.name}")
                data = None
                if group[0].op != "copy":
                    data = _compute(group[0], inputs.popleft(), sources, cache, device,
                                    to_host)
                done.append((group, data))
                del data
            del inputs
            pipeline.write(lambda done=done: store_batch(done))
            del done
        pipeline.finish()


def _batches(groups: list[list[TensorJob]], limit: int) -> Iterator[list[list[TensorJob]]]:
    """``groups`` in order, cut into the runs the pipeline's stages hand on as one item: each run
    ends after the computed group that brings its computed tensors' source bytes to ``limit``
    (0: after every computed group), or with the shard. One hand-over between threads per tensor
    cost more than its tensor on models of many small tensors (see ``BATCH_BYTES``)."""
    batch: list[list[TensorJob]] = []
    size = 0
    for group in groups:
        batch.append(group)
        if group[0].op != "copy":
            if _reads_sources(group[0]):
                size += sum(s.nbytes for s in group[0].inputs)
            if size >= limit:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _reads_sources(job: TensorJob) -> bool:
    """Whether the reader reads ``job``'s sources: a quantization's scale jobs take what the
    weight job computed (``compute._quantize``)."""
    return not (job.op == "quantize" and job.param("role") != "weight")


def _groups(jobs: tuple[TensorJob, ...]) -> Iterator[list[TensorJob]]:
    """Jobs in order, byte copies of consecutive ranges of one source file merged into one group
    (one bulk copy); every computed job alone."""
    group: list[TensorJob] = []
    for job in jobs:
        if job.op == "copy" and group and group[-1].op == "copy":
            prev, src = group[-1].inputs[0], job.inputs[0]
            if src.path == prev.path and src.offset == prev.offset + prev.nbytes:
                group.append(job)
                continue
        if group:
            yield group
        group = [job]
    if group:
        yield group


def _write_pieces(writer: HashingWriter, data: memoryview, writeback) -> None:
    for start in range(0, data.nbytes, WRITE_PIECE):
        writer.write(data[start:start + WRITE_PIECE])
        writeback(writer.size)


class Writeback:
    """Starts the kernel's write-out of the bytes written so far, every ``WRITEBACK_STEP`` bytes
    (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``: asynchronous, no wait, no durability
    promise; the final fsync gives that). Elsewhere it does nothing."""

    def __init__(self, fd: int):
        self.fd, self.started = fd, 0

    def __call__(self, position: int) -> None:
        if position - self.started < WRITEBACK_STEP:
            return
        sync = _sync_file_range()
        if sync is not None:
            sync(self.fd, self.started, position - self.started, 2)   # SYNC_FILE_RANGE_WRITE
        self.started = position


_SYNC_FILE_RANGE: list = []


def _sync_file_range():
    if not _SYNC_FILE_RANGE:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _SYNC_FILE_RANGE.append(fn)
    return _SYNC_FILE_RANGE[0]


def _fd(sources: dict[str, int], path: str) -> int:
    if path not in sources:
        sources[path] = os.open(path, os.O_RDONLY)
    return sources[path]


def _read(sources: dict[str, int], src, digest: SourceDigest | None = None, pinned=None,
          first: bool = True):
    """A source tensor as a CPU torch tensor (one read of its bytes, no mmap of the shard), fed
    to ``digest`` too (a job's ``first`` source only may make it read a gap:
    ``single_source_in_order``); read into ``pinned(nbytes)`` (page-locked memory) when
    given."""
    import torch

    buf = pinned(src.nbytes) if pinned is not None else bytearray(src.nbytes)
    view, fd, offset = memoryview(buf), _fd(sources, src.path), src.offset
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise OperationFailed("unexpected end of file", where=src.path, tensor=src.name)
        view, offset = view[n:], offset + n
    if digest is not None:
        digest.feed(src.offset, buf, ahead=first)
    dtype = getattr(torch, _TORCH_DTYPES[src.dtype])
    if not src.nbytes:
        return torch.empty(src.shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).reshape(src.shape)


def _transfers(device: str, computed: list[TensorJob]):
    """``(to device, to host, compute stream)``: what the reader does with the source tensors
    it read, what the computing thread does with a computed tensor left on the GPU, and the
    stream it computes on. On the CPU nothing; on CUDA the asynchronous copies through pinned
    buffers and a stream of this shard's own (``patcher.tensors.writing.cuda_transfer``)."""
    if device == "cpu" or not computed:
        return _OnCpu(), None, contextlib.nullcontext()
    from .cuda_transfer import ToDevice, ToHost, compute_stream

    return (ToDevice(device, max(sum(s.nbytes for s in j.inputs) for j in computed)),
            ToHost(device, max(j.out.nbytes for j in computed)), compute_stream(device))


class _OnCpu:
    pinned = None

    def __call__(self, tensors):
        return tensors


def _compute(job: TensorJob, inputs, sources: dict[str, int], cache: dict,
             device: str, to_host):
    """The output bytes of ``job``, or for a tensor left on the GPU the handle of its copy to
    the host (``to_host``); ``inputs``: its source tensors as read ahead (a ``ToDevice``
    handle on CUDA; None: read them here if the computation needs them)."""
    from ..compute import compute

    apply_threads()

    def read_inputs():
        if inputs is None:
            return [_read(sources, s) for s in job.inputs]
        return inputs.ready() if hasattr(inputs, "ready") else inputs

    out = compute(job, read_inputs, cache, device, host_inputs=getattr(inputs, "host", None))
    return _as_bytes(out) if out.device.type == "cpu" else to_host(out)


def _as_bytes(tensor) -> memoryview:
    import torch

    flat = tensor.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
