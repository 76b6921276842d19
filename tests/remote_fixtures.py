"""Models served by one embedded hub per test module, for remote inspection and ``doctor``.

``store_model(hub_root, repo_id, directory)`` commits a model directory straight into the hub's
store (safetensors as LFS files, as the Hub keeps them), with no HTTP upload.
``big_sharded_model(path)`` writes a 4-shard model of 16 MiB whose headers are a tiny fraction of
it, as in real checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from patcher.hub.store.commit_ops import Op
from patcher.hub.store.git_objects import lfs_entry, regular_entry
from patcher.hub.store.storage import Store


def store_model(hub_root: Path, repo_id: str, directory: Path, *, private: bool = False) -> None:
    store = Store(hub_root)
    meta = store.create_repo("model", repo_id, private=private, author=repo_id.split("/")[0])
    ops = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        sha = store.put_bytes(data)
        entry = lfs_entry(sha, len(data)) if path.suffix == ".safetensors" \
            else regular_entry(sha, data)
        ops.append(Op("add", path.relative_to(directory).as_posix(), entry))
    store.commit(meta, "main", ops, message="model", description="", author="alice")


def big_sharded_model(path: Path, shards: int = 4, layers_per_shard: int = 2) -> Path:
    """A Llama-shaped bf16 model: ``shards`` shards of ``layers_per_shard`` 1 MiB layers each."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
         "num_hidden_layers": shards * layers_per_shard, "torch_dtype": "bfloat16"}))
    weight_map, total = {}, 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for layer in range(s * layers_per_shard, (s + 1) * layers_per_shard):
            p = f"model.layers.{layer}."
            tensors[p + "mlp.up_proj.weight"] = torch.zeros(1024, 512, dtype=torch.bfloat16)
            tensors[p + "mlp.down_proj.weight"] = torch.zeros(512, 1024, dtype=torch.bfloat16)
            tensors[p + "input_layernorm.weight"] = torch.ones(512, dtype=torch.bfloat16)
        save_file(tensors, path / name)
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    return path
