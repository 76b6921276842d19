"""Cases 1 and 1b: the config-only patch ``apply sm120-fp16-kv`` against ``cp -r`` + a JSON edit,
across model sizes, and with digests known at a real tensor count."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path

import synth
from measure import (
    GB,
    PY,
    Bench,
    alternate,
    finish,
    pair_ratios,
    ratio,
    rmtree,
    summarize,
)


def _apply(b: Bench, base: Path, out: Path, cache: Path | None) -> Callable[[], dict]:
    """``apply sm120-fp16-kv`` of ``base``; with ``cache`` None, from a fresh, empty cache."""
    def run():
        cold = cache is None
        c = b.fresh("cache-cold") if cold else cache
        rmtree(out)
        os.sync()
        r = b.measure(b.mp + ["apply", "sm120-fp16-kv", base, "-o", out, "--force", "-q",
                              "--json"], env=b.env(c))
        r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
        rmtree(out)
        if cold:
            rmtree(c)
        return finish(r)
    return run


def _cp_edit(b: Bench, model: Path, out: Path, sync: bool) -> Callable[[], dict]:
    """``cp -r`` + the JSON edit, followed by ``sync`` with ``sync``."""
    edit = b.scripts / "edit_json.py"

    def run():
        rmtree(out)
        os.sync()
        sh = (f"cp -r {shlex.quote(str(model))} {shlex.quote(str(out))} && "
              f"{shlex.quote(PY)} {shlex.quote(str(edit))} {shlex.quote(str(out))}"
              + (" && sync" if sync else ""))
        r = b.measure(["sh", "-c", sh])
        rmtree(out)
        return finish(r)
    return run


def _config_only_result(runs: dict[str, list[dict]]) -> dict:
    res = summarize(runs)
    return {"commands": res, "rounds": len(runs["cp_r_json_edit"]),
            "pair_ratios": {"first_time_vs_cp": pair_ratios(runs, "modelpatch_first_time",
                                                            "cp_r_json_edit")},
            "ratios": {
        "first_time_vs_cp": ratio(res, "modelpatch_first_time", "cp_r_json_edit"),
        "first_time_vs_cp_sync": ratio(res, "modelpatch_first_time", "cp_r_json_edit_sync"),
        "digests_known_vs_cp": ratio(res, "modelpatch_digests_known", "cp_r_json_edit"),
        "first_time_hf_cache_vs_cp": ratio(res, "modelpatch_first_time_hf_cache",
                                           "cp_r_json_edit"),
    }}


def case_config_only(b: Bench, model: Path, size: float, args, warmup: int,
                     extras: bool = False) -> dict:
    """``extras`` (the largest size): also apply to the same model laid out as a Hugging Face
    cache snapshot, first time: the shards' sha256 digests are their blob names."""
    out = b.work / "out" / "c1"
    warm_cache = b.work / "caches" / f"c1-warm-{size:g}"
    rmtree(warm_cache)
    # The warm cache: one untimed apply records every base file (they are aged past 2 s).
    b.measure(b.mp + ["apply", "sm120-fp16-kv", model, "-o", out, "--force", "-q", "--json"],
              env=b.env(warm_cache))
    rmtree(out)
    commands = {"modelpatch_first_time": _apply(b, model, out, None),
                "cp_r_json_edit": _cp_edit(b, model, out, False),
                "modelpatch_digests_known": _apply(b, model, out, warm_cache),
                "cp_r_json_edit_sync": _cp_edit(b, model, out, True)}
    snapshot = None
    if extras:
        snapshot = synth.hf_cache_snapshot(model, b.work / "hf-cache", f"synth/{model.name}")
        commands["modelpatch_first_time_hf_cache"] = _apply(b, snapshot, out, None)
    runs = alternate(commands, args.repeat, warmup, f"config-only {size:g} GB",
                     extra=size == max(args.sizes))
    result = _config_only_result(runs)
    rmtree(warm_cache)
    if snapshot is not None:
        rmtree(b.work / "hf-cache")
    return result


def case_tensor_count(b: Bench, model: Path, info: dict, args) -> dict:
    """Config-only work at a real tensor count: the known-digest apply and plan read every shard
    header, so their cost follows the number of tensors, not bytes."""
    out = b.work / "out" / "c1b"
    warm_cache = b.work / "caches" / "c1b-warm"
    rmtree(warm_cache)
    headers = b.scripts / "json_headers.py"
    b.measure(b.mp + ["apply", "sm120-fp16-kv", model, "-o", out, "--force", "-q"],
              env=b.env(warm_cache))
    rmtree(out)

    def plan():
        return finish(b.measure(b.mp + ["plan", "sm120-fp16-kv", model]))

    def floor():
        r = b.measure([PY, headers, model])
        if int(r["stdout"]) != info["tensors"]:
            raise SystemExit(f"run.py: json_headers counted {r['stdout']!r}")
        return finish(r)

    commands = {"modelpatch_digests_known": _apply(b, model, out, warm_cache),
                "modelpatch_plan": plan, "python_json_loads_headers": floor}
    res = summarize(alternate(commands, args.repeat, args.warmup, "config-only, many tensors"))
    rmtree(warm_cache)
    return {"commands": res, "model_gb": info["file_bytes"] / GB, "shards": info["shards"],
            "tensors": info["tensors"]}
