"""Remote inspection at Kimi-K2.5-NVFP4 scale: modelpatch's ranged header reads against
huggingface_hub's ``get_safetensors_metadata``, on the embedded hub, side by side.

    PYTHONPATH=. python benchmarks/bench_remote.py [--shards 119] [--tensors 273000] [--rounds 5]

The repository has the real one's shape where it matters here (119 shards, ~273k tensors named as
in a DeepSeek-V3/Kimi export, so headers of ~300 KB each) but tiny tensors, so it builds in
seconds. Both readers fetch every header of every shard plus the index; modelpatch also
validates each header strictly and checks the index against them. Target: modelpatch
within 1.5x of ``get_safetensors_metadata``. Rounds alternate the two; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["HF_HUB_DISABLE_XET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from patcher.hub.store.commit_ops import Op  # noqa: E402
from patcher.hub.store.git_objects import lfs_entry, regular_entry  # noqa: E402
from patcher.hub.store.storage import Store  # noqa: E402
from patcher.model.safetensors_io import OutputTensor, encode_header  # noqa: E402

REPO = "bench/kimi-shaped"
_PROJ = ("gate_proj", "up_proj", "down_proj")
_PARTS = ("weight", "weight_scale", "weight_scale_2", "input_scale")


def tensor_names(count: int) -> list[str]:
    """Expert tensor names as in nvidia/Kimi-K2.5-NVFP4, ``count`` of them."""
    names: list[str] = []
    layer = 0
    while len(names) < count:
        for expert in range(384):
            for proj in _PROJ:
                for part in _PARTS:
                    names.append(f"language_model.model.layers.{layer}.mlp.experts.{expert}."
                                 f"{proj}.{part}")
        layer += 1
    return names[:count]


def build_repo(hub_root: Path, shards: int, tensors: int) -> int:
    """Commit the repository into the hub's store; returns its size in bytes."""
    store = Store(hub_root)
    meta = store.create_repo("model", REPO, private=False, author="bench")
    names = tensor_names(tensors)
    per_shard = -(-len(names) // shards)
    ops, weight_map, total = [], {}, 0
    for s in range(shards):
        chunk = names[s * per_shard:(s + 1) * per_shard]
        header, layout = encode_header([OutputTensor(n, "U8", (4, 8)) for n in chunk], None)
        data = header + bytes(sum(t.nbytes for t in layout))
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        ops.append(Op("add", shard, lfs_entry(store.put_bytes(data), len(data))))
        weight_map.update(dict.fromkeys(chunk, shard))
        total += len(data)
    for name, doc in (("model.safetensors.index.json",
                       {"metadata": {"total_size": 32 * len(names)}, "weight_map": weight_map}),
                      ("config.json", {"architectures": ["KimiK25ForConditionalGeneration"],
                                       "model_type": "kimi_k25"})):
        raw = json.dumps(doc).encode()
        ops.append(Op("add", name, regular_entry(store.put_bytes(raw), raw)))
        total += len(raw)
    store.commit(meta, "main", ops, message="bench", description="", author="bench")
    return total


def main() -> None:
    import pytest
    from hub_fixtures import configure_hf_client, running_hub
    from huggingface_hub.utils import disable_progress_bars

    from patcher.remote.model import RemoteModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=119)
    parser.add_argument("--tensors", type=int, default=273_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    disable_progress_bars()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, pytest.MonkeyPatch.context() as mp:
        size = build_repo(Path(tmp) / "hub", args.shards, args.tensors)
        configure_hf_client(mp, Path(tmp) / "home")
        with running_hub(Path(tmp) / "hub") as hub:
            api = hub.api()
            times: dict[str, list[float]] = {"modelpatch": [], "get_safetensors_metadata": []}
            for _ in range(args.rounds):
                start = time.perf_counter()
                model = RemoteModel.open(f"hf://{REPO}", endpoint=hub.endpoint)
                times["modelpatch"].append(time.perf_counter() - start)
                start = time.perf_counter()
                meta = api.get_safetensors_metadata(REPO)
                times["get_safetensors_metadata"].append(time.perf_counter() - start)
            assert len(meta.weight_map) == len(model.tensor_shards) == args.tensors
    ours, theirs = (statistics.median(times[k]) for k in times)
    report = model.transfer_report()
    print(json.dumps({"shards": args.shards, "tensors": args.tensors, "repo_bytes": size,
                      "bytes_transferred": report["bytes_transferred"],
                      "requests": report["requests"], "rounds": args.rounds,
                      "median_s": {"modelpatch": round(ours, 3),
                                   "get_safetensors_metadata": round(theirs, 3)},
                      "ratio": round(ours / theirs, 2), "target_ratio": 1.5,
                      "met": ours / theirs <= 1.5}, indent=2))


if __name__ == "__main__":
    main()
