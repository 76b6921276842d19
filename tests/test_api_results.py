"""``api.inspect`` and ``api.doctor`` return typed, frozen results (as ``api.plan`` and
``api.apply`` do); the commands render from them, and ``to_json()`` is ``--json``'s document."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from click.testing import CliRunner
from gguf_fixtures import tiny_dir

from patcher import api
from patcher.cli import main
from patcher.doctor.report import DoctorReport, Finding, Fix, FixOutcome
from patcher.model.inspect_report import InspectReport


def cli_json(*args) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["--json", *map(str, args)])
    return result.exit_code, json.loads(result.stdout)


def test_inspect_returns_a_typed_report_that_is_the_json_output(kimi_dir):
    report = api.inspect(kimi_dir)
    assert isinstance(report, InspectReport) and report.format == "safetensors"
    assert report.path == str(kimi_dir) and report.gguf is None and report.remote is None
    assert report.architectures[0]["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert report.shards["count"] == len(list(kimi_dir.glob("*.safetensors")))
    assert report.tensors["totals"]["tensors"] == report.index["tensors"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.path = "elsewhere"                                   # type: ignore[misc]
    code, printed = cli_json("inspect", kimi_dir)
    assert code == 0 and printed == report.to_json()
    assert list(printed)[:3] == ["report_version", "path", "hf_cache_snapshot"]


def test_inspect_of_gguf_alone_and_beside_safetensors(kimi_dir, tmp_path):
    root = tiny_dir(tmp_path)
    for model in (root, root / "tiny.gguf"):
        report = api.inspect(model)
        assert report.format == "gguf" and report.gguf[0]["architecture"] == "llama"
        assert report.tensors is None and report.architectures == ()
        assert cli_json("inspect", model)[1] == report.to_json() == {
            "format": "gguf", "path": str(model), "models": list(report.gguf)}
    mixed = tmp_path / "mixed"
    shutil.copytree(kimi_dir, mixed)
    shutil.copy(root / "tiny.gguf", mixed / "tiny.gguf")
    both = api.inspect(mixed)
    assert both.format == "safetensors" and len(both.gguf) == 1
    assert cli_json("inspect", mixed)[1] == both.to_json()


def test_doctor_returns_a_typed_report_that_is_the_json_output(kimi_dir):
    report = api.doctor(kimi_dir, engine="vllm==0.15.1", gpu="sm120")
    assert isinstance(report, DoctorReport) and report.model == str(kimi_dir)
    assert report.target.engine == "vllm" and report.target.gpu == 120
    assert all(isinstance(f, Finding) for f in report.findings)
    blocker = report.findings[0]
    assert blocker.severity == "blocker" and blocker.rule == "fp8-kv-mla-vllm-sm120"
    assert blocker.fix == Fix("sm120-fp16-kv") and blocker.evidence[0]["source"]
    assert report.blockers == 1 and not report.ok and report.fix is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        blocker.severity = "info"                                   # type: ignore[misc]
    code, printed = cli_json("doctor", kimi_dir, "--engine", "vllm==0.15.1", "--gpu", "sm120")
    assert code == 1 and printed == report.to_json()
    assert printed["blockers"] == 1 and printed["findings"][0]["fix"] == {
        "recipe": "sm120-fp16-kv"}
    unchecked = api.doctor(kimi_dir)
    assert "fp8-kv-mla-vllm-sm120" in {n.rule for n in unchecked.not_checked}


def test_doctor_fix_outcome_is_typed_and_reported_as_json(kimi_dir, tmp_path):
    model = kimi_dir
    out = tmp_path / "fixed"
    code, printed = cli_json("-q", "doctor", model, "--engine", "vllm==0.15.1", "--gpu",
                             "sm120", "--fix", "-o", out)
    assert code == 0, printed
    after = api.doctor(out, engine="vllm==0.15.1", gpu="sm120")
    before = api.doctor(model, engine="vllm==0.15.1", gpu="sm120")
    fixed = dataclasses.replace(before, fix=FixOutcome(tuple(printed["fix"]["recipes"]),
                                                       str(out), after))
    assert fixed.ok and not before.ok and after.blockers == 0
    assert printed == fixed.to_json()
    assert printed["fix"]["recipes"][0] == "sm120-fp16-kv"
