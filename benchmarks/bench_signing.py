#!/usr/bin/env python
"""OMS signing side by side with the reference implementation, in one run.

On a synthetic Kimi-shaped NVFP4 model (``synth.py``, 2 GB by default) a variant is applied
(``sm120-fp16-kv``, config only, as a user would), then, in alternating rounds:

- ``modelpatch sign VARIANT --key K`` against ``model_signing sign key VARIANT``: modelpatch
  signs from the manifest's digests after a fast verify; model_signing rehashes every byte.
  Target: <= 0.05x its wall time.
- ``modelpatch verify VARIANT --key P`` against ``model_signing verify key VARIANT``: both
  rehash every byte. Target: <= 1.0x.

Every command runs in its own process (start-up included, as a user pays it); its peak RSS is
read from ``getrusage`` of the child. A ``--many-shards`` model (119 shards, as
nvidia/Kimi-K2.5-NVFP4 has) times ``modelpatch sign`` alone: its cost grows with files, not bytes.
``--baseline TREE`` also times ``modelpatch sign`` of another checkout (an older commit, from
``git worktree add``) in the same rounds, so before and after share the machine's load.
Bytecode caches are written, as an installed package has them. Every command runs with its
checkout as the working directory (``python -m`` puts the working directory first on
``sys.path``: run elsewhere, it could import another checkout's ``patcher``).
Results: a table on stdout and ``--json FILE``.

Usage:
    python benchmarks/bench_signing.py [--size-gb 2] [--shards 4] [--rounds 3]
                                       [--many-shards 119] [--workdir DIR] [--json FILE]
                                       [--baseline TREE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TARGETS = {"sign": 0.05, "verify": 1.0}


# A small launcher times the command and reads its peak RSS from wait4: a child forked from this
# process would count this process's own pages (the synthetic model's generator) as its peak.
LAUNCHER = """
import os, sys, time
start = time.perf_counter()
pid = os.posix_spawnp(sys.argv[1], sys.argv[1:], os.environ)
_, status, usage = os.wait4(pid, 0)
print(time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def _run(argv: list[str], env: dict) -> tuple[float, int]:
    """(wall seconds, peak RSS in MB) of ``argv`` in a fresh process, in the checkout
    ``env["PYTHONPATH"]`` names; a failure stops the run."""
    with tempfile.TemporaryFile() as err:
        done = subprocess.run([sys.executable, "-c", LAUNCHER, *argv], env=env, stderr=err,
                              stdout=subprocess.PIPE, text=True, cwd=env["PYTHONPATH"])
        wall, rss, code = done.stdout.split()[-3:]
        if int(code) != 0 or done.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv)} failed ({code}): "
                             f"{err.read()[-2000:].decode(errors='replace')}")
    return float(wall), int(rss) // 1024


# ``api.sign`` alone, its imports done: what signing costs once the process is up.
IN_PROCESS = """
import sys, time
from patcher import api
from patcher.signing import bundle, check, files, parse, sign, verify  # noqa: F401
from patcher.signing.keys import load_signer
signer = load_signer(sys.argv[2])
times = []
for _ in range(5):
    start = time.perf_counter()
    api.sign(sys.argv[1], signer)
    times.append(time.perf_counter() - start)
print(sorted(times)[2])
"""


def _keys(directory: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / "bench.key.pem", directory / "bench.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    os.chmod(private, 0o600)
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _model(work: Path, name: str, size_gb: float, shards: int, env: dict) -> Path:
    sys.path.insert(0, str(HERE))
    from synth import generate

    base, out = work / name, work / f"{name}-signed"
    if not base.exists():
        generate(base, size_gb=size_gb, shards=shards)
    if out.exists():
        shutil.rmtree(out)
    modelpatch = [sys.executable, "-m", "patcher.cli"]
    _run([*modelpatch, "apply", "sm120-fp16-kv", str(base), "-o", str(out)], env)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--many-shards", type=int, default=119)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", dest="json_out", type=Path, default=None)
    parser.add_argument("--baseline", type=Path, default=None, metavar="TREE",
                        help="another checkout whose `modelpatch sign` is timed alongside")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-signing-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), MODELPATCH_CACHE_DIR=str(work / "cache"))
    # Start-up as an installed package pays it: with its bytecode cached (pip compiles it; the
    # warm-up writes it here), as model_signing's is in site-packages.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    private, public = _keys(work)
    variant = _model(work, f"kimi-{args.size_gb:g}gb", args.size_gb, args.shards, env)
    size = sum(p.stat().st_size for p in variant.rglob("*") if p.is_file()
               and ".modelpatch" not in p.parts)
    modelpatch = [sys.executable, "-m", "patcher.cli"]
    reference = [sys.executable, "-m", "model_signing"]
    other_sig = work / "reference.sig"
    commands = {
        "sign": ([*modelpatch, "sign", str(variant), "--key", str(private)],
                 [*reference, "sign", "key", str(variant), "--signature", str(other_sig),
                  "--private_key", str(private)]),
        "verify": ([*modelpatch, "verify", str(variant), "--key", str(public)],
                   [*reference, "verify", "key", str(variant), "--signature",
                    str(variant / "model.sig"), "--public_key", str(public)]),
    }
    runs: dict[str, dict[str, list]] = {k: {"modelpatch": [], "model_signing": []}
                                        for k in commands}
    baseline_env = (dict(env, PYTHONPATH=str(args.baseline.resolve()))
                    if args.baseline else None)
    _run(commands["sign"][0], env)          # warm-up: page cache, imports, model.sig present
    if baseline_env:
        _run(commands["sign"][0], baseline_env)
        runs["sign"]["baseline"] = []
    for _ in range(args.rounds):
        for case, (ours, theirs) in commands.items():
            for who, argv_ in (("modelpatch", ours), ("model_signing", theirs)):
                runs[case][who].append(_run(argv_, env))
            if case == "sign" and baseline_env:
                runs[case]["baseline"].append(_run(ours, baseline_env))
    in_process = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(variant), str(private)], env=env, cwd=REPO,
        capture_output=True, text=True, check=True).stdout.split()
    many = _model(work, f"kimi-{args.many_shards}-shards", 0.25, args.many_shards, env)
    many_sign = [_run([*modelpatch, "sign", str(many), "--key", str(private)], env)
                 for _ in range(args.rounds)]

    report = {"model_bytes": size, "shards": args.shards, "rounds": args.rounds, "cases": {},
              "many_shards": {"shards": args.many_shards,
                              "sign_s": statistics.median(w for w, _ in many_sign)},
              "sign_in_process_s": float(in_process[-1]),
              "load_average": {"start": load_before, "end": os.getloadavg()}}
    print(f"model: {size / 1e9:.2f} GB, {args.shards} shards; median of {args.rounds} rounds; "
          f"load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'case':8} {'modelpatch s':>13} {'model_signing s':>16} {'ratio':>7} {'target':>7}"
          f"  {'RSS MB (mp / ms)':>17}")
    for case, by in runs.items():
        ours = statistics.median(w for w, _ in by["modelpatch"])
        theirs = statistics.median(w for w, _ in by["model_signing"])
        ratio = ours / theirs
        rss = (max(r for _, r in by["modelpatch"]), max(r for _, r in by["model_signing"]))
        verdict = "MET" if ratio <= TARGETS[case] else "MISSED"
        report["cases"][case] = {"modelpatch_s": ours, "model_signing_s": theirs,
                                 "ratio": ratio, "target": TARGETS[case], "verdict": verdict,
                                 "peak_rss_mb": {"modelpatch": rss[0], "model_signing": rss[1]},
                                 "runs": by}
        print(f"{case:8} {ours:13.2f} {theirs:16.2f} {ratio:7.3f} {TARGETS[case]:7.2f}"
              f"  {rss[0]:>7} / {rss[1]:<7} {verdict}")
    if baseline_env:
        base = statistics.median(w for w, _ in runs["sign"]["baseline"])
        theirs = report["cases"]["sign"]["model_signing_s"]
        report["baseline"] = {"tree": str(args.baseline), "sign_s": base,
                              "ratio": base / theirs}
        print(f"{'baseline':8} {base:13.2f} {theirs:16.2f} {base / theirs:7.3f} "
              f"{TARGETS['sign']:7.2f}  sign of {args.baseline}")
    print(f"modelpatch sign in process (imports done), median of 5: "
          f"{report['sign_in_process_s']:.3f} s")
    print(f"modelpatch sign, {args.many_shards} shards: "
          f"{report['many_shards']['sign_s']:.2f} s")
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
