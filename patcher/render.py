"""Human-readable renderings of reports. Machines get the same data through ``--json``."""

from __future__ import annotations


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_count(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header), *(fmt.format(*map(str, r)) for r in rows)]


def render_inspect(report: dict) -> str:
    lines = [f"model      {report['path']}" + ("  (HF cache snapshot)" if report["hf_cache_snapshot"] else "")]
    for arch in report["architectures"]:
        names = ", ".join(arch["architectures"] or []) or "-"
        lines.append(f"arch {arch['path']:<14} {names}  model_type={arch['model_type']}")
    lines += _render_quant(report["quantization"])
    t = report["tensors"]["totals"]
    lines.append(f"tensors    {t['tensors']}  params {human_count(t['params'])}  "
                 f"bytes {human_bytes(t['bytes'] + t['scale_bytes'])} "
                 f"(scales {human_bytes(t['scale_bytes'])})")
    for title, key in (("dtype", "per_dtype"), ("group", "per_group")):
        rows = [[name, c["tensors"], human_count(c["params"]), human_bytes(c["bytes"] + c["scale_bytes"])]
                for name, c in report["tensors"][key].items()]
        lines += ["  " + line for line in table(rows, [title, "tensors", "params", "bytes"])]
    s = report["shards"]
    sizes = [f["size"] for f in s["files"]]
    if sizes:
        lines.append(f"shards     {s['count']}  total {human_bytes(s['total_file_bytes'])}  "
                     f"min {human_bytes(min(sizes))}  max {human_bytes(max(sizes))}")
    kv = report["kv_scales"]
    dtypes = sorted({k["dtype"] for k in kv})
    lines.append(f"kv scales  {len(kv)}" + (f" ({', '.join(dtypes)}), e.g. {kv[0]['name']}" if kv else ""))
    idx = report["index"]
    health = "ok" if idx["healthy"] else "DEFECTS"
    lines.append(f"index      {'present' if idx['present'] else 'none'}, {idx['tensors']} tensors, "
                 f"total_size {idx['total_size']}, {health}")
    lines += [f"warning    {w}" for w in idx["warnings"]]
    return "\n".join(lines)


def _render_quant(q: dict) -> list[str]:
    lines = []
    c, h = q["config"], q["hf_quant_config"]
    if c is None and h is None:
        return ["quant      none declared"]
    if c is not None:
        w = c["weights"]
        wdesc = " ".join(f"{k}={v}" for k, v in w.items() if v is not None)
        lines.append(f"quant      config.json{c['path']}: {c['quant_method']} {c['quant_algo'] or ''} "
                     f"{wdesc} kv_cache={c['kv_cache'] or 'none'} ignore={len(c['ignore'])}")
    if h is not None:
        lines.append(f"quant      hf_quant_config.json: {h['producer']} {h['producer_version'] or ''} "
                     f"{h['quant_algo']} group_size={h['group_size']} kv_cache={h['kv_cache'] or 'none'} "
                     f"exclude={len(h['exclude_modules'])}")
    lines += [f"DISAGREE   {d}" for d in q["disagreements"]]
    return lines


def render_plan(plan_json: dict) -> str:
    """A plan as ``terraform plan`` would show it: diffs, then a table of files."""
    lines = [f"recipe {plan_json['recipe']['name']} on {plan_json['base']}", ""]
    for f in plan_json["files"]:
        if f.get("diff"):
            lines.append(f["diff"].rstrip("\n"))
            lines.append("")
        for t in f.get("tensors", {}).get("changed", []):
            lines.append(f"  {f['path']}: {t}")
    marks = {"link": " ", "write-json": "~", "rewrite-shard": "~", "drop": "-", "add": "+"}
    rows = [[f"{marks[f['action']]} {f['path']}", f["action"],
             human_bytes(f["size_before"]) if f["size_before"] is not None else "-",
             human_bytes(f["size_after"]) if f["size_after"] is not None else "-"]
            for f in plan_json["files"]]
    lines += table(rows, ["file", "action", "before", "after"])
    counts: dict[str, int] = {}
    for f in plan_json["files"]:
        counts[f["action"]] = counts.get(f["action"], 0) + 1
    b = plan_json["bytes"]
    lines.append("")
    lines.append("Plan: " + ", ".join(f"{n} {a}" for a, n in sorted(counts.items()))
                 + f"; {human_bytes(b['linked'])} linked, {human_bytes(b['written'])} written.")
    lines += [f"warning: {w}" for w in plan_json["warnings"]]
    return "\n".join(lines)


def render_verify(report: dict) -> str:
    if report["ok"]:
        cached = f" ({report['cached_files']} from the digest cache)" if report["cached_files"] else ""
        return f"OK  {report['checked']} files match the manifest{cached}"
    lines = [f"MISMATCH  {len(report['modified'])} modified, {len(report['missing'])} missing, "
             f"{len(report['extra'])} extra"]
    lines += [f"  modified  {m['path']}: {m['reason']}" for m in report["modified"]]
    lines += [f"  missing   {p}" for p in report["missing"]]
    lines += [f"  extra     {p}" for p in report["extra"]]
    lines += [f"  manifest  modelpatch.provenance.json: {p}"
              for p in report.get("manifest_problems", [])]
    return "\n".join(lines)
