"""The sections of report.md for the cases, one function each (report_md.py assembles them):
a function of the report that returns the section's lines, none when the case did not run."""

from __future__ import annotations

from measure import CORES, GB

# --------------------------------------------------------------------------- formatting


def fmt_s(x: float | None) -> str:
    return "-" if x is None else (f"{x:.3f} s" if x < 10 else f"{x:.1f} s")


def fr(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def fmt_mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f} MiB"


def _table(add, by: dict, names: list[str], rss: bool = False) -> None:
    """One row per size, one column per command: wall time median (min-max), and with
    ``rss`` peak RSS."""
    head = "| size | " + " | ".join(names) + " |"
    add(head)
    add("|---" * (len(names) + 1) + "|")
    for s in sorted(by, key=float):
        cells = []
        for n in names:
            c = by[s]["commands"].get(n)
            if c is None:
                cells.append("-")
                continue
            cell = f"{fmt_s(c['wall_s']['median'])} ({c['wall_s']['min']:.2f}-" \
                   f"{c['wall_s']['max']:.2f})"
            if rss:
                cell += f", {fmt_mib(c['peak_rss']['median'])}"
                if c.get("tree_peak_rss"):
                    cell += f" (tree {fmt_mib(c['tree_peak_rss']['median'])})"
            cells.append(cell)
        add(f"| {by[s]['model_gb']:.2f} GB | " + " | ".join(cells) + " |")
    add("")


def _commands(add, commands: dict) -> None:
    """One row per command: wall time median (min-max)."""
    add("| command | wall (median, min-max) |")
    add("|---|---|")
    for n, e in commands.items():
        add(f"| {n} | {fmt_s(e['wall_s']['median'])} ({e['wall_s']['min']:.3f}-"
            f"{e['wall_s']['max']:.3f}) |")


# --------------------------------------------------------------------------- the cases

def _config_only(report: dict) -> list[str]:
    """Case 1, config-only patch, per size."""
    cases = report["cases"]
    if "config_only" not in cases:
        return []
    L: list[str] = []
    add = L.append
    by = cases["config_only"]["by_size"]
    add("## 1. Config-only patch: `apply sm120-fp16-kv` vs `cp -r` + JSON edit\n")
    add("Wall time, median (min-max). `first_time`: an empty digest cache, so every base file "
        "is hashed once (the manifest needs every digest); `digests_known`: a warm cache, each "
        "run replacing the previous variant with `--force`, timed after the other commands "
        "(deleting their hardlinked outputs by hand moves the base shards' ctime, a key of "
        "the digest cache, so a cache filled before them would be stale). "
        "The target compares first_time with `cp -r` + edit WITHOUT `sync` (what a user sees "
        "at the prompt, although cp leaves the copy in dirty page cache, not yet on disk); "
        "modelpatch fsyncs what it writes. The ratio against `cp -r` + edit + `sync` "
        "(durable, like modelpatch) is shown as well. At the largest size, "
        "`first_time_hf_cache` applies to the same model laid out as a Hugging Face cache "
        "snapshot (as `hf download` leaves it; the motivating case): first time too (empty "
        "digest cache), but the shards' sha256 are their blob names, so only the small "
        "non-LFS files are hashed.\n")
    _table(add, by, ["modelpatch_first_time", "modelpatch_digests_known", "cp_r_json_edit",
                     "cp_r_json_edit_sync", "modelpatch_first_time_hf_cache"])
    add("| size | first_time / cp | first_time / (cp+sync) | digests_known / cp | "
        "first_time from HF cache / cp | bytes hashed first time | bytes hashed, known | "
        "bytes hashed, HF cache |")
    add("|---|---|---|---|---|---|---|---|")
    for s in sorted(by, key=float):
        r, c = by[s]["ratios"], by[s]["commands"]
        hf = c.get("modelpatch_first_time_hf_cache")
        add(f"| {by[s]['model_gb']:.2f} GB | {r['first_time_vs_cp']:.3f} | "
            f"{r['first_time_vs_cp_sync']:.3f} | {r['digests_known_vs_cp']:.3f} | "
            f"{fr(r.get('first_time_hf_cache_vs_cp'))} | "
            f"{c['modelpatch_first_time']['bytes_hashed'] / GB:.3f} GB | "
            f"{c['modelpatch_digests_known']['bytes_hashed']} B | "
            f"{hf['bytes_hashed'] if hf else '-'}{' B' if hf else ''} |")
    add("\n![config-only](case1_config_only.png)\n")
    return L


def _tensor_count(report: dict) -> list[str]:
    """Case 1b, config-only patch at a real tensor count."""
    cases = report["cases"]
    if "config_only_tensor_count" not in cases:
        return []
    L: list[str] = []
    add = L.append
    c = cases["config_only_tensor_count"]
    add(f"## 1b. Config-only patch at a real tensor count ({c['tensors']} tensors, "
        f"{c['shards']} shards, {c['model_gb']:.2f} GB)\n")
    add("nvidia/Kimi-K2.5-NVFP4 has about 273k tensors (61 layers x 384 experts x 3 "
        "projections x 4 NVFP4 tensors, and more) in 119 shards. With digests known, a "
        "config-only "
        "apply reads no tensor data, but `plan` and `apply` parse every shard header; "
        "`python_json_loads_headers` is the floor of any Python reader that parses them "
        "all (`json.loads` of every header, nothing else).\n")
    _commands(add, c["commands"])
    add("")
    return L


def _verify(report: dict) -> list[str]:
    """Case 2, verify, per size."""
    cases = report["cases"]
    if "verify" not in cases:
        return []
    L: list[str] = []
    add = L.append
    by = cases["verify"]["by_size"]
    add(f"## 2. `verify` vs hashlib sha256 per file (1 process, Pool({CORES}))\n")
    _table(add, by, ["modelpatch_verify", "hashlib_serial", f"hashlib_pool{CORES}"])
    add(f"| size | verify / Pool({CORES}) | verify / serial | verify GB/s | Pool GB/s | "
        "serial GB/s | Pool parallelism (CPU s / wall s) |")
    add("|---|---|---|---|---|---|---|")
    for s in sorted(by, key=float):
        r = by[s]
        add(f"| {r['model_gb']:.2f} GB | {r['ratios']['verify_vs_hashlib_pool']:.3f} | "
            f"{r['ratios']['verify_vs_hashlib_serial']:.3f} | {r['verify_gbps']:.2f} | "
            f"{r['hashlib_pool_gbps']:.2f} | {r['hashlib_serial_gbps']:.2f} | "
            f"{r['pool_parallelism']:.2f} |")
    add(f"\nPool parallelism near {CORES} means the baseline had every core; near 1, other "
        "work held the other core(s) and every multi-core figure of that moment is "
        "effectively a one-core figure.")
    add("\n![verify](case2_verify.png)\n")
    return L


def _drop_kv(report: dict) -> list[str]:
    """Case 3, drop-kv-scales, per size."""
    cases = report["cases"]
    if "drop_kv_scales" not in cases:
        return []
    L: list[str] = []
    add = L.append
    by = cases["drop_kv_scales"]["by_size"]
    add("## 3. `apply drop-kv-scales` (every shard rewritten) vs load_file/save_file per "
        "shard\n")
    add("Wall time median (min-max), peak RSS of the largest process (median; "
        "ru_maxrss of the command's tree, the measuring wrapper being its child subreaper so "
        "that fork-server workers are counted, checked against a 50 ms sampling), "
        "and in brackets the peak of the whole process tree's summed RSS, sampled every 50 ms "
        "(pages that forked workers share with their parent count once per process, so it "
        "is an upper bound). "
        "modelpatch hashes what it writes and fsyncs every shard; the script does neither "
        "(`load_save_sync` adds a final `sync`). First time also hashes every base shard "
        "(the provenance manifest records the base's digests). `digests_known` and "
        "`load_save_sync` run at the largest size only: every run rewrites the whole model "
        "at disk speed, and the time budget of one run does not allow them everywhere.\n")
    _table(add, by, ["modelpatch_first_time", "modelpatch_digests_known", "load_save",
                     "load_save_sync"], rss=True)
    add("| size | time first / script | time known / script | time first / (script+sync) "
        "| time known / (script+sync) | peak RSS ratio | tree peak RSS ratio |")
    add("|---|---|---|---|---|---|---|")
    for s in sorted(by, key=float):
        r = by[s]["ratios"]
        add(f"| {by[s]['model_gb']:.2f} GB | {fr(r['time_first_time_vs_load_save'])} | "
            f"{fr(r['time_digests_known_vs_load_save'])} | "
            f"{fr(r['time_first_time_vs_load_save_sync'])} | "
            f"{fr(r['time_digests_known_vs_load_save_sync'])} | "
            f"{fr(r['peak_rss_vs_load_save'])} | {fr(r['tree_peak_rss_vs_load_save'])} |")
    add("\n![drop-kv-scales](case3_drop_kv_scales.png)\n")
    return L


def _fp8(report: dict) -> list[str]:
    """Case 4, fp8-block-to-bf16."""
    cases = report["cases"]
    if "fp8_to_bf16" not in cases:
        return []
    L: list[str] = []
    add = L.append
    c = cases["fp8_to_bf16"]
    add("## 4. `apply fp8-block-to-bf16` vs a CPU torch script (fp8_cast_bf16.py style) "
        "and cp of the same bytes\n")
    add(f"Model: {c['model_gb']:.2f} GB fp8-block, output "
        f"{c['commands']['modelpatch']['out_bytes'] / GB:.2f} GB BF16.\n")
    add("| command | wall (median, min-max) | output GB/s | peak RSS | tree peak RSS |")
    add("|---|---|---|---|---|")
    for n, e in c["commands"].items():
        add(f"| {n} | {fmt_s(e['wall_s']['median'])} ({e['wall_s']['min']:.2f}-"
            f"{e['wall_s']['max']:.2f}) | {c['output_gbps'][n]:.2f} | "
            f"{fmt_mib(e['peak_rss']['median'])} | "
            f"{fmt_mib((e.get('tree_peak_rss') or {}).get('median'))} |")
    r = c["ratios"]
    add(f"\nmodelpatch / torch script: {r['time_vs_torch_script']:.3f}x time, "
        f"{r['peak_rss_vs_torch_script']:.3f}x peak RSS; modelpatch / cp of the same bytes: "
        f"{r['time_vs_cp_same_bytes']:.3f}x time.\n")
    return L


def _inspect(report: dict) -> list[str]:
    """Case 5, inspect."""
    cases = report["cases"]
    if "inspect" not in cases:
        return []
    L: list[str] = []
    add = L.append
    c = cases["inspect"]
    add(f"## 5. `inspect` vs safe_open ({c['model_gb']:.2f} GB, {c['shards']} shards, "
        f"{c['tensors']} tensors)\n")
    _commands(add, c["commands"])
    r = c["ratios"]
    add(f"\ninspect / (safe_open + get_tensor): {r['inspect_vs_safe_open_get_tensor']:.3f}; "
        f"inspect / (safe_open, headers only): "
        f"{r['inspect_vs_safe_open_headers_only']:.3f}. Both baselines import torch "
        f"(`framework=\"pt\"`).\n")
    return L


def _cold_start(report: dict) -> list[str]:
    """Case 6, cold start."""
    cases = report["cases"]
    if "cold_start" not in cases:
        return []
    L: list[str] = []
    add = L.append
    c = cases["cold_start"]
    add("## 6. Cold start\n")
    _commands(add, c["commands"])
    add("")
    for k, it in c["importtime"].items():
        torch_part = (f"torch imported, {it['torch_import_s']:.3f} s of it"
                      if it["torch_imported"] else "torch NOT imported")
        add(f"- `{k}` under `python -X importtime`: {it['modules']} modules, "
            f"{it['all_imports_s']:.3f} s importing (patcher.cli.commands "
            f"{it['patcher_cli_import_s']:.3f} s); {torch_part}.")
    pays = any(i["torch_imported"] for i in c["importtime"].values())
    add(f"- Importing torch costs {c['torch_import_cost_s']:.3f} s in a fresh interpreter "
        f"(`python -c 'import torch'` minus `python -c pass`); config-only commands "
        f"{'pay it' if pays else 'never pay it'}.")
    add("")
    return L


CASE_SECTIONS = (_config_only, _tensor_count, _verify, _drop_kv, _fp8, _inspect, _cold_start)
