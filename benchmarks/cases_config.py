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


def _apply_first_time(b: Bench, base: Path, out: Path) -> Callable[[], dict]:
    """``apply sm120-fp16-kv`` of ``base`` from a fresh, empty digest cache."""
    def run():
        c = b.fresh("cache-cold")
        rmtree(out)
        os.sync()
        r = b.measure(b.mp + ["apply", "sm120-fp16-kv", base, "-o", out, "--force", "-q",
                              "--json"], env=b.env(c))
        r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
        rmtree(out)
        rmtree(c)
        return finish(r)
    return run


def _apply_again(b: Bench, base: Path, out: Path, cache: Path) -> Callable[[], dict]:
    """``apply sm120-fp16-kv --force`` of ``base`` over the variant an earlier apply left in
    ``out``, with that apply's digest cache: what a user who applies again does. modelpatch
    replaces the variant itself and keeps the base's digests. (Deleting a variant by hand
    removes hard links to the base's shards, which moves their ctime, a key of the digest
    cache: the next apply hashes them again.)"""
    def run():
        os.sync()
        r = b.measure(b.mp + ["apply", "sm120-fp16-kv", base, "-o", out, "--force", "-q",
                              "--json"], env=b.env(cache))
        r["bytes_hashed"] = json.loads(r["stdout"])["bytes_hashed"]
        return finish(r)
    return run


def _digests_known_runs(b: Bench, model: Path, repeat: int, label: str) -> dict[str, list[dict]]:
    """``modelpatch_digests_known``: an untimed apply fills a digest cache, then ``repeat``
    timed applies replace its variant (``_apply_again``). Timed after the alternated commands,
    not between them: their outputs, deleted by hand, hardlink the base's shards, and each
    deletion moves the shards' ctime, which a cached digest must match. The target is a time,
    not a ratio to a command run beside it."""
    again = b.work / "out" / "c1-again"
    warm_cache = b.work / "caches" / "c1-warm"
    rmtree(again)
    rmtree(warm_cache)
    # (the base's files are aged past 2 s: the cache keeps no digest of a file changing now)
    b.measure(b.mp + ["apply", "sm120-fp16-kv", model, "-o", again, "--force", "-q", "--json"],
              env=b.env(warm_cache))
    runs = alternate({"modelpatch_digests_known": _apply_again(b, model, again, warm_cache)},
                     repeat, 0, f"{label}, digests known")
    rmtree(again)
    rmtree(warm_cache)
    return runs


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
    commands = {"modelpatch_first_time": _apply_first_time(b, model, out),
                "cp_r_json_edit": _cp_edit(b, model, out, False),
                "cp_r_json_edit_sync": _cp_edit(b, model, out, True)}
    snapshot = None
    if extras:
        snapshot = synth.hf_cache_snapshot(model, b.work / "hf-cache", f"synth/{model.name}")
        commands["modelpatch_first_time_hf_cache"] = _apply_first_time(b, snapshot, out)
    runs = alternate(commands, args.repeat, warmup, f"config-only {size:g} GB",
                     extra=size == max(args.sizes))
    runs.update(_digests_known_runs(b, model, args.repeat, f"config-only {size:g} GB"))
    result = _config_only_result(runs)
    if snapshot is not None:
        rmtree(b.work / "hf-cache")
    return result


def case_tensor_count(b: Bench, model: Path, info: dict, args) -> dict:
    """Config-only work at a real tensor count: the known-digest apply and plan read every shard
    header, so their cost follows the number of tensors, not bytes."""
    headers = b.scripts / "json_headers.py"

    def plan():
        return finish(b.measure(b.mp + ["plan", "sm120-fp16-kv", model]))

    def floor():
        r = b.measure([PY, headers, model])
        if int(r["stdout"]) != info["tensors"]:
            raise SystemExit(f"run.py: json_headers counted {r['stdout']!r}")
        return finish(r)

    commands = {"modelpatch_plan": plan, "python_json_loads_headers": floor}
    runs = alternate(commands, args.repeat, args.warmup, "config-only, many tensors")
    runs.update(_digests_known_runs(b, model, args.repeat, "config-only, many tensors"))
    res = summarize(runs)
    return {"commands": res, "model_gb": info["file_bytes"] / GB, "shards": info["shards"],
            "tensors": info["tensors"]}
