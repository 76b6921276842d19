"""config.json and hf_quant_config.json must hold JSON objects: valid JSON of another type is a
clear error naming the file (exit 2, one line). A directory without them is still inspectable.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_helpers import invoke, save_shard

from patcher.errors import ModelDirError
from patcher.model.inspect_model import inspect_model
from patcher.model.model_dir import ModelDir

NOT_OBJECTS = [("array", "[1]", "an array"), ("empty-array", "[]", "an array"),
               ("string", '"x"', "a string"), ("null", "null", "null"),
               ("number", "3", "a number"), ("boolean", "true", "a boolean")]


def _model(tmp_path: Path, files: dict[str, str]) -> Path:
    model = tmp_path / "m"
    save_shard(model / "model.safetensors", {"w": torch.zeros(3)})
    for name, text in files.items():
        (model / name).write_text(text)
    return model


def _assert_cli_error(model: Path, *needles: str) -> None:
    for args in (["inspect", str(model)], ["inspect", str(model), "--json"]):
        result = invoke(*args)
        assert result.exit_code == 2 and result.exc_info[0] is SystemExit, result.output
        assert "Traceback" not in result.output
        # --json puts the error on stdout as well; plain output leaves stdout empty
        assert (json.loads(result.stdout)["error"]["exit_code"] == 2 if "--json" in args
                else result.stdout == "")
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("modelpatch: error: "), result.stderr
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("filename", ["config.json", "hf_quant_config.json"])
@pytest.mark.parametrize("text, kind", [pytest.param(*c[1:], id=c[0]) for c in NOT_OBJECTS])
def test_config_that_is_not_an_object_is_an_error(tmp_path: Path, filename: str, text: str,
                                                  kind: str):
    files = {"config.json": json.dumps({"model_type": "x"}), filename: text}
    model = _model(tmp_path, files)
    md = ModelDir.open(model)  # JSON files are read lazily
    message = f"is valid JSON but not an object (got {kind})"
    with pytest.raises(ModelDirError) as info:
        inspect_model(md)
    assert info.value.where == str(model / filename)
    assert info.value.message == message
    _assert_cli_error(model, f"{model / filename}: {message}")


def test_accessors(tmp_path: Path):
    model = _model(tmp_path, {"config.json": '{"model_type": "x"}', "other.json": "[1]"})
    md = ModelDir.open(model)
    assert md.config == {"model_type": "x"} and md.hf_quant_config is None
    assert md.json_object("absent.json") is None
    assert md.json("other.json") == [1]     # JSON that may be anything is still read as is
    with pytest.raises(ModelDirError, match="not an object"):
        md.json_object("other.json")


def test_directory_without_configs_is_inspectable(tmp_path: Path):
    model = _model(tmp_path, {})
    md = ModelDir.open(model)
    assert md.config == {} and md.hf_quant_config is None
    report = inspect_model(md)
    assert report["architectures"] == [{"path": "/", "architectures": None, "model_type": None}]
    assert report["quantization"] == {"config": None, "hf_quant_config": None,
                                      "disagreements": []}
    assert report["tensors"]["totals"]["tensors"] == 1
    result = invoke("inspect", str(model))
    assert result.exit_code == 0 and result.stderr == ""
    assert json.loads(invoke("inspect", str(model), "--json").stdout) == \
        json.loads(json.dumps(report))
