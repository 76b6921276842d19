"""The benchmark's targets, each MET or MISSED at the largest size measured
(benchmarks/README.md, "The targets")."""

from __future__ import annotations

from measure import CORES, med


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def _largest(by: dict) -> str:
    return max(by, key=float)


def _config_only(by: dict) -> list[dict]:
    big = _largest(by)
    r = by[big]
    first_time = {
        "id": "config_only_first_time",
        "target": "apply sm120-fp16-kv, first time (cold digest cache) <= 0.15 x "
                  "(cp -r + JSON edit), cp WITHOUT a final sync",
        "at_gb": float(big), "measured": r["ratios"]["first_time_vs_cp"], "limit": 0.15,
        "verdict": verdict(r["ratios"]["first_time_vs_cp"] <= 0.15),
        "per_size": {s: by[s]["ratios"]["first_time_vs_cp"] for s in by},
        "per_round": r["pair_ratios"]["first_time_vs_cp"],
        "also": {"vs_cp_with_sync": r["ratios"]["first_time_vs_cp_sync"],
                 "verdict_vs_cp_with_sync": verdict(r["ratios"]["first_time_vs_cp_sync"] <= 0.15),
                 "from_hf_cache_snapshot": r["ratios"].get("first_time_hf_cache_vs_cp"),
                 "verdict_from_hf_cache_snapshot": verdict(
                     (r["ratios"].get("first_time_hf_cache_vs_cp") or 9) <= 0.15)}}
    known = med(r["commands"], "modelpatch_digests_known")
    digests_known = {
        "id": "config_only_digests_known",
        "target": "apply sm120-fp16-kv with digests known < 1 s (wall, incl. interpreter "
                  "start-up)",
        "at_gb": float(big), "measured": known, "limit": 1.0, "verdict": verdict(known < 1.0),
        "per_size": {s: med(by[s]["commands"], "modelpatch_digests_known") for s in by}}
    return [first_time, digests_known]


def _tensor_count(c: dict) -> dict:
    known = med(c["commands"], "modelpatch_digests_known")
    count = ("about nvidia/Kimi-K2.5-NVFP4's count" if c["tensors"] > 200_000
             else "a reduced stand-in for Kimi-K2.5-NVFP4's ~273k")
    return {"id": "config_only_digests_known_tensor_count",
            "target": f"the same < 1 s, at {c['tensors']} tensors in {c['shards']} shards "
                      f"({count}; beyond the 8 GB / 16-shard models)",
            "at_gb": c["model_gb"], "measured": known, "limit": 1.0,
            "verdict": verdict(known < 1.0), "per_size": {},
            "per_round": c["commands"]["modelpatch_digests_known"]["wall_s"]["runs"]}


def _verify(by: dict) -> dict:
    big = _largest(by)
    m = by[big]["ratios"]["verify_vs_hashlib_pool"]
    return {"id": "verify_vs_hashlib",
            "target": f"verify <= 1.1 x hashlib sha256 per file in {CORES} processes "
                      "(the per-core hashlib limit on all cores)",
            "at_gb": float(big), "measured": m, "limit": 1.1, "verdict": verdict(m <= 1.1),
            "per_size": {s: by[s]["ratios"]["verify_vs_hashlib_pool"] for s in by},
            "per_round": by[big]["pair_ratios"]["verify_vs_hashlib_pool"]}


def _drop_kv(by: dict) -> list[dict]:
    big = _largest(by)
    r = by[big]["ratios"]
    wall = {
        "id": "drop_kv_time",
        "target": "drop-kv-scales wall time <= 1.0 x load_file/save_file script (modelpatch "
                  "first time: cold digest cache, sha256 included; script without sync)",
        "at_gb": float(big), "measured": r["time_first_time_vs_load_save"], "limit": 1.0,
        "verdict": verdict(r["time_first_time_vs_load_save"] <= 1.0),
        "per_size": {s: by[s]["ratios"]["time_first_time_vs_load_save"] for s in by},
        "per_round": by[big]["pair_ratios"]["time_first_time_vs_load_save"],
        "also": {"digests_known": r["time_digests_known_vs_load_save"],
                 "first_time_vs_script_with_sync": r["time_first_time_vs_load_save_sync"]}}
    rss = {
        "id": "drop_kv_peak_rss",
        "target": "drop-kv-scales peak RSS <= 0.5 x load_file/save_file script (the largest "
                  "process of each command)",
        "at_gb": float(big), "measured": r["peak_rss_vs_load_save"], "limit": 0.5,
        "verdict": verdict(r["peak_rss_vs_load_save"] <= 0.5),
        "per_size": {s: by[s]["ratios"]["peak_rss_vs_load_save"] for s in by},
        "also": {"whole_tree_sampled": r["tree_peak_rss_vs_load_save"],
                 "verdict_whole_tree": verdict(r["tree_peak_rss_vs_load_save"] <= 0.5)}}
    return [wall, rss]


def evaluate_targets(report: dict) -> list[dict]:
    """The targets of the cases that ran, in the report's order."""
    cases = report["cases"]
    out = []
    if "config_only" in cases:
        out += _config_only(cases["config_only"]["by_size"])
    if "config_only_tensor_count" in cases:
        out.append(_tensor_count(cases["config_only_tensor_count"]))
    if "verify" in cases:
        out.append(_verify(cases["verify"]["by_size"]))
    if "drop_kv_scales" in cases:
        out += _drop_kv(cases["drop_kv_scales"]["by_size"])
    return out
