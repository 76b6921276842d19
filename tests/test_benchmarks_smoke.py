"""Smoke test of the benchmark suite (benchmarks/run.py) at its smallest size.

The suite itself is not part of the test command (a full run takes minutes); this runs it with
``--tiny`` (one 20 MB model, one round, no warm-up) so that it cannot silently rot: every case
must run and land in the report. No timing is asserted.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks" / "run.py"
CASES = ["config_only", "config_only_tensor_count", "verify", "drop_kv_scales", "fp8_to_bf16",
         "inspect", "cold_start"]
TARGETS = ["config_only_first_time", "config_only_digests_known",
           "config_only_digests_known_tensor_count", "verify_vs_hashlib", "drop_kv_time",
           "drop_kv_peak_rss"]


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def test_synthetic_model_is_exact(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import synth
    finally:
        sys.path.remove(str(REPO / "benchmarks"))

    big = synth.generate(tmp_path / "big", size_gb=0.02, shards=2, sync=False)
    nokv = synth.generate(tmp_path / "nokv", size_gb=0.02, shards=2, kv_cache="none",
                          link_from=[tmp_path / "big"], sync=False)
    assert big["shards"] == 2 and big["shards_without_kv_scales"] == 0
    assert nokv["bytes_written"] == 0          # every shard hardlinked from the twin
    index = json.loads((tmp_path / "big" / "model.safetensors.index.json").read_text())
    total, names = 0, set()
    for shard in sorted((tmp_path / "big").glob("*.safetensors")):
        header = _header(shard)
        header.pop("__metadata__")
        end = max(t["data_offsets"][1] for t in header.values())
        assert shard.stat().st_size == 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0] + end
        total += sum(t["data_offsets"][1] - t["data_offsets"][0] for t in header.values())
        names |= set(header)
        assert any(n.endswith("k_proj.k_scale") for n in header)
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"]) == names
    config = json.loads((tmp_path / "big" / "config.json").read_text())
    assert config["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    assert "kv_cache_scheme" not in json.loads(
        (tmp_path / "nokv" / "config.json").read_text())["quantization_config"]


@pytest.mark.slow
def test_benchmark_suite_runs_every_case(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, str(RUN), "--tiny", "--workdir", str(tmp_path / "work"),
                           "--out", str(out)], capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]

    report = json.loads((out / "report.json").read_text())
    assert set(CASES) <= set(report["cases"])
    for case in ("config_only", "verify", "drop_kv_scales"):
        assert report["cases"][case]["by_size"], case
    # The smallest size is also the largest here, so the extra commands ran too.
    by = report["cases"]["config_only"]["by_size"]
    assert all(c["modelpatch_first_time_hf_cache"]["bytes_hashed"]
               < c["modelpatch_first_time"]["bytes_hashed"] for c in
               (v["commands"] for v in by.values()))
    assert [t["id"] for t in report["targets"]] == TARGETS
    assert all(t["verdict"] in ("MET", "MISSED") for t in report["targets"])
    for key in ("cpu", "cores", "ram_bytes", "disk"):
        assert key in report["machine"]
    for dist in ("python", "modelpatch", "torch", "safetensors", "huggingface_hub"):
        assert report["versions"].get(dist)
    assert report["limits"]["sha256_file_gbps_per_core"]["best"] > 0

    md = (out / "report.md").read_text()
    for heading in ("## Targets", "## 1.", "## 1b.", "## 2.", "## 3.", "## 4.", "## 5.",
                    "## 6.", "## Physical limits"):
        assert heading in md
    for png in ("case1_config_only.png", "case2_verify.png", "case3_drop_kv_scales.png"):
        assert (out / png).stat().st_size > 1000
        assert png in report["plots"]
