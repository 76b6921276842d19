"""The synthetic models a run measures on (written by synth.py), and the sizes that fit on disk."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import synth
from measure import GB, log


def check_space(args, work: Path, notes: list[str]) -> None:
    """Drop the largest sizes that cannot fit: base + a full copy (cp) + a full rewrite."""
    free = shutil.disk_usage(work).free
    sizes = sorted(args.sizes)
    while sizes:
        biggest = sizes[-1]
        need = (biggest + sum(args.shard_mb / 1000 for _ in sizes[:-1])) * GB  # base + tails
        need += 2 * biggest * GB                                               # cp / rewrite
        need += 3.5 * args.fp8_size * GB if 4 in args.cases else 0
        if need * 1.1 < free:
            break
        notes.append(f"{biggest:g} GB left out: it needs about {need / GB:.0f} GB of disk, "
                     f"{free / GB:.0f} GB free")
        sizes.pop()
    if not sizes:
        raise SystemExit("run.py: not enough disk space for even the smallest size")
    args.sizes = sizes


def _generate(out: Path, **kwargs) -> dict:
    """synth.generate, without the shard header digests (they stay in its stamp file)."""
    info = synth.generate(out, **kwargs)
    info.pop("shard_headers", None)
    return info


def prepare_models(args, work: Path) -> dict:
    """nvfp4 models per size (FP8 KV declared, and a no-KV twin sharing every shard), and the
    fp8-block model for case 4. The largest is written first; smaller ones hardlink its shards."""
    models: dict = {"sizes": {}, "fp8": None}
    generated: list[Path] = []
    t0 = time.perf_counter()
    for size in sorted(args.sizes, reverse=True):
        shards = max(1, round(size * 1000 / args.shard_mb))
        kv = work / "models" / f"nvfp4-{size:g}gb"
        nokv = work / "models" / f"nvfp4-{size:g}gb-nokv"
        log(f"model {size:g} GB / {shards} shards ...")
        info = _generate(kv, size_gb=size, shards=shards, link_from=generated)
        generated.append(kv)
        info_nokv = _generate(nokv, size_gb=size, shards=shards, kv_cache="none",
                              link_from=[kv])
        models["sizes"][size] = {"kv": info, "nokv": info_nokv}
    if 1 in args.cases:
        log(f"many-tensor model {args.many_gb:g} GB / {args.many_shards} shards ...")
        models["many_tensors"] = _generate(work / "models" / "nvfp4-many-tensors",
                                           size_gb=args.many_gb, shards=args.many_shards)
    if 4 in args.cases:
        shards = max(1, round(args.fp8_size * 1000 / args.shard_mb))
        log(f"fp8-block model {args.fp8_size:g} GB / {shards} shards ...")
        models["fp8"] = _generate(work / "models" / f"fp8-{args.fp8_size:g}gb",
                                  size_gb=args.fp8_size, shards=shards, fmt="fp8-block")
    models["generation_s"] = time.perf_counter() - t0
    return models
