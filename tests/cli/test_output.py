"""CLI output: the path apply prints, the bytes
the plan says it links, and what inspect accepts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli import main
from patcher.units import human_bytes

FIXTURE = Path(__file__).parent.parent / "fixtures" / "modelopt" / "llama-nvfp4"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def test_plan_counts_revert_originals_apart_from_the_files_it_links(tmp_path):
    model = tmp_path / "llama"
    shutil.copytree(FIXTURE, model)
    plan = api.plan("kv-scale-names", model).to_json()
    unchanged, carried = plan["bytes"]["unchanged"], plan["bytes"]["linked"] + \
        plan["bytes"]["copied"]
    assert 0 < unchanged < carried          # the rewritten shard's original is kept for revert
    out = CliRunner().invoke(main, ["plan", "kv-scale-names", str(model)]).output
    [line] = [ln for ln in out.splitlines() if ln.startswith("Plan: ")]
    how = {"hardlink": "hardlinked to the base", "reflink": "reflinked",
           "copy": "copied"}[plan["link"]["method"]]
    assert f"written, {human_bytes(unchanged)} {how}; " \
           f"{human_bytes(carried - unchanged)} of originals kept for revert, also {how}." in line


def test_apply_in_place_prints_the_absolute_path(tmp_path, monkeypatch):
    shutil.copytree(FIXTURE, tmp_path / "llama")
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["-q", "apply", "kv-scale-names", "llama", "--in-place"])
    assert out.exit_code == 0, out.output
    assert out.output.strip().splitlines()[-1] == str(tmp_path / "llama")


def test_inspect_of_a_file_names_what_a_model_is(tmp_path):
    (tmp_path / "mk.py").write_text("print()\n")
    out = CliRunner().invoke(main, ["inspect", str(tmp_path / "mk.py")])
    assert out.exit_code == 2
    assert "not a directory (a model is a directory, one .gguf file or hf://ORG/NAME[@REV])" \
        in out.output


def test_gguf_module_groups_are_named_as_safetensors_groups():
    from patcher.gguf.inspect import module_group
    from patcher.model.inspect_model import GROUP_NAMES

    names = {"token_embd.weight": "embeddings", "output.weight": "lm_head",
             "output_norm.weight": "norms", "blk.0.attn_norm.weight": "norms",
             "blk.0.attn_q.weight": "attention", "blk.0.ffn_up.weight": "dense_mlp",
             "blk.0.ffn_up_exps.weight": "routed_experts",
             "blk.0.ffn_up_shexp.weight": "shared_experts", "v.blk.0.attn_q.weight": "vision",
             "blk.3.nextn.eh_proj.weight": "mtp_nextn"}
    assert {n: module_group(n) for n in names} == names
    assert set(names.values()) - set(GROUP_NAMES) == {"mtp_nextn"}
