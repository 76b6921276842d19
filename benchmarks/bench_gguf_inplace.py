"""``apply --in-place`` of a metadata-only GGUF patch whose header fits its header region: only the
header written (``patcher.gguf.header_inplace``) against the whole file rewritten, and the revert
of each.

    PYTHONPATH=. python benchmarks/bench_gguf_inplace.py --gb 1 --rounds 3

The file is bench_gguf.py's (F16 tensors, a 32,000-token vocabulary), generated once in the
workdir; the change is ``{arch}.context_length`` (same size: the header fits). Each round patches
a fresh copy of it (the copy is not timed) with an empty digest cache, so both modes hash the base
too. "whole file" is the same command on a copy that has a second hard link (which
``--in-place`` refuses to write through: the plan says so, and the file is rewritten whole).
The report replaces its own section of ``--report`` (benchmarks/report/gguf.md).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gguf import REPO, make_gguf  # noqa: E402

RECIPE = ("modelpatch: 1\nname: ctx\ndescription: context length\ngguf:\n  metadata:\n"
          "    - {set: \"{arch}.context_length\", value: 8192, type: uint32}\n")
HEADING = "## In place: the header region only, against the whole file"
MODES = ("header only", "whole file")
EXPLAINED = (
    "Both modes read the whole file once to hash it twice (the base's digest, unknown here, for "
    "the revert data and the manifest; the result's for the manifest), in two threads. The "
    "header-only write saves the copy of the tensor data and its write-out: the patched "
    "directory grows by the old header bytes instead of a second copy of the file, and the "
    "disk sees the header region written instead of the whole file. Wall times move with "
    "the load of the shared machine (CPU time is steadier); the hashing is a floor for both, "
    "and on a slow or nearly full disk the difference grows with the file's size. `revert` "
    "hashes three times in both "
    "modes (the patched file against the manifest, the revert data against the record, the "
    "restored file).")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], env: dict) -> tuple[tuple[float, float], str]:
    """((wall seconds, CPU seconds), stdout) of ``modelpatch ARGS``."""
    start, cpu = time.perf_counter(), _cpu()
    r = subprocess.run([sys.executable, "-m", "patcher.cli", *args], env=env, check=True,
                       capture_output=True, text=True)
    return (time.perf_counter() - start, _cpu() - cpu), r.stdout


def _disk_bytes(root: Path) -> int:
    """Bytes allocated to the distinct files under ``root``."""
    inodes = {}
    for path in root.rglob("*"):
        st = path.lstat()
        if path.is_file() and not path.is_symlink():
            inodes[st.st_ino] = st.st_blocks * 512
    return sum(inodes.values())


def one_round(work: Path, base: Path, recipe: Path,
              mode: str) -> tuple[tuple, tuple, str, int]:
    """(apply seconds, revert seconds, the plan's line about the header, bytes the patched
    directory grew by) for one fresh copy."""
    case = work / "case"
    shutil.rmtree(case, ignore_errors=True)
    (case / "m").mkdir(parents=True)
    subprocess.run(["cp", str(base), str(case / "m" / "model.gguf")], check=True)
    if mode == "whole file":
        os.link(case / "m" / "model.gguf", case / "second-link.gguf")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
           "MODELPATCH_CACHE_DIR": str(case / "digest-cache")}
    subprocess.run(["sync"], check=True)
    _, plan = _run(["apply", str(recipe), str(case / "m"), "--in-place", "--dry-run"], env)
    note = next(line for line in plan.splitlines() if "in place" in line)
    before = _disk_bytes(case / "m")
    applied, _ = _run(["-q", "apply", str(recipe), str(case / "m"), "--in-place"], env)
    grew = _disk_bytes(case / "m") - before
    reverted, _ = _run(["-q", "revert", str(case / "m")], env)
    shutil.rmtree(case)
    return applied, reverted, note, grew


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/modelpatch-bench-gguf-inplace"))
    ap.add_argument("--report", type=Path, default=REPO / "benchmarks" / "report" / "gguf.md")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    base = args.workdir / "model.gguf"
    if not base.exists():
        make_gguf(base, args.gb)
    recipe = args.workdir / "ctx.yaml"
    recipe.write_text(RECIPE)
    times = {mode: ([], []) for mode in MODES}
    notes, grew = {}, {}
    for round_no in range(args.rounds + 1):          # the first warms up
        for mode in MODES:
            applied, reverted, notes[mode], grew[mode] = one_round(args.workdir, base, recipe,
                                                                   mode)
            if round_no:
                times[mode][0].append(applied)
                times[mode][1].append(reverted)
    size = base.stat().st_size
    lines = [HEADING, "",
             f"`PYTHONPATH=. python benchmarks/bench_gguf_inplace.py --gb {args.gb:g} --rounds "
             f"{args.rounds}`: a {size / 2**30:.2f} GiB GGUF, `{{arch}}.context_length` set "
             f"(the header fits), `apply --in-place` then `revert`, each on a fresh copy with an "
             f"empty digest cache; {args.rounds} rounds after a warm-up, medians (CPU time, user + "
             f"system, in parentheses; every run's wall time in brackets); {os.cpu_count()} "
             "CPUs shared with other work (load average "
             f"{os.getloadavg()[0]:.1f} at the end). \"whole file\": the same copy with a second "
             f"hard link, which the header-only write refuses.", "",
             "| mode | the plan says | apply --in-place s (CPU s) | revert s (CPU s) | "
             "disk used by the patch |", "|---|---|---:|---:|---:|"]
    for mode in MODES:
        a, r = times[mode]
        lines.append(f"| {mode} | `{notes[mode].lstrip('# ')}` | {_cell(a)} | {_cell(r)} | "
                     f"{grew[mode]:,} bytes |")
    lines += ["", EXPLAINED]
    _replace_section(args.report, "\n".join(lines) + "\n")
    print("\n".join(lines))


def _cell(runs: list[tuple[float, float]]) -> str:
    """Median wall time (median CPU time); every run's wall time in brackets."""
    wall = statistics.median(w for w, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    return f"{wall:.2f} ({cpu:.2f}) [{', '.join(f'{w:.2f}' for w, _ in runs)}]"


def _replace_section(report: Path, section: str) -> None:
    text = report.read_text() if report.exists() else ""
    if HEADING in text:
        head, _, rest = text.partition(HEADING)
        tail = rest[rest.find("\n## "):] if "\n## " in rest else ""
        text = head + section + ("\n" + tail.lstrip("\n") if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    report.write_text(text)


if __name__ == "__main__":
    main()
