"""Safetensors files the model does not load: a shard the index forgot is an index defect, a
sharded model without its index is an error, and unrelated files stay opaque (with a warning
that says why they are not loaded).

Each defect is checked through the library (``ModelDir.open``) and through ``modelpatch inspect``
(exit 2, exactly one line on stderr, no traceback).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_helpers import assert_cli_error, expect_error, invoke, save_shard
from tensor_helpers import write_model

from patcher import api
from patcher.errors import ShardIndexError
from patcher.model.model_dir import INDEX_NAME, ModelDir
from patcher.recipe.load import load_recipe

S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
CONFIG_ONLY = "modelpatch: 1\nname: c\ndescription: x\nconfig:\n  config.json:\n" \
              "    - set: /use_cache\n      value: false\n"


def _two_shards(tmp_path: Path, weight_map: dict[str, str], prefix: str = "") -> Path:
    """Shards S1 = {a} and S2 = {b} (under ``prefix``) and an index with ``weight_map``."""
    model = tmp_path / "m"
    save_shard(model / f"{prefix}{S1}", {"a": torch.zeros(2)})
    save_shard(model / f"{prefix}{S2}", {"b": torch.zeros(3)})
    total = 8 * sum(1 for s in weight_map.values() if s.endswith(S1)) + \
        12 * sum(1 for s in weight_map.values() if s.endswith(S2))
    (model / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total},
                                                "weight_map": weight_map}))
    (model / "config.json").write_text(json.dumps({"model_type": "test"}))
    return model


# --- a shard the index does not reference ------------------------------------------------------


def test_index_missing_a_shard_of_its_own_set_is_a_defect(tmp_path: Path):
    model = _two_shards(tmp_path, {"a": S1})
    index = model / INDEX_NAME
    message = f"does not reference {S2}, a shard of the same set as {S1} (it holds 1 tensor(s))"
    with expect_error(ShardIndexError, index, message):
        ModelDir.open(model)
    assert_cli_error(model, str(index), message)
    assert_cli_error(model, str(index), message, json_flag=True)


def test_unreferenced_shard_in_a_subdirectory_set_is_a_defect(tmp_path: Path):
    model = _two_shards(tmp_path, {"a": f"weights/{S1}"}, prefix="weights/")
    message = f"does not reference weights/{S2}, a shard of the same set as weights/{S1}"
    with expect_error(ShardIndexError, model / INDEX_NAME, message):
        ModelDir.open(model)
    assert_cli_error(model, str(model / INDEX_NAME), message)


def test_a_forgotten_shard_is_counted_with_other_index_defects(tmp_path: Path):
    model = _two_shards(tmp_path, {"a": S1, "ghost": S1})
    with pytest.raises(ShardIndexError) as info:
        ModelDir.open(model)
    assert "(and 1 more index defects)" in info.value.message
    assert sorted(d.message.split(",")[0] for d in info.value.defects) == [
        f"does not reference {S2}", f"index places it in {S1}"]


@pytest.mark.parametrize("stray", [
    "consolidated.safetensors",                 # another format's single file
    "model-00001-of-00003.safetensors",         # a stale shard of another layout
    "other-00002-of-00002.safetensors",         # another prefix
    f"sub/{S2}",                                # another directory
    "model-2-of-2.safetensors",                 # not transformers' numbering
])
def test_unrelated_safetensors_files_stay_opaque(tmp_path: Path, stray: str):
    model = _two_shards(tmp_path, {"a": S1, "b": S2})
    save_shard(model / stray, {"a": torch.zeros(1)})
    md = ModelDir.open(model)
    assert md.model_shards == [S1, S2] and md.tensor("a").shape == (2,)
    assert md.warnings == [f"{stray}: not referenced by {INDEX_NAME}; left as an opaque file"]
    result = invoke("inspect", str(model))
    assert result.exit_code == 0 and f"warning    {stray}: not referenced" in result.stdout


# --- no index ----------------------------------------------------------------------------------


@pytest.mark.parametrize("names", [[S1, S2], [S2], ["model-00001-of-00001.safetensors"]])
def test_sharded_model_without_an_index_is_an_error(tmp_path: Path, names: list[str]):
    model = tmp_path / "m"
    for i, name in enumerate(names):
        save_shard(model / name, {f"t{i}": torch.zeros(2)})
    message = f"sharded model without {INDEX_NAME}: {len(names)} shard file(s) such as {names[0]}"
    with expect_error(ShardIndexError, model, message):
        ModelDir.open(model)
    line = assert_cli_error(model, str(model), message, f"download {INDEX_NAME}")
    assert "not referenced" not in line


def test_without_an_index_the_warning_does_not_mention_one(tmp_path: Path):
    model = tmp_path / "m"
    save_shard(model / "model.safetensors", {"w": torch.zeros(2)})
    save_shard(model / S1, {"old": torch.zeros(2)})          # leftover: model.safetensors wins
    save_shard(model / "consolidated.safetensors", {"w": torch.zeros(2)})
    md = ModelDir.open(model)
    assert md.model_shards == ["model.safetensors"]
    reason = f"not loaded: there is no {INDEX_NAME}, and only model.safetensors is loaded " \
             f"without one; left as an opaque file"
    assert md.warnings == [f"consolidated.safetensors: {reason}", f"{S1}: {reason}"]
    assert not any("not referenced by" in w for w in md.warnings)


def test_only_an_unrelated_file_and_no_index_is_an_empty_model_with_a_warning(tmp_path: Path):
    model = tmp_path / "m"
    save_shard(model / "consolidated.safetensors", {"w": torch.zeros(2)})
    md = ModelDir.open(model)
    assert md.model_shards == [] and md.warnings[0].startswith("consolidated.safetensors: not "
                                                               "loaded: there is no ")
    assert invoke("inspect", str(model)).exit_code == 0


# --- what modelpatch itself writes still reads -------------------------------------------------


@pytest.mark.parametrize("max_shard_size, shards", [(2048, 3), (5 * 10**9, 1)])
def test_resharded_variants_read_cleanly(tmp_path: Path, max_shard_size: int, shards: int):
    tensors = {f"w{i}": torch.full((256,), float(i)) for i in range(6)}       # 1 KiB each
    base = write_model(tmp_path / "m", {S1: dict(list(tensors.items())[:3]),
                                        S2: dict(list(tensors.items())[3:])})
    out = api.apply(load_recipe(CONFIG_ONLY), base, out=tmp_path / "v",
                    max_shard_size=max_shard_size).output
    md = ModelDir.open(out)
    assert len(md.model_shards) == shards and md.warnings == []
    assert set(md.tensor_shards) == set(tensors)
    back = api.revert(out, out=tmp_path / "back").output
    assert ModelDir.open(back).model_shards == [S1, S2]
