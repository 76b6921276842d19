"""dequant-scaling.md and dequant_scaling.png from every ``dequant-scaling-<label>.json`` in the
report directory (bench_dequant_scaling.py): one section per machine, the targets with their
verdicts."""

from __future__ import annotations

import json
from pathlib import Path


def _targets(r: dict) -> list[tuple]:
    """(target, measured, baseline, ratio, limit, met) rows of one machine."""
    rows = []
    for recipe in ("fp8-block-to-bf16", "nvfp4-to-bf16"):
        case = r.get(recipe)
        if not case:
            continue
        cpu = case["cpu"]
        base = cpu["torch_script"]
        best_name = min((k for k in cpu if k != "torch_script"), key=lambda k: cpu[k]["wall_s"])
        # The default split of patcher.thread_budget: -j cores/2 (in this process on 2 cores).
        dname = f"j{max(1, r['cores'] // 2)}"
        d = cpu.get(dname) or cpu["default"]
        rows.append((f"{recipe} CPU wall, default ({dname})", f"{d['wall_s']:.2f} s",
                     f"{base['wall_s']:.2f} s", d["wall_s"] / base["wall_s"], 1.0))
        rows.append((f"{recipe} CPU-seconds, default ({dname})", f"{d['cpu_s']:.1f} CPU-s",
                     f"{base['cpu_s']:.1f} CPU-s", d["cpu_s"] / base["cpu_s"], 1.5))
        gpu = case.get("cuda")
        if gpu:
            best_cpu = cpu[best_name]["wall_s"]
            gname = min((k for k in gpu if k.startswith("cuda_j")), key=lambda k: gpu[k]["wall_s"])
            g = gpu[gname]
            rows.append((f"{recipe} --device cuda ({gname}) vs best CPU ({best_name})",
                         f"{g['wall_s']:.2f} s", f"{best_cpu:.2f} s", g["wall_s"] / best_cpu, 0.5))
            gbps = g["out_bytes"] / g["wall_s"] / 1e9
            fsync = r["limits"]["fsync_write_gbps"]
            rows.append((f"{recipe} --device cuda output GB/s vs fsync write (at least 0.8x)",
                         f"{gbps:.2f} GB/s", f"{fsync:.2f} GB/s", gbps / fsync, "0.8 (>=)"))
    v = r.get("verify")
    if v:
        rows.append(("verify vs hashlib Pool(cores)", f"{v['modelpatch_verify']['wall_s']:.3f} s",
                     f"{v['hashlib_pool']['wall_s']:.3f} s",
                     v["modelpatch_verify"]["wall_s"] / v["hashlib_pool"]["wall_s"], 1.1))
    return rows


def _verdict(ratio: float, limit) -> str:
    if isinstance(limit, str):
        return "MET" if ratio >= float(limit.split()[0]) else "MISSED"
    return "MET" if ratio <= limit else "MISSED"


def _machine(r: dict) -> list[str]:
    L = [f"## {r['label']}: {r['cores']} cores{', ' + r['gpu'] if r.get('gpu') else ''} "
         f"({r['date']})\n",
         f"sha256 {r['limits']['sha256_gbps_per_core']:.2f} GB/s per core; sequential write "
         f"with fsync {r['limits']['fsync_write_gbps']:.2f} GB/s.\n",
         *([r["note"] + "\n"] if r.get("note") else []),
         "| target | measured | baseline | ratio | limit | verdict |", "|---|---|---|---|---|---|"]
    for name, measured, base, ratio, limit in _targets(r):
        L.append(f"| {name} | {measured} | {base} | {ratio:.3f}x | {limit} | "
                 f"**{_verdict(ratio, limit)}** |")
    L.append("")
    for recipe in ("fp8-block-to-bf16", "nvfp4-to-bf16"):
        case = r.get(recipe)
        if not case:
            continue
        L += [f"### {recipe}\n", "| command | wall s | CPU s | output GB/s | runs (wall, CPU) |",
              "|---|---|---|---|---|"]
        cpu = case["cpu"]
        alias = next((k for k, v in cpu.items() if k != "default" and v == cpu.get("default")),
                     None)                      # the -j run stored again as "default"
        for part in ("cpu", "cuda"):
            for name, c in case.get(part, {}).items():
                if name == "default" and alias:
                    continue
                runs = "; ".join(f"{w:.2f}, {c_:.1f}" for w, c_ in c["runs"])
                L.append(f"| {name} | {c['wall_s']:.2f} | {c['cpu_s']:.1f} | "
                         f"{c['out_bytes'] / c['wall_s'] / 1e9:.2f} | {runs} |")
        same = case.get("identical_to_default", {})
        ref = alias or "default -j"
        L.append(f"\nOutput shards byte-identical to those of {ref} (sha256 of every output "
                 f"file): {', '.join(f'{k}: {v}' for k, v in same.items() if k != 'default')}."
                 f"\n")
    m = r.get("manifest_273k")
    if m:
        L.append(f"Manifest of a 273k-tensor apply ({m['manifest_bytes'] / 1e6:.0f} MB): "
                 f"{m['cpu_s']['fast']:.2f} CPU-s, stdlib encoder {m['cpu_s']['stdlib']:.2f} "
                 f"CPU-s ({m['ratio_fast_vs_stdlib']:.3f}x), bytes equal: {m['bytes_equal']}.\n")
    t = r.get("torch_import")
    if t:
        c = t["python_import_torch"]
        L.append(f"`python -c 'import torch'` (what every spawned worker paid first): "
                 f"{c['wall_s']:.2f} s, {c['cpu_s']:.2f} CPU-s.\n")
        g = t.get("python_import_torch_cuda_init")
        if g:
            L.append(f"`python -c` importing torch and making a CUDA tensor (what every "
                     f"`--device cuda` run pays before its first tensor): {g['wall_s']:.2f} s, "
                     f"{g['cpu_s']:.2f} CPU-s.\n")
    for name, text in (r.get("profiles") or {}).items():
        L += [f"Profile of `apply {name}` (cProfile in the process; on Python 3.12 it sees "
              "every thread; tottime first):\n",
              "```", text.strip(), "```", ""]
    o = r.get("openmp_wait_policy_j1")
    if o:
        L.append("OpenMP wait policy, fp8-block-to-bf16 -j 1: " + "; ".join(
            f"{k} {v['wall_s']:.2f} s {v['cpu_s']:.1f} CPU-s" for k, v in o.items()) + ".\n")
    return L


def _plot(reports: list[dict], out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, recipe in zip(axes, ("fp8-block-to-bf16", "nvfp4-to-bf16")):
        for r in reports:
            cpu = (r.get(recipe) or {}).get("cpu")
            if not cpu:
                continue
            js = sorted(int(k[1:]) for k in cpu if k.startswith("j"))
            line = ax.plot(js, [cpu[f"j{j}"]["wall_s"] for j in js], "o-",
                           label=f"{r['label']} modelpatch -j")
            ax.axhline(cpu["torch_script"]["wall_s"], ls="--", color=line[0].get_color(),
                       label=f"{r['label']} torch script")
            for name, c in (r[recipe].get("cuda") or {}).items():
                if name.startswith("cuda_j"):
                    ax.plot([int(name[6:])], [c["wall_s"]], "s", color=line[0].get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("-j (worker processes); squares: --device cuda")
        ax.set_ylabel("wall s")
        ax.set_title(recipe)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "dequant_scaling.png", dpi=90)


def render(out: Path) -> None:
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("dequant-scaling-*.json"))]
    L = ["# Dequantization at the hardware's speed\n",
         "Rendered by `benchmarks/bench_dequant_scaling.py --render` from every "
         "`dequant-scaling-<machine>.json` here (each written by a run on that machine). "
         "Ratios are "
         "modelpatch / baseline of the medians of rounds run side by side; the CUDA rows "
         "compare with the best CPU run (target: at most 0.5x) and the fsync write bandwidth "
         "(target: at least 0.8x).\n"]
    # hand-written: each target, MET or MISSED, and why
    verdicts = out / "dequant-scaling-verdicts.md"
    if verdicts.exists():
        L.append(verdicts.read_text())
    for r in reports:
        L += _machine(r)
    (out / "dequant-scaling.md").write_text("\n".join(L) + "\n")
    _plot(reports, out)
