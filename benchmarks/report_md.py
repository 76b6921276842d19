"""report.md: the targets first, then the machine, the physical limits, the models, one section
per case (report_cases.py) and how to read it. Every section is a function of the report
(report.json's content) that returns its lines."""

from __future__ import annotations

from measure import GB, SPREAD_LIMIT
from report_cases import CASE_SECTIONS


def _intro(report: dict) -> list[str]:
    a = report["args"]
    return ["# modelpatch benchmark report\n",
            (f"Generated {report['date']} by `{report['command']}` in "
             f"**{report['runtime_s'] / 60:.1f} min** ({report['runtime_s']:.0f} s). "
             f"Mode: {report['mode']}; sizes {', '.join(f'{s:g}' for s in a['sizes'])} "
             f"GB (nominal) in shards of {a['shard_mb']:g} MB; {a['repeat']} "
             f"timed round(s) per command, medians (at the largest size of cases 1-3, up to "
             f"{a['extra_rounds']} more while runs differ by over {SPREAD_LIMIT}x and "
             f"the {a['budget_min']:g}-minute budget allows); "
             f"{a['warmup']} warm-up round(s) "
             f"before the smallest size of cases 1-3 and before each of cases 4-6 (larger sizes "
             f"read the same page-cached, hardlinked shards, preloaded before timing).\n")]


def _target_detail(t: dict) -> str:
    """One target's figure per size, per round, and the figures beside it."""
    per = ", ".join(f"{float(s):g} GB: {x:.3f}" for s, x in sorted(t["per_size"].items(),
                                                                  key=lambda i: float(i[0])))
    line = f"- `{t['id']}`" + (f" per size: {per}." if per else ":")
    if t.get("per_round"):
        what = ("seconds" if t["id"].startswith("config_only_digests_known")
                else "modelpatch / the baseline run next to it")
        line += (f" At {t['at_gb']:.3g} GB, per round ({what}): "
                 + ", ".join(f"{x:.3f}" for x in t["per_round"]) + ".")
    if "also" in t:
        line += " Also: " + "; ".join(
            f"{k} {x:.3f}" if isinstance(x, float) else f"{k} {x}"
            for k, x in t["also"].items()) + "."
    return line


def _targets(report: dict) -> list[str]:
    L: list[str] = []
    add = L.append
    add("## Targets\n")
    add("| target | at | measured | limit | verdict |")
    add("|---|---|---|---|---|")
    for t in report["targets"]:
        unit = " s" if t["id"].startswith("config_only_digests_known") else "x"
        add(f"| {t['target']} | {t['at_gb']:.3g} GB | "
            f"{t['measured']:.3f}{unit} | {t['limit']}{unit} | **{t['verdict']}** |")
    add("")
    L += map(_target_detail, report["targets"])
    add("")
    return L


def _notes(report: dict) -> list[str]:
    if not report.get("notes"):
        return []
    return ["## Notes\n", *(f"- {n}" for n in report["notes"]), ""]


def _machine(report: dict) -> list[str]:
    m = report["machine"]
    d = m["disk"]
    L: list[str] = []
    add = L.append
    add("## Machine and versions\n")
    add(f"- CPU: {m['cpu']} ({m['cores']} cores usable, {m['logical_cpus']} logical; SHA-NI "
        f"{'yes' if m['sha_ni'] else 'no'}); RAM {m['ram_bytes'] / 2**30:.1f} GiB; kernel "
        f"{m['kernel']}")
    add(f"- Disk: {d['device']} mounted on {d['mount']} ({d['type']}, {d['options']}); "
        f"{d['total_bytes'] / 1e9:.0f} GB, {d['free_bytes_at_start'] / 1e9:.0f} GB free at start")
    add(f"- Load average at start {', '.join(f'{x:.2f}' for x in m['load_avg_start'])}; at end "
        f"{', '.join(f'{x:.2f}' for x in m['load_avg_end'])} (other work on the machine shares "
        f"its cores and disk; alternating the commands spreads that noise over both sides)")
    add("- Versions: " + ", ".join(f"{k} {val}" for k, val in report["versions"].items()))
    add("")
    return L


LIMITS = (("sha256_mem_gbps_per_core", "sha256, bytes in memory, 1 core"),
          ("sha256_file_gbps_per_core",
           "sha256 of a page-cached file (hashlib.file_digest), 1 core"),
          ("write_gbps_no_fsync", "sequential write, no fsync (page cache)"),
          ("write_gbps_fsync", "sequential write + fsync (disk)"),
          ("cp_gbps", "cp of a page-cached file (no sync)"),
          ("cp_sync_gbps", "cp + sync"))


def _limits(report: dict) -> list[str]:
    lim = report.get("limits", {})
    if not lim:
        return []
    L: list[str] = []
    add = L.append
    add("## Physical limits measured in this run\n")
    add(f"On {lim['bytes'] / 2**20:.0f} MiB (best / median of the tries):\n")
    add("| limit | best | median |")
    add("|---|---|---|")
    for key, label in LIMITS:
        add(f"| {label} | {lim[key]['best']:.2f} GB/s | {lim[key]['median']:.2f} GB/s |")
    add("")
    return L


def _model_row(nominal: str, i: dict) -> str:
    return (f"| {nominal} | {i['tensor_bytes'] / GB:.3f} GB | {i['shards']} | {i['tensors']} | "
            f"{i['layers']} | {i['dims']['hidden']} | {i['bytes_written'] / GB:.2f} GB | "
            f"{i['bytes_linked'] / GB:.2f} GB |")


def _models(report: dict) -> list[str]:
    models = report["models"]
    L: list[str] = []
    add = L.append
    add("## Models\n")
    add("| nominal | real tensor bytes | shards | tensors | layers | hidden | written | "
        "hardlinked |")
    add("|---|---|---|---|---|---|---|---|")
    for size, pair in sorted(models["sizes"].items(), key=lambda i: float(i[0])):
        add(_model_row(f"{float(size):g} GB nvfp4 (Kimi-K2.5 shape)", pair["kv"]))
    if models.get("fp8"):
        i = models["fp8"]
        add(_model_row(f"{i['params']['size_gb']:g} GB fp8-block (DeepSeek-V3 shape)", i))
    reused = any(p["kv"].get("reused") for p in models["sizes"].values())
    add(f"\nThe no-KV twin of each nvfp4 model (config without the FP8 KV cache, for "
        f"drop-kv-scales) hardlinks every shard. Generation took "
        f"{models['generation_s']:.0f} s"
        f"{' (models reused from an earlier run in the same workdir)' if reused else ''}.\n")
    return L


def _how_to_read(report: dict) -> list[str]:
    return ["## How to read this\n",
            ("See benchmarks/README.md. Ratios are modelpatch / baseline (below 1: modelpatch is "
             "faster or smaller). Every input is read from the page cache; outputs are written "
             "to the same disk. Figures are medians of the timed rounds; the JSON report holds "
             "every run.")]


SECTIONS = (_intro, _targets, _notes, _machine, _limits, _models, *CASE_SECTIONS, _how_to_read)


def markdown(report: dict) -> str:
    lines: list[str] = []
    for section in SECTIONS:
        lines += section(report)
    return "\n".join(lines) + "\n"
