"""Cases 3 and 4, the tensor rewrites: ``apply drop-kv-scales`` against safetensors
``load_file``/``save_file`` per shard, across model sizes, and ``apply fp8-block-to-bf16`` against
a CPU torch script and ``cp`` of the same bytes. Wall time and peak RSS."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path

from measure import (
    GB,
    PY,
    Bench,
    alternate,
    dir_bytes,
    finish,
    med,
    pair_ratios,
    ratio,
    rmtree,
    summarize,
)

# --------------------------------------------------------------------------- case 3


def _drop_kv_first_time(b: Bench, model: Path, out: Path) -> Callable[[], dict]:
    """``apply drop-kv-scales`` of ``model`` from a fresh, empty digest cache."""
    def run():
        c = b.fresh("cache-cold")
        rmtree(out)
        os.sync()
        r = b.measure(b.mp + ["apply", "drop-kv-scales", model, "-o", out, "--force", "-q",
                              "--json"], env=b.env(c), sample=True)
        r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
        r["out_bytes"] = dir_bytes(out)
        rmtree(out)
        rmtree(c)
        return finish(r)
    return run


def _load_save(b: Bench, model: Path, out: Path, kv_scale_re: str,
               sync: bool) -> Callable[[], dict]:
    """bench_tensor.py's load_file/save_file script, followed by ``sync`` with ``sync``."""
    load_save = b.scripts / "load_save_drop.py"

    def run():
        rmtree(out)
        os.sync()
        cmd = [PY, load_save, model, out, kv_scale_re]
        if sync:
            cmd = ["sh", "-c", shlex.join(str(c) for c in cmd) + " && sync"]
        r = b.measure(cmd, sample=True)
        r["out_bytes"] = dir_bytes(out)
        rmtree(out)
        return finish(r)
    return run


def _drop_kv_result(runs: dict[str, list[dict]]) -> dict:
    res = summarize(runs, rss=True)
    return {"commands": res, "rounds": len(runs["load_save"]),
            "pair_ratios": {"time_first_time_vs_load_save": pair_ratios(
                runs, "modelpatch_first_time", "load_save")},
            "ratios": {
        "time_first_time_vs_load_save": ratio(res, "modelpatch_first_time", "load_save"),
        "time_digests_known_vs_load_save": ratio(res, "modelpatch_digests_known", "load_save"),
        "time_first_time_vs_load_save_sync": ratio(res, "modelpatch_first_time",
                                                   "load_save_sync"),
        "time_digests_known_vs_load_save_sync": ratio(res, "modelpatch_digests_known",
                                                      "load_save_sync"),
        "peak_rss_vs_load_save": ratio(res, "modelpatch_first_time", "load_save", "peak_rss"),
        "tree_peak_rss_vs_load_save": ratio(res, "modelpatch_first_time", "load_save",
                                            "tree_peak_rss"),
    }}


def case_drop_kv(b: Bench, model: Path, twin: Path, size: float, args, scripts: dict,
                 warmup: int, extras: bool) -> dict:
    """``extras``: also run modelpatch with digests known and the script followed by ``sync``
    (done at the largest size only: each run rewrites the whole model, at disk speed)."""
    out = b.work / "out" / "c3"
    commands = {"modelpatch_first_time": _drop_kv_first_time(b, model, out),
                "load_save": _load_save(b, model, out, scripts["kv_scale_re"], False)}
    if extras:
        commands["load_save_sync"] = _load_save(b, model, out, scripts["kv_scale_re"], True)
    runs = alternate(commands, args.repeat, warmup, f"drop-kv-scales {size:g} GB", extra=extras)
    if extras:
        runs.update(_drop_kv_digests_known(b, model, twin, args.repeat, size))
    return _drop_kv_result(runs)


def _drop_kv_digests_known(b: Bench, model: Path, twin: Path, repeat: int,
                           size: float) -> dict[str, list[dict]]:
    """``modelpatch_digests_known``: ``repeat`` applies with a warm digest cache, each replacing
    the previous variant with ``--force`` (what a user who applies again does). Timed after the
    alternated commands: their outputs, deleted by hand, hardlink the base's shards, and each
    deletion moves the shards' ctime, which a cached digest must match."""
    warm_cache = b.work / "caches" / f"c3-warm-{size:g}"
    again, twin_out = b.work / "out" / "c3-again", b.work / "out" / "c3-twin"
    for path in (warm_cache, again, twin_out):
        rmtree(path)
    # The warm cache, without rewriting the model: the no-KV twin's shards are hardlinks of the
    # FP8-KV model's (same inodes), so a config-only apply to that model records them.
    b.measure(b.mp + ["apply", "sm120-fp16-kv", twin, "-o", twin_out, "--force", "-q"],
              env=b.env(warm_cache))

    def run():
        os.sync()
        r = b.measure(b.mp + ["apply", "drop-kv-scales", model, "-o", again, "--force", "-q",
                              "--json"], env=b.env(warm_cache), sample=True)
        r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
        r["out_bytes"] = dir_bytes(again)
        return finish(r)

    runs = alternate({"modelpatch_digests_known": run}, repeat, 0,
                     f"drop-kv-scales {size:g} GB, digests known")
    for path in (warm_cache, again, twin_out):
        rmtree(path)
    return runs


# --------------------------------------------------------------------------- case 4

def case_fp8(b: Bench, model: Path, args) -> dict:
    out = b.work / "out" / "c4"
    ref = b.work / "out" / "c4-bf16-ref"
    cast = b.scripts / "fp8_cast_bf16_cpu.py"
    rmtree(ref)

    def mp():
        rmtree(out)
        os.sync()
        c = b.fresh("cache-cold")
        r = b.measure(b.mp + ["apply", "fp8-block-to-bf16", model, "-o", out, "-q", "--json"],
                      env=b.env(c), sample=True)
        r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
        r["out_bytes"] = dir_bytes(out)
        if not ref.exists():
            out.rename(ref)       # the BF16 shards that cp_same_bytes copies
        rmtree(out)
        rmtree(c)
        return finish(r)

    def torch_script():
        rmtree(out)
        os.sync()
        r = b.measure([PY, cast, model, out], sample=True)
        r["out_bytes"] = dir_bytes(out)
        rmtree(out)
        return finish(r)

    def cp():
        if not ref.exists():
            mp()
        rmtree(out)
        out.mkdir(parents=True)
        os.sync()
        r = b.measure(["cp", *sorted(ref.glob("*.safetensors")), out], sample=True)
        r["out_bytes"] = dir_bytes(out)
        rmtree(out)
        return finish(r)

    # modelpatch runs first in the first round, so cp finds its output there.
    commands = {"modelpatch": mp, "torch_fp8_cast_bf16": torch_script, "cp_same_bytes": cp}
    res = summarize(alternate(commands, args.repeat, args.warmup, "fp8-block-to-bf16"),
                    rss=True)
    rmtree(ref)
    gbps = {n: res[n]["out_bytes"] / med(res, n) / GB for n in res}
    return {"commands": res, "output_gbps": gbps, "ratios": {
        "time_vs_torch_script": ratio(res, "modelpatch", "torch_fp8_cast_bf16"),
        "time_vs_cp_same_bytes": ratio(res, "modelpatch", "cp_same_bytes"),
        "peak_rss_vs_torch_script": ratio(res, "modelpatch", "torch_fp8_cast_bf16", "peak_rss"),
    }}
