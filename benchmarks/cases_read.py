"""Cases 2, 5 and 6, the commands that only read: ``verify`` against hashlib sha256 per file,
across model sizes; ``inspect`` against ``safe_open``; the cold start of the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from measure import (
    CORES,
    GB,
    PY,
    Bench,
    alternate,
    finish,
    med,
    pair_ratios,
    ratio,
    rmtree,
    summarize,
)

# --------------------------------------------------------------------------- case 2


def _verify_result(runs: dict[str, list[dict]]) -> dict:
    res = summarize(runs)
    pool = f"hashlib_pool{CORES}"
    nbytes = res["modelpatch_verify"]["bytes_hashed"]
    return {"commands": res, "bytes": nbytes, "rounds": len(runs["modelpatch_verify"]),
            "pair_ratios": {"verify_vs_hashlib_pool": pair_ratios(runs, "modelpatch_verify",
                                                                  pool)},
            "ratios": {"verify_vs_hashlib_pool": ratio(res, "modelpatch_verify", pool),
                       "verify_vs_hashlib_serial": ratio(res, "modelpatch_verify",
                                                         "hashlib_serial")},
            "pool_parallelism": med(res, pool, "cpu_s") / med(res, pool),
            "verify_gbps": nbytes / med(res, "modelpatch_verify") / GB,
            "hashlib_pool_gbps": nbytes / med(res, pool) / GB,
            "hashlib_serial_gbps": nbytes / med(res, "hashlib_serial") / GB}


def case_verify(b: Bench, model: Path, size: float, args, warmup: int) -> dict:
    variant = b.work / "out" / f"variant-{size:g}"
    cache = b.work / "caches" / "verify"
    b.measure(b.mp + ["apply", "sm120-fp16-kv", model, "-o", variant, "--force", "-q"],
              env=b.env(b.fresh("cache-variant")))
    hash_script = b.scripts / "hash_files.py"

    def verify():
        r = b.measure(b.mp + ["verify", variant, "--json", "-q"], env=b.env(cache))
        rep = json.loads(r["stdout"])
        if not rep["ok"]:
            raise SystemExit(f"run.py: verify reported a mismatch in {variant}: {rep}")
        r["bytes_hashed"] = rep["hashed_bytes"]
        r["files_hashed"] = rep["hashed_files"]
        return finish(r)

    def hashlib_(jobs: int):
        def run():
            r = b.measure([PY, hash_script, variant, str(jobs)])
            files, nbytes = r["stdout"].split()
            r["files_hashed"], r["bytes_hashed"] = int(files), int(nbytes)
            return finish(r)
        return run

    commands = {"modelpatch_verify": verify, "hashlib_serial": hashlib_(1),
                f"hashlib_pool{CORES}": hashlib_(CORES)}
    runs = alternate(commands, args.repeat, warmup, f"verify {size:g} GB",
                     extra=size == max(args.sizes))
    result = _verify_result(runs)
    rmtree(variant)
    rmtree(cache)
    return result


# --------------------------------------------------------------------------- case 5

def case_inspect(b: Bench, model: Path, info: dict, args) -> dict:
    baseline = b.scripts / "safe_open_get_tensor.py"
    headers = b.scripts / "safe_open_headers.py"

    def inspect():
        r = b.measure(b.mp + ["inspect", "--json", model])
        totals = json.loads(r["stdout"])["tensors"]["totals"]
        if totals["tensors"] != info["tensors"]:
            raise SystemExit(f"run.py: inspect counted {totals['tensors']} tensors, "
                             f"expected {info['tensors']}")
        return finish(r)

    def get_tensor():
        r = b.measure([PY, baseline, model])
        if r["stdout"].split() != [str(info["tensors"]), str(info["tensor_bytes"])]:
            raise SystemExit(f"run.py: safe_open baseline read {r['stdout']!r}")
        return finish(r)

    def hdr():
        return finish(b.measure([PY, headers, model]))

    commands = {"modelpatch_inspect": inspect, "safe_open_get_tensor": get_tensor,
                "safe_open_headers_only": hdr}
    res = summarize(alternate(commands, args.repeat, args.warmup, "inspect"))
    return {"commands": res, "ratios": {
        "inspect_vs_safe_open_get_tensor": ratio(res, "modelpatch_inspect",
                                                 "safe_open_get_tensor"),
        "inspect_vs_safe_open_headers_only": ratio(res, "modelpatch_inspect",
                                                   "safe_open_headers_only"),
    }}


# --------------------------------------------------------------------------- case 6

def importtime(b: Bench, argv: list[str]) -> dict:
    """Run the CLI under ``python -X importtime``: was torch imported, and at what cost?"""
    code = ("import sys; sys.argv = " + repr(["modelpatch"] + argv) +
            "; from patcher.cli import main; main()")
    proc = subprocess.run([PY, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          env=b.base_env, check=False)
    cumulative: dict[str, int] = {}
    total_self = 0
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        try:
            self_us, cum_us, name = int(parts[0]), int(parts[1]), parts[2].strip()
        except (ValueError, IndexError):
            continue          # the column header
        total_self += self_us
        cumulative.setdefault(name, cum_us)
    return {"torch_imported": "torch" in cumulative,
            "torch_import_s": cumulative.get("torch", 0) / 1e6,
            "patcher_cli_import_s": cumulative.get("patcher.cli.commands", 0) / 1e6,
            "all_imports_s": total_self / 1e6, "modules": len(cumulative)}


def case_cold_start(b: Bench, model: Path, args) -> dict:
    def run(cmd):
        return lambda: finish(b.measure(cmd))

    commands = {"modelpatch_help": run(b.mp + ["--help"]),
                "modelpatch_plan_config_only": run(b.mp + ["plan", "sm120-fp16-kv", model]),
                "python_bare": run([PY, "-c", "pass"]),
                "python_import_torch": run([PY, "-c", "import torch"])}
    tiny = args.mode == "tiny"
    res = summarize(alternate(commands, 1 if tiny else max(args.repeat, 3), 0 if tiny else 1,
                              "cold start"))
    return {"commands": res,
            "torch_import_cost_s": med(res, "python_import_torch") - med(res, "python_bare"),
            "importtime": {"help": importtime(b, ["--help"]),
                           "plan": importtime(b, ["plan", "sm120-fp16-kv", str(model)])}}
