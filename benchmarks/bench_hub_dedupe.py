#!/usr/bin/env python
"""Bytes and time of publishing and pulling a config-only variant through the embedded hub,
with server-side copies and local reuse against the plain upload and download.

An 8-shard synthetic base (``synth.py``, DeepSeek-V3 shape) is committed to a hub on 127.0.0.1,
downloaded into a fresh Hugging Face cache (as a user has it), and ``sm120-fp16-kv`` applied to
that snapshot. Then, each measured by the hub's body byte counters and the wall clock:

- ``publish, plain``: every file uploaded (the transfer plan forced to upload everything);
- ``publish, server-side copies``: what ``modelpatch publish`` does;
- ``pull, plain``: into a machine with an empty Hugging Face cache;
- ``pull, reusing the cache``: on the machine whose cache holds the base;
- ``apply hf:// --publish``: the same variant made from the hub repository's headers and small
  files and published with server-side copies, no shard downloaded (bytes both ways).

Each pulled directory is verified. Usage::

    python benchmarks/bench_hub_dedupe.py [--size-gb 2] [--shards 8] [--out benchmarks/report]

Writes ``hub_dedupe.json``, ``hub_dedupe.md`` and ``hub_dedupe.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from embedded_hub import TOKEN, start_hub  # noqa: E402


def _hub(root: Path):
    server, port = start_hub(root)
    return server, f"http://127.0.0.1:{port}"


def _measure(traffic, fn) -> dict:
    before, t0 = traffic.snapshot(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    after = traffic.snapshot()
    return {"wall_s": round(wall, 3), "client_to_hub": after[0] - before[0],
            "hub_to_client": after[1] - before[1]}


def run(size_gb: float, shards: int, work: Path) -> dict:
    os.environ.update(HF_HUB_DISABLE_XET="1", HF_HOME=str(work / "hf-home"), HF_TOKEN=TOKEN,
                      MODELPATCH_CACHE_DIR=str(work / "digest-cache"))
    import synth
    from huggingface_hub import HfApi, constants, snapshot_download

    from patcher import api
    from patcher.hub.client import publish as publish_module

    info = synth.generate(work / "base", size_gb=size_gb, shards=shards, fmt="fp8-block",
                          kv_cache="fp8")
    server, endpoint = _hub(work / "hub")
    traffic = server.config.app.state.traffic
    hf = HfApi(endpoint=endpoint, token=TOKEN)
    hf.create_repo("alice/base", private=True)
    hf.upload_folder(repo_id="alice/base", folder_path=work / "base")
    snapshot = snapshot_download("alice/base", endpoint=endpoint, token=TOKEN)
    variant = api.apply("sm120-fp16-kv", snapshot, out=work / "variant").output
    results: dict[str, dict] = {}

    real_plan = publish_module.plan_transfer

    def upload_everything(*args):
        plan = real_plan(*args)
        plan.upload_all("benchmark: the plain upload")
        return plan

    publish_module.plan_transfer = upload_everything
    try:
        results["publish, plain"] = _measure(traffic, lambda: api.publish(
            variant, "alice/plain", endpoint=endpoint, progress=False))
    finally:
        publish_module.plan_transfer = real_plan
    results["publish, server-side copies"] = _measure(traffic, lambda: api.publish(
        variant, "alice/variant", endpoint=endpoint, progress=False))
    cache = constants.HF_HUB_CACHE
    constants.HF_HUB_CACHE = str(work / "empty-cache")
    try:
        results["pull, plain"] = _measure(traffic, lambda: api.pull(
            "alice/variant", work / "pulled-plain", endpoint=endpoint, progress=False))
    finally:
        constants.HF_HUB_CACHE = cache
    results["pull, reusing the cache"] = _measure(traffic, lambda: api.pull(
        "alice/variant", work / "pulled-reuse", endpoint=endpoint, progress=False))
    from patcher.remote.apply import apply_and_publish

    results["apply hf:// --publish"] = _measure(traffic, lambda: apply_and_publish(
        "sm120-fp16-kv", "hf://alice/base", "alice/remote-variant", endpoint=endpoint))
    for name in ("pulled-plain", "pulled-reuse"):
        assert api.verify(work / name).ok, name
    server.should_exit = True
    model_bytes = sum(p.stat().st_size for p in (work / "base").iterdir() if p.is_file())
    return {"model": {"size_gb": size_gb, "shards": info["shards"], "bytes": model_bytes},
            "results": results}


def _moved(name: str, r: dict) -> int:
    """The bytes that matter: uploaded by a publish, downloaded by a pull, both for apply."""
    if name.startswith("apply"):
        return r["client_to_hub"] + r["hub_to_client"]
    return r["client_to_hub"] if name.startswith("publish") else r["hub_to_client"]


def markdown(report: dict) -> str:
    total = report["model"]["bytes"]
    lines = [f"# Publish and pull of a config-only variant: {report['model']['shards']}-shard "
             f"base, {total / 1e9:.2f} GB", "",
             "| command | bytes client->hub | bytes hub->client | % of the model moved | seconds |",
             "|---|---:|---:|---:|---:|"]
    for name, r in report["results"].items():
        moved = _moved(name, r)
        lines.append(f"| {name} | {r['client_to_hub']:,} | {r['hub_to_client']:,} | "
                     f"{100 * moved / total:.2f} | {r['wall_s']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["results"])
    moved = [_moved(n, r) for n, r in report["results"].items()]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.barh(names, [m / 1e6 for m in moved])
    a.set_xscale("log")
    a.set_xlabel("MB transferred (log scale)")
    b.barh(names, [r["wall_s"] for r in report["results"].values()])
    b.set_xlabel("seconds")
    fig.suptitle(f"config-only variant of a {report['model']['bytes'] / 1e9:.2f} GB, "
                 f"{report['model']['shards']}-shard base, embedded hub on 127.0.0.1")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--out", type=Path, default=HERE / "report")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hub-dedupe-", dir=args.workdir or "/var/tmp"))
    try:
        report = run(args.size_gb, args.shards, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hub_dedupe.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "hub_dedupe.md").write_text(markdown(report))
    plot(report, args.out / "hub_dedupe.png")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
