"""Executes ``ShardTask``s: streams output shards tensor by tensor, hashing while writing.

The header is written first (the layout is known from the plan), then each tensor: unchanged
tensors are copied in bulk from the source range, computed ones are produced one at a time from
their source ranges. Peak memory is bounded by the largest tensor involved, never the shard. The
sha256 comes from the bytes as they are written; nothing is read back.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

from .errors import OperationFailed
from .hashing import HashingWriter, hash_while_copying
from .tensor_tasks import ShardTask, TensorJob

# safetensors dtype name -> torch dtype attribute name
_TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
                 "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U8": "uint8",
                 "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}


def run_shard_tasks(tasks: list[ShardTask], staging: Path, *, jobs: int | None = None,
                    on_progress: Callable[[int], None] | None = None) -> dict[str, str]:
    """Write every task's shard under ``staging``; returns relpath -> sha256.

    With ``jobs`` > 1 the shards are written by worker processes, one task each.
    """
    jobs = min(jobs or os.cpu_count() or 1, len(tasks))
    results: dict[str, str] = {}
    if jobs <= 1:
        for task in tasks:
            results[task.output] = write_shard(task, staging / task.output, on_progress)
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(write_shard, t, staging / t.output): t for t in tasks}
        for future in as_completed(futures):
            task = futures[future]
            results[task.output] = future.result()
            if on_progress:
                on_progress(task.file_size)
    return results


def write_shard(task: ShardTask, target: Path,
                on_progress: Callable[[int], None] | None = None) -> str:
    """Write ``task``'s shard to ``target`` (which must not exist); returns its sha256."""
    from . import faults

    header = task.header
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb", buffering=0) as raw:
        writer = HashingWriter(raw)
        writer.write(header)
        sources: dict[str, int] = {}
        cache: dict = {}
        try:
            for job in task.jobs:
                faults.point(f"tensor:{job.out.name}")
                before = writer.size
                if job.op == "copy":
                    src = job.inputs[0]
                    hash_while_copying(_fd(sources, src.path), src.offset, src.nbytes, writer)
                else:
                    writer.write(_compute(job, sources, cache, task.device))
                if writer.size - before != job.out.nbytes:
                    raise OperationFailed(f"wrote {writer.size - before} bytes, expected "
                                          f"{job.out.nbytes}", where=target, tensor=job.out.name)
                if on_progress:
                    on_progress(job.out.nbytes)
        finally:
            for src_fd in sources.values():
                os.close(src_fd)
        os.fsync(raw.fileno())
        os.fchmod(raw.fileno(), 0o444)
    return writer.sha256


def _fd(sources: dict[str, int], path: str) -> int:
    if path not in sources:
        sources[path] = os.open(path, os.O_RDONLY)
    return sources[path]


def _read(sources: dict[str, int], src):
    """A source tensor as a torch tensor (one read of its bytes, no mmap of the shard)."""
    import torch

    buf = bytearray(src.nbytes)
    view, fd, offset = memoryview(buf), _fd(sources, src.path), src.offset
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise OperationFailed("unexpected end of file", where=src.path, tensor=src.name)
        view, offset = view[n:], offset + n
    dtype = getattr(torch, _TORCH_DTYPES[src.dtype])
    if not buf:
        return torch.empty(src.shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).reshape(src.shape)


def _compute(job: TensorJob, sources: dict[str, int], cache: dict, device: str) -> memoryview:
    from .tensor_compute import compute

    tensor = compute(job, lambda: [_read(sources, s) for s in job.inputs], cache, device)
    return _as_bytes(tensor)


def _as_bytes(tensor) -> memoryview:
    import torch

    flat = tensor.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
