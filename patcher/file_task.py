"""The contract of a plan's file tasks: what a ``rewrite-shard`` entry's task is and offers,
so that planning, the executors and saved plans ask a task its ``kind``, never its type. The
tasks themselves are ``patcher.tensors.tasks.ShardTask`` and ``patcher.gguf.task.GGUFTask``."""

from __future__ import annotations

import enum
from typing import Protocol


class TaskKind(str, enum.Enum):
    """What a plan's ``rewrite-shard`` task writes, so that no executor asks its type."""

    SAFETENSORS = "safetensors"     # a ShardTask: tensors laid out by the shard writer
    GGUF = "gguf"                   # a gguf.task.GGUFTask: a whole GGUF file, written by itself
    GGUF_HEADER = "gguf-header"     # a GGUFTask rewriting only the header, in place


class FileTask(Protocol):
    """The contract of a ``FilePlan.shard_task``: one output file made from base files."""

    output: str
    device: str

    @property
    def kind(self) -> TaskKind: ...

    @property
    def header(self) -> bytes: ...

    @property
    def file_size(self) -> int: ...

    def summary(self) -> dict: ...

    def source_paths(self) -> set[str]:
        """The absolute paths of the base files it reads."""
        ...
