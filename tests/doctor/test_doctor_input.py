"""What ``doctor`` is given: a directory that is no model is refused as ``inspect`` refuses it,
a checkpoint without config.json is a blocker, and ``--fix`` takes the options ``apply`` takes
(``--force`` over its own earlier output from any working directory, ``--link``/``--copy``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli import main


def _model(path: Path, tensors: dict, **files) -> Path:
    from patcher.model.safetensors_io import OutputTensor, encode_header

    path.mkdir()
    header, layout = encode_header([OutputTensor(n, d, s) for n, (d, s) in tensors.items()],
                                   {"format": "pt"})
    (path / "model.safetensors").write_bytes(header + bytes(sum(t.nbytes for t in layout)))
    for name, doc in files.items():
        (path / name).write_text(json.dumps(doc, indent=2))
    return path


def _two_fix_model(path: Path, tied_head: bool = True) -> Path:
    """A Llama whose EOS tokens disagree (fix-eos) and whose tied head is stored (tie-embeddings):
    two fixes, so ``--fix`` stacks the second on the first."""
    weight = ("BF16", (4, 2))
    heads = {"lm_head.weight": weight} if tied_head else {}
    return _model(path, {"model.embed_tokens.weight": weight, **heads}, **{
        "config.json": {"model_type": "llama", "eos_token_id": 128001,
                        "tie_word_embeddings": True},
        "generation_config.json": {"eos_token_id": 128001},
        "tokenizer_config.json": {"eos_token": "<|eot_id|>", "added_tokens_decoder": {
            "128001": {"content": "<|end_of_text|>"}, "128009": {"content": "<|eot_id|>"}}}})


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("what", ["empty", "recipes", "folder of models"])
def test_a_directory_that_is_no_model_is_refused_as_inspect_refuses_it(tmp_path, what):
    folder = tmp_path / "folder"
    folder.mkdir()
    if what == "recipes":
        (folder / "yarn.yaml").write_text("modelpatch: 1\nname: yarn\n")
    elif what == "folder of models":            # examples/out: models one level down
        _model(folder / "m", {"w": ("BF16", (2, 2))}, **{"config.json": {}})
    doctor, inspect = run("doctor", folder), run("inspect", folder)
    line = (f"modelpatch: error: {folder}: not a model directory (no config.json, no "
            f"*.safetensors, no *.gguf)")
    if what == "folder of models":
        line += " (models in subdirectories: m)"
    assert (doctor.exit_code, doctor.stdout, doctor.stderr.strip()) == (2, "", line)
    assert (inspect.exit_code, inspect.stderr.strip()) == (2, line)


def test_safetensors_without_config_json_is_a_blocker(tmp_path):
    model = _model(tmp_path / "m", {"model.embed_tokens.weight": ("BF16", (4, 2))},
                   **{"tokenizer_config.json": {}})
    result = run("doctor", model)
    assert result.exit_code == 1, result.output
    assert "BLOCKER    config-json-missing: the model has safetensors weights but no " \
           "config.json" in result.output
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert "config-json-missing" not in {f.rule for f in api.doctor(model).findings}


def test_fix_force_replaces_its_own_stacked_output_from_another_directory(tmp_path,
                                                                          monkeypatch):
    _two_fix_model(tmp_path / "llama")
    monkeypatch.chdir(tmp_path)
    first = run("doctor", "llama", "--fix", "-o", "fixed")       # relative paths
    assert first.exit_code == 0 and "fixed with fix-eos, tie-embeddings" in first.output
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = run("doctor", "../llama", "--fix", "-o", "../fixed", "--force")
    assert again.exit_code == 0, again.output
    assert api.verify(tmp_path / "fixed").ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "fixed", "llama"]


@pytest.mark.parametrize("args, shared", [([], True), (["--link", "copy"], False),
                                          (["--copy"], False)])
def test_fix_link_says_how_unchanged_files_are_carried(tmp_path, args, shared):
    model = _two_fix_model(tmp_path / "llama", tied_head=False)     # fix-eos: config only
    result = run("doctor", model, "--fix", "-o", tmp_path / "fixed", *args)
    assert result.exit_code == 0, result.output
    shard = "model.safetensors"
    assert os.path.samefile(model / shard, tmp_path / "fixed" / shard) is shared


def test_link_goes_with_fix_out_of_place(tmp_path):
    model = _two_fix_model(tmp_path / "llama")
    assert run("doctor", model, "--link", "copy").exit_code == 2
    refused = run("doctor", model, "--fix", "--in-place", "--copy")
    assert refused.exit_code == 2
    assert refused.stderr.startswith("modelpatch: error: --in-place excludes -o/--output, "
                                     "--link and --copy")
    shutil.rmtree(model)


def test_a_gguf_in_a_subfolder_is_still_a_model(tmp_path):
    from gguf_fixtures import write_tiny

    repo = tmp_path / "repo"
    (repo / "Q8_0").mkdir(parents=True)          # how GGUF repositories keep quantizations
    write_tiny(repo / "Q8_0" / "tiny-Q8_0.gguf")
    assert run("inspect", repo).exit_code == 0
    result = run("doctor", repo)
    assert result.exit_code == 0 and "not a model" not in result.output
