"""The baseline scripts the cases run as child processes: the ones of this suite, and those it
reuses from bench_tensor.py (cases 3 and 4) and bench_inspect.py (case 5)."""

from __future__ import annotations

from pathlib import Path

# Case 1: what ``cp -r`` is followed by, the JSON edit of the config-only patch.
EDIT_JSON = r"""
import json, os, sys
d = sys.argv[1]
path = os.path.join(d, "config.json")
with open(path) as f:
    config = json.load(f)
for scope in (config, config.get("text_config") or {}):
    quant = scope.get("quantization_config")
    if isinstance(quant, dict):
        quant.pop("kv_cache_scheme", None)
with open(path, "w") as f:
    json.dump(config, f, indent=4)
path = os.path.join(d, "hf_quant_config.json")
if os.path.exists(path):
    with open(path) as f:
        hq = json.load(f)
    hq.get("quantization", {}).pop("kv_cache_quant_algo", None)
    hq.pop("kv_cache_quant_algo", None)
    with open(path, "w") as f:
        json.dump(hq, f, indent=4)
"""

# Case 2: sha256 of every file of a model, in 1 process or a Pool of N.
HASH_FILES = r"""
import hashlib, os, sys
from multiprocessing import Pool

def digest(path):
    with open(path, "rb") as f:
        return path, hashlib.file_digest(f, "sha256").hexdigest()

root, jobs = sys.argv[1], int(sys.argv[2])
files = sorted((os.path.join(root, n) for n in os.listdir(root)
                if n != "modelpatch.provenance.json" and os.path.isfile(os.path.join(root, n))),
               key=os.path.getsize, reverse=True)
if jobs == 1:
    results = [digest(p) for p in files]
else:
    with Pool(jobs) as pool:
        results = pool.map(digest, files, chunksize=1)
print(len(results), sum(os.path.getsize(p) for p in files))
"""

# Case 5: safe_open of every shard, reading headers only.
SAFE_OPEN_HEADERS = r"""
import sys
from pathlib import Path
from safetensors import safe_open

count = 0
for path in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with safe_open(str(path), framework="pt") as f:
        f.metadata()
        for name in f.keys():
            s = f.get_slice(name)
            s.get_shape(), s.get_dtype()
            count += 1
print(count)
"""

# Case 1b: json.loads of every shard header, the floor of any Python header reader.
JSON_HEADERS = r"""
import json, struct, sys
from pathlib import Path

count = 0
for path in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        count += len(json.loads(f.read(n))) - 1
print(count)
"""


def bench_tensor_scripts() -> dict:
    """The baselines of benchmarks/bench_tensor.py (owned by the tensor-transform work)."""
    try:
        import bench_tensor
        return {"load_save_drop": bench_tensor.LOAD_SAVE_DROP,
                "fp8_cast_bf16": bench_tensor.FP8_CAST_BF16,
                "kv_scale_re": bench_tensor.KV_SCALE_RE}
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"run.py: cases 3 and 4 reuse the baselines of benchmarks/"
                         f"bench_tensor.py, which cannot be imported: {exc!r}")


def bench_inspect_baseline() -> str:
    """The safe_open + get_tensor baseline of benchmarks/bench_inspect.py."""
    try:
        import bench_inspect
        return bench_inspect.BASELINE
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"run.py: case 5 reuses benchmarks/bench_inspect.py's baseline, which "
                         f"cannot be imported: {exc!r}")


def write_scripts(scripts_dir: Path, cases: list[int]) -> dict:
    """Write the baseline scripts the selected cases run into ``scripts_dir``; returns
    bench_tensor.py's scripts and KV-scale pattern (empty without cases 3 and 4)."""
    scripts_dir.mkdir(exist_ok=True)
    tensor_scripts = bench_tensor_scripts() if {3, 4} & set(cases) else {}
    (scripts_dir / "edit_json.py").write_text(EDIT_JSON)
    (scripts_dir / "hash_files.py").write_text(HASH_FILES)
    (scripts_dir / "safe_open_headers.py").write_text(SAFE_OPEN_HEADERS)
    (scripts_dir / "json_headers.py").write_text(JSON_HEADERS)
    if 5 in cases:
        (scripts_dir / "safe_open_get_tensor.py").write_text(bench_inspect_baseline())
    if tensor_scripts:
        (scripts_dir / "load_save_drop.py").write_text(tensor_scripts["load_save_drop"])
        (scripts_dir / "fp8_cast_bf16_cpu.py").write_text(tensor_scripts["fp8_cast_bf16"])
    return tensor_scripts
