"""Human-readable renderings of reports. Machines get the same data through ``--json``.

Each ``render_*`` first passes its report through ``printable_fields``: a tensor name, an
architecture or a GGUF key holding a newline or a control character is shown escaped on its
one line, never as a line of its own (``cli.output.echo`` escapes controls once more)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..display import printable_fields
from ..model.inspect_report import GGUF
from ..units import human_bytes, human_count, plural  # noqa: F401  (renderings use them)

if TYPE_CHECKING:
    from ..model.inspect_report import InspectReport


def shorten(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters (at least 20): whitespace runs
    collapsed, cut at a word and ended with "…" when it is longer."""
    text, width = " ".join(text.split()), max(width, 20)
    if len(text) <= width:
        return text
    cut = text[:width].rsplit(" ", 1)[0] if " " in text[:width] else text[:width - 1]
    return cut.rstrip(" ,;:.-") + "…"


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header), *(fmt.format(*map(str, r)) for r in rows)]


def render_inspect(typed: InspectReport) -> str:
    """The text of the report of a model of config.json and safetensors."""
    return _inspect_text(printable_fields(typed.to_json()))


def _inspect_text(report: dict) -> str:
    cache_note = "  (HF cache snapshot)" if report["hf_cache_snapshot"] else ""
    lines = [f"model      {report['path']}{cache_note}"]
    for arch in report["architectures"]:
        names = ", ".join(arch["architectures"] or []) or "-"
        lines.append(f"arch {arch['path']:<14} {names}  model_type={_or_dash(arch['model_type'])}")
    lines += _render_quant(report["quantization"])
    t = report["tensors"]["totals"]
    lines.append(f"tensors    {t['tensors']}  params {human_count(t['params'])}  "
                 f"bytes {human_bytes(t['bytes'] + t['scale_bytes'])} "
                 f"(scales {human_bytes(t['scale_bytes'])})")
    for title, key in (("dtype", "per_dtype"), ("group", "per_group")):
        rows = [[name, c["tensors"], human_count(c["params"]),
                 human_bytes(c["bytes"] + c["scale_bytes"])]
                for name, c in report["tensors"][key].items()]
        lines += ["  " + line for line in table(rows, [title, "tensors", "params", "bytes"])]
    s = report["shards"]
    sizes = [f["size"] for f in s["files"]]
    if sizes:
        lines.append(f"shards     {s['count']}  total {human_bytes(s['total_file_bytes'])}  "
                     f"min {human_bytes(min(sizes))}  max {human_bytes(max(sizes))}")
    kv = report["kv_cache_tensors"]
    dtypes = sorted({k["dtype"] for k in kv})
    kinds = ", ".join(plural(sum(k["kind"] == kind for k in kv), kind, many)
                      for kind, many in (("scale", "scales"), ("bias", "biases"))
                      if any(k["kind"] == kind for k in kv))
    lines.append(f"kv cache   {len(kv)}" + (f" ({kinds}; {', '.join(dtypes)}), e.g. {kv[0]['name']}"
                                           if kv else ""))
    idx = report["index"]
    health = "ok" if idx["healthy"] else "DEFECTS"
    lines.append(f"index      {'present' if idx['present'] else 'none'}, {idx['tensors']} tensors, "
                 f"total_size {_or_dash(idx['total_size'])}, {health}")
    lines += [f"warning    {w}" for w in idx["warnings"]]
    return "\n".join(lines)


def _or_dash(value) -> str:
    """A missing value (JSON null) as ``-``, never Python's ``None``."""
    return "-" if value is None else str(value)


def _render_quant(q: dict) -> list[str]:
    lines = []
    c, h = q["config"], q["hf_quant_config"]
    if c is None and h is None:
        return ["quant      none declared"]
    if c is not None:
        w = c["weights"]
        wdesc = " ".join(f"{k}={v}" for k, v in w.items() if v is not None)
        lines.append(f"quant      config.json{c['path']}: {_or_dash(c['quant_method'])} "
                     f"{c['quant_algo'] or ''} "
                     f"{wdesc} kv_cache={c['kv_cache'] or 'none'} ignore={len(c['ignore'])}")
    if h is not None:
        lines.append(f"quant      hf_quant_config.json: {_or_dash(h['producer'])} "
                     f"{h['producer_version'] or ''} {_or_dash(h['quant_algo'])} "
                     f"group_size={_or_dash(h['group_size'])} kv_cache={h['kv_cache'] or 'none'} "
                     f"exclude={len(h['exclude_modules'])}")
    lines += [f"DISAGREE   {d}" for d in q["disagreements"]]
    return lines


def recipe_source(recipe: dict) -> str:
    """Which recipe file was run: a file in the current directory must never pass for a
    built-in recipe unnoticed."""
    if recipe.get("components"):
        return "\n".join(recipe_source(c) for c in recipe["components"])
    return f"recipe file {recipe.get('path') or '(text)'} sha256 {recipe['sha256']}"


def content_sources(changes: list[dict]) -> list[str]:
    """Where each ``from:`` content came from, resolved (the hub commit), and its sha256."""
    return [f"content {c['target']} <- {c.get('resolved') or c['from']}"
            + (f"#{c['pointer']}" if c.get("pointer") else "") + f" sha256 {c['sha256']}"
            for c in changes if c.get("kind") == "content_source"]


def render_plan(plan_json: dict) -> str:
    """A plan as ``terraform plan`` would show it: diffs, then a table of files."""
    plan_json = printable_fields({**plan_json, "files": [
        {**f, "diff": f["diff"].splitlines()} if f.get("diff") else f
        for f in plan_json["files"]]})                  # a diff's own lines stay lines
    lines = [f"recipe {plan_json['recipe']['name']} on {plan_json['base']}",
             recipe_source(plan_json["recipe"]), *content_sources(plan_json["changes"]), ""]
    for f in plan_json["files"]:
        if f.get("diff"):
            lines += [*f["diff"], ""]
    lines += render_tensor_changes(plan_json["changes"])
    marks = {"link": " ", "write-json": "~", "rewrite-shard": "~", "drop": "-", "add": "+"}
    rows = [[f"{marks[f['action']]} {f['path']}", f["action"],
             human_bytes(f["size_before"]) if f["size_before"] is not None else "-",
             human_bytes(f["size_after"]) if f["size_after"] is not None else "-"]
            for f in plan_json["files"]]
    lines += table(rows, ["file", "action", "before", "after"])
    counts: dict[str, int] = {}
    for f in plan_json["files"]:
        counts[f["action"]] = counts.get(f["action"], 0) + 1
    lines.append("")
    lines.append("Plan: " + ", ".join(f"{n} {a}" for a, n in sorted(counts.items()))
                 + f"; {_carried_text(plan_json)}.")
    lines += _link_lines(plan_json.get("link"))
    lines += [f"warning: {w}" for w in plan_json["warnings"]]
    return "\n".join(lines)


_CARRIED = {"reflink": "reflinked", "hardlink": "hardlinked to the base", "copy": "copied"}


def _carried_text(plan_json: dict) -> str:
    """``2.00 KiB written, 1.10 GiB copied``: how much is written, and how the rest travels."""
    b, link = plan_json["bytes"], plan_json.get("link")
    written = f"{human_bytes(b['written'])} written"
    if link is None:                                   # in place: the rest stays where it is
        return f"{written}, {human_bytes(b['unchanged'])} unchanged"
    carried, how = b["linked"] + b["copied"], _CARRIED[link["method"]]
    originals = carried - b["unchanged"]            # the rewritten files' originals, for revert
    text = f"{written}, {human_bytes(b['unchanged'])} {how}"
    return text + (f"; {human_bytes(originals)} of originals kept for revert, also {how}"
                   if originals > 0 else "")


def _link_lines(link: dict | None) -> list[str]:
    if link is None:
        return []
    lines = [f"link: {link['method']} into {link['output']} ({link['reason']})"]
    if link["method"] == "hardlink":
        lines.append("note: a hardlinked file is the base's file: editing one edits both "
                     "(--link copy, or a reflink filesystem, gives independent files)")
    return lines


TENSOR_KINDS = {"tensor_converted": ("~", "converted"), "tensor_renamed": (">", "renamed"),
                "tensor_dropped": ("-", "dropped"), "tensor_added": ("+", "added")}


def render_tensor_changes(changes: list[dict], per_shard: int = 20) -> list[str]:
    """Every tensor the plan touches, by base shard (shards and tensors in natural order), with
    dtype and shape before and after. A scale or other companion is indented under its weight
    by its own short name (from whichever shard it comes). About ``per_shard`` lines a shard,
    then "... and N more" tensors (the ``--json`` plan lists them all)."""
    touched = [c for c in changes if c.get("kind") in TENSOR_KINDS]
    if not touched:
        return []
    counts: dict[str, int] = {}
    for c in touched:
        word = TENSOR_KINDS[c["kind"]][1]
        counts[word] = counts.get(word, 0) + 1
    owners = {c["tensor"] for c in touched if not c.get("companion_of")}
    companions: dict[str, list[dict]] = {}
    groups: dict[str, list[dict]] = {}
    for c in touched:
        if c.get("companion_of") in owners:
            companions.setdefault(c["companion_of"], []).append(c)
        else:
            groups.setdefault(c.get("shard") or "(no shard)", []).append(c)
    lines = [f"tensors: {len(touched)} touched ("
             + ", ".join(f"{n} {w}" for w, n in counts.items()) + ")"]
    for shard in sorted(groups, key=lambda s: (s == "(no shard)", natural_key(s))):
        lines.append(f"  {shard}")
        block: list[str] = []
        entries = sorted(groups[shard], key=lambda c: natural_key(c["tensor"]))
        for i, c in enumerate(entries):
            own = sorted(companions.get(c["tensor"], []), key=lambda x: natural_key(x["tensor"]))
            if len(block) + 1 + len(own) > per_shard and block:
                rest = sum(1 + len(companions.get(e["tensor"], [])) for e in entries[i:])
                block.append(f"    ... and {rest} more (--json lists them all)")
                break
            block.append(f"    {TENSOR_KINDS[c['kind']][0]} {_tensor_line(c)}")
            block += [f"        {TENSOR_KINDS[x['kind']][0]} "
                      f"{_companion_line(x, c['tensor'], shard)}" for x in own]
        lines += block
    return lines + [""]


def natural_key(text: str) -> list:
    """Sort key that puts ``layers.2`` before ``layers.10``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", text)]


def _layout_text(layout: dict | None) -> str:
    return "-" if layout is None else f"{layout['dtype']}{layout['shape']}"


def _companion_line(c: dict, owner: str, owner_shard: str) -> str:
    """A companion under its weight: the name after the module they share, its layout, and its
    shard when that is not the weight's."""
    module = owner.rsplit(".", 1)[0] + "."
    name = c["tensor"][len(module):] if c["tensor"].startswith(module) else c["tensor"]
    layout = _layout_text(c.get("after") if c["kind"] == "tensor_added" else c.get("before"))
    elsewhere = c.get("shard") and c["shard"] != owner_shard
    return f"{name}  {layout}" + (f"  (in {c['shard']})" if elsewhere else "")


def _tensor_line(c: dict) -> str:
    before, after = _layout_text(c.get("before")), _layout_text(c.get("after"))
    kind = c["kind"]
    if kind == "tensor_renamed":
        return f"{c['tensor']} -> {c['to']}  {after}"
    if kind == "tensor_dropped":
        why = f"  (companion of {c['companion_of']})" if c.get("companion_of") else "  (drop)"
        return f"{c['tensor']}  {before}{why}"
    if kind == "tensor_added":
        of = c.get("companion_of") or c.get("copy_of") or c.get("split_from")
        return f"{c['tensor']}  {after}  ({c.get('reason', 'added')} of {of})"
    name = c["tensor"] + (f" -> {c['to']}" if c.get("to") else "")
    return f"{name}  {before} -> {after}  ({c['how']})"


def _shared_text(shared: list[str] | None) -> str:
    """The hardlinks a modified file has: they are the same file and changed with it."""
    if not shared:
        return ""
    return f"; shares its inode (hardlink) with {', '.join(shared)}: changed there too"


def render_verify(report: dict) -> str:
    report = printable_fields(report)
    if report["ok"]:
        cached = (f" ({report['cached_files']} from the digest cache)"
                  if report["cached_files"] else "")
        against = report.get("against", "the manifest")
        verb = "matches" if report["checked"] == 1 else "match"
        return f"OK  {plural(report['checked'], 'file')} {verb} {against}{cached}"
    lines = [f"MISMATCH  {len(report['modified'])} modified, {len(report['missing'])} missing, "
             f"{len(report['extra'])} extra"]
    lines += [f"  modified  {m['path']}: {m['reason']}" + _shared_text(m.get("shared_with"))
              for m in report["modified"]]
    lines += [f"  missing   {p}" for p in report["missing"]]
    lines += [f"  extra     {p}" for p in report["extra"]]
    lines += [f"  manifest  modelpatch.provenance.json: {p}"
              for p in report.get("manifest_problems", [])]
    lines += [f"  layout    {p}" for p in report.get("layout_problems", [])]
    return "\n".join(lines)


def render_gguf_report(typed: InspectReport) -> str:
    """The text of an inspect report that has GGUF models (alone, or beside safetensors)."""
    report = printable_fields(typed.to_json())
    if typed.format == GGUF:
        return "\n".join([f"model      {report['path']}", *render_gguf(report["models"])])
    return "\n".join([_inspect_text(report), "", *render_gguf(report["gguf"])])


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
