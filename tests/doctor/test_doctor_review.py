"""Doctor, after the fresh-eyes review (session 4): --gpu validated, rule text kept whole,
fix commands a shell can run, info fixes, GGUF models, stale quantization configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from examples.generate import make_kimi_nvfp4
from patcher import api
from patcher.cli import main
from patcher.doctor.rules import load_rules
from patcher.errors import InputError, RecipeError


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> Path:
    return make_kimi_nvfp4(tmp_path_factory.mktemp("doctor") / "kimi")


@pytest.mark.parametrize("gpu", ["sm1200", "sm13", "sm91", "12.3", "sm_999"])
def test_gpu_that_no_nvidia_gpu_has_is_refused_in_one_line(kimi, gpu):
    out = CliRunner().invoke(main, ["doctor", str(kimi), "--engine", "vllm==0.15.1",
                                    "--gpu", gpu])
    assert out.exit_code == 2, out.output
    assert f"--gpu {gpu}: no NVIDIA GPU has compute capability" in out.output
    assert len(out.output.strip().splitlines()) <= 2       # the error (and its hint)
    assert "Traceback" not in out.output


@pytest.mark.parametrize("gpu, name", [("sm120", "sm120"), ("sm_90a", "sm90"), ("8.9", "sm89"),
                                       ("sm121", "sm121"), ("sm70", "sm70"), ("sm103", "sm103")])
def test_real_compute_capabilities_are_taken(kimi, gpu, name):
    assert api.doctor(kimi, gpu=gpu)["target"]["gpu"] == name


def test_rule_naming_an_unknown_gpu_is_refused(kimi, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text(
        "doctor: 1\nid: r\nseverity: info\nsummary: s\nevidence:\n"
        "  - {source: x, versions: any}\nwhen:\n  gpu: [sm120, sm1210]\n")
    with pytest.raises(RecipeError, match=r"r\.yaml:8:\d+: gpu: cannot read"):
        api.doctor(kimi, rules=(str(rules),))
