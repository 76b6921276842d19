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


def _plain_scalars_followed_by_comment(text: str) -> list[str]:
    """``line:col value`` of each unquoted scalar that a ``#`` comment follows on its line:
    YAML ends a plain scalar at `` #``, so what looks like its tail is dropped."""
    import yaml

    lines, found = text.splitlines(), []

    def walk(node):
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(key)
                walk(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)
        elif node.style is None:        # plain: neither quoted nor a block scalar
            end = node.end_mark
            if lines[end.line][end.column:].lstrip().startswith("#"):
                found.append(f"{end.line + 1}:{node.start_mark.column + 1} {node.value!r}")

    walk(yaml.compose(text))
    return found


def test_no_builtin_rule_value_is_cut_by_a_comment():
    from patcher.doctor.rules import builtin_rules_dir

    cut = {p.name: _plain_scalars_followed_by_comment(p.read_text())
           for p in sorted(builtin_rules_dir().glob("*.yaml"))}
    assert {name: c for name, c in cut.items() if c} == {}
    assert _plain_scalars_followed_by_comment("a:\n  versions: x (PR #1 in 0.4)\n") == \
        ["2:13 'x (PR'"]


def test_evidence_versions_are_the_whole_text_of_the_rule_file():
    for rule in load_rules():
        raw = Path(rule.source).read_text()
        for evidence in rule.evidence:
            line = next(ln for ln in raw.splitlines()
                        if "versions:" in ln and evidence["versions"] in ln)
            shown = line.split("versions:", 1)[1].strip().rstrip("}").strip().strip("\"'")
            assert shown == evidence["versions"], (rule.id, line)
