"""Self-contained, picklable descriptions of shard rewrites.

A ``ShardTask`` names its output shard, its metadata and, in output order, one ``TensorJob`` per
tensor: a byte copy of a source range or a computation over source ranges (absolute file offsets,
so a worker process, or another machine with the same paths, needs nothing else).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..config.jsonfile import dump_json_document, load_json_document
from ..model.safetensors_io import OutputTensor, encode_header


class TaskKind(str, enum.Enum):
    """What a plan's ``rewrite-shard`` task writes, so that no executor asks its type. Defined
    beside the writers (``ShardTask`` here, ``patcher.gguf.task.GGUFTask``), below the plan,
    whose ``FileTask`` contract (``patcher.plan.types``) names it."""

    SAFETENSORS = "safetensors"     # a ShardTask: tensors laid out by the shard writer
    GGUF = "gguf"                   # a gguf.task.GGUFTask: a whole GGUF file, written by itself
    GGUF_HEADER = "gguf-header"     # a GGUFTask rewriting only the header, in place


@dataclass(frozen=True)
class TensorSource:
    """A tensor's bytes in a base shard."""

    path: str            # absolute path of the shard file
    shard: str           # shard relpath (for messages)
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int          # absolute file offset of the first byte
    nbytes: int


@dataclass(frozen=True)
class TensorJob:
    """How one output tensor's bytes are made: ``copy``, ``cast``, ``dequantize``, ``quantize``."""

    out: OutputTensor
    op: str
    inputs: tuple[TensorSource, ...]
    params: tuple[tuple[str, object], ...] = ()

    def param(self, key: str):
        return dict(self.params).get(key)


@dataclass(frozen=True)
class ShardTask:
    output: str
    metadata: dict
    jobs: tuple[TensorJob, ...]
    device: str = "cpu"

    kind = TaskKind.SAFETENSORS

    def source_paths(self) -> set[str]:
        return {s.path for j in self.jobs for s in j.inputs}

    @property
    def header(self) -> bytes:
        return encode_header([j.out for j in self.jobs], self.metadata)[0]

    @property
    def file_size(self) -> int:
        return len(self.header) + sum(j.out.nbytes for j in self.jobs)

    @property
    def bytes_copied(self) -> int:
        return sum(j.out.nbytes for j in self.jobs if j.op == "copy")

    @property
    def bytes_computed(self) -> int:
        return sum(j.out.nbytes for j in self.jobs if j.op != "copy")

    def summary(self) -> dict:
        """Counts and bytes, and one line per output tensor that is not a plain copy of a
        source tensor of the same name (what a shard lost is in the plan's ``changes``)."""
        changed = [_job_line(j) for j in self.jobs
                   if j.op != "copy" or j.inputs[0].name != j.out.name]
        return {"tensors": len(self.jobs), "bytes_copied": self.bytes_copied,
                "bytes_computed": self.bytes_computed,
                "changed": changed}


def _job_line(job: TensorJob) -> str:
    src, out = job.inputs[0], job.out
    if job.op == "copy":            # a rename: the bytes are copied under a new name
        return f"rename {src.name} -> {out.name} {out.dtype}{list(out.shape)}"
    return (f"{job.op} {src.name} {src.dtype}{list(src.shape)} -> "
            f"{out.name} {out.dtype}{list(out.shape)}")


def index_document(before: bytes, where: str, weight_map: dict[str, str], total: int) -> bytes:
    """The index JSON with a regenerated ``weight_map`` (sorted, as transformers writes it) and
    ``metadata.total_size``, other keys and the file's style kept."""
    document = load_json_document(before, where)
    value = dict(document.value)
    metadata = dict(value.get("metadata") or {})
    metadata["total_size"] = total
    value["metadata"] = metadata
    value["weight_map"] = dict(sorted(weight_map.items()))
    return dump_json_document(value, document.style)


def single_source_in_order(task: ShardTask) -> str | None:
    """The one file ``task`` reads, if the first source of each job comes in ascending,
    non-overlapping ranges (so a ``SourceDigest`` can follow along); else None.

    A job's other sources (a weight's scales) may lie anywhere in that file: safetensors writes
    tensors grouped by dtype, so a checkpoint's float32 scales sit far from their float8 or
    uint8 weights (before them, in every file ``save_file`` wrote). They are fed with
    ``ahead=False``: never a reason to read a gap."""
    path, end = None, 0
    for job in task.jobs:
        for i, src in enumerate(job.inputs):
            if path is None:
                path = src.path
            if src.path != path:
                return None
            if i == 0:
                if src.offset < end:
                    return None
                end = src.offset + src.nbytes
    return path
