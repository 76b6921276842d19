"""The text of an ``inspect`` report with GGUF models (``patcher.gguf.inspect``)."""

from __future__ import annotations

from .render import human_bytes, render_inspect, table


def render_gguf_report(report: dict) -> str:
    """The text of an inspect report that has GGUF models (alone, or beside safetensors)."""
    if report.get("format") == "gguf":
        return "\n".join([f"model      {report['path']}", *render_gguf(report["models"])])
    return "\n".join([render_inspect(report), "", *render_gguf(report["gguf"])])


def render_gguf(reports: list[dict]) -> list[str]:
    """Per GGUF model: header line, split layout, metadata, tensors by type and by group."""
    lines = []
    for r in reports:
        split = r["split"]
        lines += [f"gguf       {r['name']}  (GGUF v{r['version']}, architecture "
                  f"{r['architecture']}, alignment {r['alignment']})",
                  f"files      {split['count']}" + (" (split set, consistent)"
                                                   if split["count"] > 1 else "")
                  + (f" ({split['note']})" if split.get("note") else ""), ""]
        width = max((len(k) for k in r["metadata"]), default=0)
        lines += [f"  {k:<{width}}  {m['type']:<16} {m['value']}"
                  for k, m in r["metadata"].items()]
        lines.append("")
        lines += table([[k, c["tensors"], human_bytes(c["bytes"])]
                        for k, c in r["tensors"]["by_type"].items()], ["type", "tensors", "bytes"])
        lines.append("")
        lines += table([[k, c["tensors"], human_bytes(c["bytes"])]
                        for k, c in r["tensors"]["by_group"].items()],
                       ["group", "tensors", "bytes"])
        lines.append("")
    return lines
