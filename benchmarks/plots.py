"""The three plots of the scaling study (cases 1-3): time, and for case 3 peak RSS, against model
size, with the physical limits measured in the run as dashed lines."""

from __future__ import annotations

from pathlib import Path

from measure import CORES, log

SECONDS = "seconds (median, min-max bars)"


def _series(ax, by: dict, names: dict, key: str = "wall_s", scale: float = 1.0) -> list[float]:
    """One line per command of ``names`` that ran: the medians, with min-max bars. Returns the
    model sizes (GB) of ``by``."""
    sizes = sorted(by, key=float)
    xs = [by[s]["model_gb"] for s in sizes]
    for name, label in names.items():
        have = [s for s in sizes if by[s]["commands"].get(name, {}).get(key)]
        if not have:
            continue
        px = [by[s]["model_gb"] for s in have]
        ys = [by[s]["commands"][name][key]["median"] * scale for s in have]
        lo = [y - by[s]["commands"][name][key]["min"] * scale for y, s in zip(ys, have)]
        hi = [by[s]["commands"][name][key]["max"] * scale - y for y, s in zip(ys, have)]
        ax.errorbar(px, ys, yerr=[lo, hi], marker="o", capsize=3, label=label)
    return xs


def _style(ax, title: str, ylabel: str) -> None:
    ax.set_xlabel("model size (GB)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(plt, fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _config_only(plt, by: dict, limits: dict, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _series(ax, by, {
        "modelpatch_first_time": "modelpatch apply, first time (hashes everything)",
        "modelpatch_digests_known": "modelpatch apply, digests known",
        "cp_r_json_edit": "cp -r + JSON edit",
        "cp_r_json_edit_sync": "cp -r + JSON edit + sync",
        "modelpatch_first_time_hf_cache": "modelpatch apply, first time, HF cache snapshot"})
    _style(ax, "Config-only patch (sm120-fp16-kv)", SECONDS)
    return _save(plt, fig, out, "case1_config_only.png")


def _verify(plt, by: dict, limits: dict, out: Path) -> str:
    sha = limits.get("sha256_file_gbps_per_core", {}).get("best")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = _series(ax, by, {
        "modelpatch_verify": "modelpatch verify", "hashlib_serial": "hashlib, 1 process",
        f"hashlib_pool{CORES}": f"hashlib, Pool({CORES})"})
    if sha:
        ax.plot([0] + xs, [0] + [x / (sha * CORES) for x in xs], "k--", lw=1,
                label=f"sha256 limit: {CORES} cores x {sha:.2f} GB/s")
        ax.plot([0] + xs, [0] + [x / sha for x in xs], "k:", lw=1,
                label=f"sha256 limit: 1 core x {sha:.2f} GB/s")
    _style(ax, "verify vs hashlib sha256", SECONDS)
    return _save(plt, fig, out, "case2_verify.png")


def _drop_kv(plt, by: dict, limits: dict, out: Path) -> str:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = {"modelpatch_first_time": "modelpatch, first time",
             "modelpatch_digests_known": "modelpatch, digests known",
             "load_save": "load_file/save_file", "load_save_sync": "load_file/save_file + sync"}
    xs = _series(ax, by, names)
    wf = limits.get("write_gbps_fsync", {}).get("median")
    if wf:
        ax.plot([0] + xs, [0] + [x / wf for x in xs], "k--", lw=1,
                label=f"write limit with fsync: {wf:.2f} GB/s")
    _style(ax, "drop-kv-scales: wall time", SECONDS)
    _series(ax2, by, {k: v for k, v in names.items() if "sync" not in k}, key="peak_rss",
            scale=1 / 2**20)
    _style(ax2, "drop-kv-scales: peak RSS (ru_maxrss)", "MiB (median, min-max bars)")
    return _save(plt, fig, out, "case3_drop_kv_scales.png")


PLOTS = (("config_only", _config_only), ("verify", _verify), ("drop_kv_scales", _drop_kv))


def plots(report: dict, out: Path) -> list[str]:
    """Draw the plots of the cases that ran into ``out``; their file names (none without
    matplotlib)."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        log("plots skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = report["cases"]
    limits = report.get("limits", {})
    return [draw(plt, cases[key]["by_size"], limits, out) for key, draw in PLOTS if key in cases]
