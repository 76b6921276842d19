"""The ``inspect`` report as typed, frozen data: what ``api.inspect`` returns and the command
renders. ``to_json()`` is the ``--json`` document, key for key.

A model of config.json and safetensors (``format`` ``"safetensors"``) has every field; GGUF
models beside it are in ``gguf``. A directory or file holding only GGUF models
(``format`` ``"gguf"``) has ``path`` and ``gguf`` alone. The sections keep the shape
``inspect_model`` gives them (``patcher.model.inspect_model``; the GGUF models':
``patcher.gguf.inspect``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SAFETENSORS, GGUF = "safetensors", "gguf"


@dataclass(frozen=True)
class InspectReport:
    """What ``inspect`` reports of a model (see the module's docstring)."""

    path: str
    """The model directory (the repository read, for ``hf://``), or the ``.gguf`` file."""
    format: str = SAFETENSORS
    """``safetensors`` (a config.json or safetensors files) or ``gguf`` (GGUF files only)."""
    report_version: int | None = None
    hf_cache_snapshot: bool = False
    """Whether the directory is a snapshot of a Hugging Face cache."""
    architectures: tuple[Mapping[str, Any], ...] = ()
    """Per config (``config.json``, and the nested ones of a multimodal model): its path,
    ``architectures`` and ``model_type``."""
    quantization: Mapping[str, Any] | None = None
    """config.json's and hf_quant_config.json's declarations, and where they disagree."""
    tensors: Mapping[str, Any] | None = None
    """Counts, parameters and bytes: ``totals``, ``per_dtype``, ``per_group``."""
    shards: Mapping[str, Any] | None = None
    """``count``, ``total_file_bytes`` and per shard ``files``: name, size, tensors."""
    kv_cache_tensors: tuple[Mapping[str, Any], ...] = ()
    index: Mapping[str, Any] | None = None
    """The shard index: ``present``, ``total_size``, ``tensors``, ``healthy``, ``warnings``."""
    files: int | None = None
    """Files in the model directory."""
    gguf: tuple[Mapping[str, Any], ...] | None = None
    """Each GGUF model's report (None: the model has no GGUF file)."""
    remote: Mapping[str, Any] | None = None
    """An ``hf://`` model: what reading it transferred (requests, bytes, the commit read)."""

    @classmethod
    def of(cls, report: Mapping[str, Any], *, gguf: list | None = None,
           remote: Mapping[str, Any] | None = None) -> InspectReport:
        """The report of ``inspect_model`` (its plain data), with GGUF models and the
        transfer of an ``hf://`` read."""
        return cls(path=report["path"], report_version=report["report_version"],
                   hf_cache_snapshot=report["hf_cache_snapshot"],
                   architectures=tuple(report["architectures"]),
                   quantization=report["quantization"], tensors=report["tensors"],
                   shards=report["shards"], kv_cache_tensors=tuple(report["kv_cache_tensors"]),
                   index=report["index"], files=report["files"],
                   gguf=None if gguf is None else tuple(gguf), remote=remote)

    @classmethod
    def gguf_only(cls, path: str, models: list) -> InspectReport:
        return cls(path=path, format=GGUF, gguf=tuple(models))

    def to_json(self) -> dict[str, Any]:
        if self.format == GGUF:
            return {"format": GGUF, "path": self.path, "models": list(self.gguf or ())}
        out: dict[str, Any] = {
            "report_version": self.report_version, "path": self.path,
            "hf_cache_snapshot": self.hf_cache_snapshot,
            "architectures": list(self.architectures), "quantization": self.quantization,
            "tensors": self.tensors, "shards": self.shards,
            "kv_cache_tensors": list(self.kv_cache_tensors), "index": self.index,
            "files": self.files}
        if self.gguf is not None:
            out["gguf"] = list(self.gguf)
        if self.remote is not None:
            out["remote"] = dict(self.remote)
        return out
