"""Safetensors bytes and model directories built by hand, and checks of CLI errors: shared by
the reader tests (tests/model/) and the hostile-input and untrusted-directory tests
(tests/execute/)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from patcher.cli import main
from patcher.errors import InputError, PatchError
from patcher.model.model_dir import INDEX_NAME

# --- helpers ---------------------------------------------------------------------------------


def st_bytes(header: dict | bytes, data: bytes | int = 0, *, length: int | None = None) -> bytes:
    """Raw safetensors bytes: 8-byte little-endian length, header, data.

    ``header`` is a dict (JSON-encoded) or raw bytes; ``data`` is bytes or a count of zero bytes;
    ``length`` overrides the declared header length.
    """
    body = header if isinstance(header, bytes) else json.dumps(header).encode("utf-8")
    if isinstance(data, int):
        data = b"\0" * data
    return struct.pack("<Q", len(body) if length is None else length) + body + data


def entry(dtype: str, shape: list, start: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}


F32x2 = entry("F32", [2], 0, 8)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def assert_cli_error(model: Path, *needles: str, code: int = 2, json_flag: bool = False) -> str:
    """``modelpatch inspect MODEL`` fails with one clean line naming every needle."""
    result = invoke("inspect", str(model), *(["--json"] if json_flag else []))
    assert result.exit_code == code, (result.exit_code, result.output, result.exc_info)
    assert result.exc_info[0] is SystemExit, result.exc_info  # no escaped exception
    # --json puts the error on stdout as well; plain output leaves stdout empty
    assert (json.loads(result.stdout)["error"]["exit_code"] == code if json_flag
            else result.stdout == "")
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("modelpatch: error: "), lines[0]
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def expect_error(exc_type: type[PatchError], where: Path, message: str,
                 tensor: str | None = None) -> "pytest.ExceptionInfo":
    """Context manager: raises ``exc_type`` naming ``where`` (and ``tensor``) with ``message``."""
    return _Expect(exc_type, where, message, tensor)


class _Expect:
    def __init__(self, exc_type, where, message, tensor):
        self.exc_type, self.where, self.message, self.tensor = exc_type, where, message, tensor
        self.raises = pytest.raises(exc_type)

    def __enter__(self):
        self.info = self.raises.__enter__()
        return self.info

    def __exit__(self, *exc):
        suppressed = self.raises.__exit__(*exc)
        err = self.info.value
        assert err.where == str(self.where), (err.where, str(self.where))
        assert err.tensor == self.tensor, (err.tensor, self.tensor)
        assert self.message in err.message, (self.message, err.message)
        line = str(err)
        assert "\n" not in line and str(self.where) in line
        if self.tensor:
            assert repr(self.tensor) in line
        assert err.exit_code == 2 and isinstance(err, InputError)
        return suppressed


def save_shard(path: Path, tensors: dict[str, torch.Tensor], metadata=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)


SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def shard_tensors() -> dict[str, dict[str, torch.Tensor]]:
    return {
        SHARD1: {"model.embed_tokens.weight": torch.zeros(8, 4, dtype=torch.bfloat16),
                 "model.layers.0.self_attn.q_proj.weight": torch.ones(4, 4, dtype=torch.bfloat16),
                 "model.layers.0.input_layernorm.weight": torch.ones(4, dtype=torch.float32)},
        SHARD2: {"model.layers.0.mlp.down_proj.weight": torch.zeros(4, 4).to(torch.float8_e4m3fn),
                 "model.layers.0.mlp.down_proj.weight_scale_inv": torch.ones(1, 1),
                 "lm_head.weight": torch.zeros(8, 4, dtype=torch.bfloat16)},
    }


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def write_index(model: Path, weight_map: dict, total_size: int | None | str = "auto",
                extra: dict | None = None) -> None:
    doc: dict = {"metadata": {}, "weight_map": weight_map}
    if total_size == "auto":
        total_size = sum(tensor_bytes(t) for ts in shard_tensors().values() for t in ts.values())
    if total_size is not None:
        doc["metadata"]["total_size"] = total_size
    doc.update(extra or {})
    (model / INDEX_NAME).write_text(json.dumps(doc, indent=2))


def sharded_model(root: Path) -> tuple[Path, dict[str, str]]:
    """A valid two-shard model; returns (dir, weight_map)."""
    model = root / "model"
    weight_map = {}
    for shard, tensors in shard_tensors().items():
        save_shard(model / shard, tensors)
        weight_map.update({name: shard for name in tensors})
    (model / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                   "model_type": "deepseek_v3"}))
    write_index(model, weight_map)
    return model, weight_map


# --- safetensors header defects --------------------------------------------------------------

# (id, file bytes, message fragment, tensor named by the error or None)
