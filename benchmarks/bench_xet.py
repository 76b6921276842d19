#!/usr/bin/env python
"""Xet through the embedded hub: what publishing and pulling a variant whose shards were
rewritten moves, what the hub stores, and stock ``hf upload`` / ``hf download`` through Xet
against Git LFS.

A synthetic base (``synth.py``; DeepSeek-V3 shape by default, its last layer declared the MTP
layer) whose tensor bytes are all distinct (the generator's pools repeat, which Xet would
deduplicate within the base itself; here every tensor gets its own seeded random bytes) is
uploaded with ``hf upload`` to one hub through Xet and to another over Git LFS, each behind a
counting TCP proxy (``counting_proxy.py``: every byte either way, HTTP headers included), then
downloaded with ``hf download`` from each into a fresh Hugging Face cache. Three variants are
made from the Xet download's snapshot: ``drop-kv-scales`` (every shard loses its KV scales),
``strip-mtp`` (the MTP layer's tensors dropped) and a rename of every KV scale (every shard's
header changes); each is published with ``modelpatch publish`` and pulled with ``modelpatch pull``
on the machine whose cache holds the base. Every client runs as its own process with a fresh
Xet cache (``HF_XET_CACHE``), so nothing is deduplicated against what this machine uploaded
before: only against what the hub holds.

Usage::

    python benchmarks/bench_xet.py [--size-gb 2] [--shards 8] [--format fp8-block|nvfp4]
                                   [--out benchmarks/report]

Writes ``xet.json`` and ``xet.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from embedded_hub import TOKEN, start_hub  # noqa: E402

BIN = Path(sys.executable).parent
RENAME_RECIPE = """modelpatch: 1
name: kv-scale-rename
description: Rename every KV-cache scale (k_proj.k_scale to self_attn.k_scale).
tensors:
  - select: {regex: '\\.self_attn\\.[kv]_proj\\.[kv]_scale$'}
    rename: {pattern: '\\.self_attn\\.[kv]_proj\\.([kv])_scale$', to: '.self_attn.\\1_scale'}
"""
VARIANTS = {"drop-kv-scales": "drop-kv-scales", "strip-mtp": "strip-mtp",
            "rename": "kv-scale-rename.yaml"}


def _unique_tensors() -> None:
    """Make the generator write each tensor's own seeded random bytes (FP8 NaN codes cleared)
    instead of slices of its shared pools."""
    import numpy as np
    import synth
    import synth_files

    def write_tensor(f, name: str, dtype: str, n: int) -> None:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        while n:
            k = min(n, 16 << 20)
            data = rng.integers(0, 256, k, dtype=np.uint8)
            if dtype != "F32":
                data &= np.uint8(0xFE)
            synth_files._write_all(f, memoryview(data.tobytes()))
            n -= k

    synth_files._write_tensor = write_tensor
    synth.GENERATOR_VERSION = "unique-1"


def _base(work: Path, size_gb: float, shards: int, fmt: str) -> Path:
    import synth

    _unique_tensors()
    out = work / "base"
    synth.generate(out, size_gb=size_gb, shards=shards, fmt=fmt, kv_cache="none",
                   kv_scales=True)
    config = json.loads((out / "config.json").read_text())
    text = config.get("text_config", config)
    text["num_hidden_layers"] -= 1           # the last layer is the MTP layer
    text["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _hub(root: Path):
    from counting_proxy import CountingProxy

    server, port = start_hub(root)
    proxy = CountingProxy("127.0.0.1", port).__enter__()
    return server, proxy


def _du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


class Runner:
    def __init__(self, work: Path):
        self.work, self.n = work, 0

    def env(self, endpoint: str, home: Path, xet: bool = True) -> dict:
        self.n += 1
        env = dict(os.environ, HF_ENDPOINT=endpoint, HF_TOKEN=TOKEN, HF_HOME=str(home),
                   HF_XET_CACHE=str(self.work / f"xet-cache-{self.n}"),
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
                   MODELPATCH_CACHE_DIR=str(self.work / "digest-cache"), PYTHONPATH=str(ROOT))
        env.pop("HF_HUB_DISABLE_XET", None)
        if not xet:
            env["HF_HUB_DISABLE_XET"] = "1"
        return env

    def run(self, args: list, proxy, env: dict) -> dict:
        before, t0 = proxy.snapshot(), time.perf_counter()
        done = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = proxy.snapshot()
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args[:3]))} failed:\n{done.stderr[-3000:]}")
        return {"wall_s": round(wall, 2), "up": after[0] - before[0],
                "down": after[1] - before[1], "stdout": done.stdout.strip()[-300:],
                "said": done.stderr.strip()[-600:]}


def run(size_gb: float, shards: int, fmt: str, work: Path) -> dict:
    from patcher import api

    base = _base(work, size_gb, shards, fmt)
    model_bytes = sum(p.stat().st_size for p in base.iterdir() if p.is_file())
    xet_server, xet = _hub(work / "hub-xet")
    lfs_server, lfs = _hub(work / "hub-lfs")
    r = Runner(work)
    hf, modelpatch = BIN / "hf", [sys.executable, "-m", "patcher.cli"]
    home = work / "home"                        # the machine that downloads the base
    res: dict = {}
    res["hf upload, Xet"] = r.run([hf, "upload", "alice/base", base, "."], xet,
                                  r.env(xet.endpoint, work / "home-up"))
    res["hf upload, LFS"] = r.run([hf, "upload", "alice/base", base, "."], lfs,
                                  r.env(lfs.endpoint, work / "home-up", xet=False))
    stored_base = _du(work / "hub-xet")
    res["hf download, Xet"] = r.run([hf, "download", "alice/base"], xet,
                                    r.env(xet.endpoint, home))
    res["hf download, LFS"] = r.run([hf, "download", "alice/base"], lfs,
                                    r.env(lfs.endpoint, work / "home-lfs", xet=False))
    said = res["hf download, Xet"]["stdout"]       # "path: <snapshot>", or the path alone
    snapshot = Path(re.findall(r"(/\S+/snapshots/[0-9a-f]{40})", said)[-1])
    (work / "kv-scale-rename.yaml").write_text(RENAME_RECIPE)
    variants: dict = {}
    for name, recipe in VARIANTS.items():
        recipe_arg = str(work / recipe) if recipe.endswith(".yaml") else recipe
        out = api.apply(recipe_arg, snapshot, out=work / f"v-{name}").output
        changed = sum(p.stat().st_size for p in out.iterdir() if p.is_file() and not p.is_symlink()
                      and p.stat().st_nlink == 1)
        before = _du(work / "hub-xet")
        pub = r.run([*modelpatch, "publish", out, f"alice/{name}", "--endpoint", xet.endpoint],
                    xet, r.env(xet.endpoint, home))
        stored = _du(work / "hub-xet") - before
        pull = r.run([*modelpatch, "pull", f"alice/{name}", "-o", work / f"p-{name}",
                      "--endpoint", xet.endpoint], xet, r.env(xet.endpoint, home))
        if not api.verify(work / f"p-{name}").ok:
            raise RuntimeError(f"the pulled {name} does not verify")
        variants[name] = {"publish": pub, "pull": pull, "stored_bytes": stored,
                          "rewritten_file_bytes": changed}
    for server, proxy in ((xet_server, xet), (lfs_server, lfs)):
        proxy.__exit__(None, None, None)
        server.should_exit = True
    _wait_for_chunking()
    return {"model": {"size_gb": size_gb, "shards": shards, "format": fmt, "bytes": model_bytes},
            "stored_base_bytes": stored_base, "stock": res, "variants": variants}


def _wait_for_chunking(limit_s: float = 120) -> None:
    """Let the hubs' background chunking of LFS blobs (for Xet clients) finish before the work
    directory is removed under it."""
    from patcher.hub.store import xet_ingest

    deadline = time.monotonic() + limit_s
    while xet_ingest._xetify_running and time.monotonic() < deadline:
        time.sleep(0.1)


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.2f}%"


def markdown(report: dict) -> str:
    total, stock = report["model"]["bytes"], report["stock"]
    base = report["stored_base_bytes"]
    lines = [f"Model: {report['model']['format']}, {report['model']['shards']} shards, "
             f"{total / 1e9:.2f} GB (tensor bytes all distinct).", "",
             "| measure | result | target | met |", "|---|---:|---:|:---:|"]

    def row(what: str, value: str, target: str, ok: bool) -> None:
        lines.append(f"| {what} | {value} | {target} | {'yes' if ok else '**no**'} |")

    for name, v in report["variants"].items():
        sent = v["publish"]["up"]
        row(f"publish {name}: bytes sent (% of model)", _pct(sent, total), "<= 3%",
            sent <= 0.03 * total)
    for name, v in report["variants"].items():
        ratio = (base + v["stored_bytes"]) / base
        row(f"hub storage after base + {name} (x base)", f"{ratio:.3f}x", "<= 1.03x",
            ratio <= 1.03)
    for name, v in report["variants"].items():
        got = v["pull"]["down"]
        row(f"pull {name}, base in the HF cache: bytes received (% of model)", _pct(got, total),
            "<= 3%", got <= 0.03 * total)
    for verb in ("upload", "download"):
        x, lf = stock[f"hf {verb}, Xet"]["wall_s"], stock[f"hf {verb}, LFS"]["wall_s"]
        row(f"hf {verb}, Xet vs LFS (wall, {x:.1f} s / {lf:.1f} s)", f"{x / lf:.2f}x",
            "<= 1.3x", x <= 1.3 * lf)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--format", dest="fmt", choices=["fp8-block", "nvfp4"],
                        default="fp8-block")
    parser.add_argument("--out", type=Path, default=HERE / "report")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="xet-bench-", dir=args.workdir or "/var/tmp"))
    try:
        report = run(args.size_gb, args.shards, args.fmt, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "xet.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "xet.md").write_text(markdown(report))
    sys.stdout.write(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
