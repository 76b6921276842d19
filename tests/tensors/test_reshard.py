"""Resharding (``--max-shard-size`` / recipe ``output.max_shard_size``): tensors byte-identical,
shards within the limit and named as transformers names them, the index exact, and the variant
verifiable and revertible (out of place, in place, on a Hugging Face cache snapshot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fs_snapshot import blobs, cli, copy_tree, diff, problem_lines, snapshot
from tensor_helpers import (
    INDEX,
    assert_bits_equal,
    read_tensors,
    shard_metadata,
    transformers_logits,
    write_model,
)

from patcher import api
from patcher.errors import PlanError, RecipeError
from patcher.model.safetensors_io import read_header
from patcher.plan.resharding import parse_shard_size
from patcher.recipe.load import load_recipe

CONFIG_ONLY = "modelpatch: 1\nname: c\ndescription: x\nconfig:\n  config.json:\n" \
              "    - set: /use_cache\n      value: false\n"


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _layout(model: Path) -> dict[str, list[tuple[str, int]]]:
    """shard -> [(tensor, nbytes)] in file order."""
    out = {}
    for shard in sorted(model.glob("*.safetensors")):
        header = read_header(shard)
        tensors = sorted(header.tensors.values(), key=lambda t: t.start)
        out[shard.name] = [(t.name, t.nbytes) for t in tensors]
    return out


def _assert_same_tensors(a: Path, b: Path) -> None:
    ta, tb = read_tensors(a), read_tensors(b)
    assert sorted(ta) == sorted(tb)
    for name, t in ta.items():
        assert_bits_equal(t, tb[name], name)


def _assert_index_exact(model: Path) -> None:
    index = json.loads((model / INDEX).read_text())
    layout = _layout(model)
    assert index["weight_map"] == {t: shard for shard, ts in layout.items() for t, _ in ts}
    assert list(index["weight_map"]) == sorted(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(n for ts in layout.values() for _, n in ts)


@pytest.mark.parametrize(("text", "expected"), [
    ("5GB", 5 * 10**9), ("500MB", 500 * 10**6), ("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000),
    ("64 KiB", 64 * 1024), ("1000", 1000), (4096, 4096), ("3tb", 3 * 10**12)])
def test_sizes_parse_like_transformers(text, expected):
    assert parse_shard_size(text) == expected


@pytest.mark.parametrize("bad", ["0", "0GB", "5XB", "GB", "-1GB", "five", "", True, 1.5, -3])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_shard_size(bad)


def test_recipe_output_section(tmp_path):
    recipe = load_recipe(CONFIG_ONLY + "output:\n  max_shard_size: 2MiB\n")
    assert recipe.max_shard_size == 2 * 2**20 and recipe.touches_tensors
    with pytest.raises(RecipeError) as err:
        load_recipe(CONFIG_ONLY + "output:\n  max_shard_size: 2 lots\n", source_name="r.yaml")
    assert err.value.where == "r.yaml:9:19" and "5GB" in str(err.value)
    with pytest.raises(RecipeError) as err:
        load_recipe(CONFIG_ONLY + "output:\n  max_shard: 2MB\n", source_name="r.yaml")
    assert err.value.where == "r.yaml:9:3" and "max_shard_size" in str(err.value)
    with pytest.raises(RecipeError) as err:
        load_recipe(CONFIG_ONLY + "output: 5GB\n", source_name="r.yaml")
    assert err.value.where == "r.yaml:8:9"


def test_reshard_through_the_cli_keeps_every_tensor_and_reverts(kimi_dir, tmp_path):
    base = copy_tree(kimi_dir, tmp_path / "kimi")
    before = snapshot(base)
    out = tmp_path / "v"
    result = cli("apply", "sm120-fp16-kv", str(base), "-o", str(out), "--max-shard-size", "1MB",
                 "--json")
    assert json.loads(result.stdout)["output"] == str(out)
    layout = _layout(out)
    n = len(layout)
    assert n == 5 and sorted(layout) == [f"model-{i:05d}-of-{n:05d}.safetensors"
                                         for i in range(1, n + 1)]
    for tensors in layout.values():
        assert sum(b for _, b in tensors) <= 10**6 or len(tensors) == 1
    _assert_same_tensors(base, out)
    _assert_index_exact(out)
    # model order is kept: shards concatenated list the tensors as the base's shards do
    flat = [t for ts in layout.values() for t, _ in ts]
    base_flat = [t for ts in _layout(base).values() for t, _ in ts]
    assert flat == base_flat
    assert shard_metadata(next(iter(out.glob("*.safetensors")))) == {"format": "pt"}
    statement = json.loads((out / "modelpatch.provenance.json").read_text())
    predicate = json.dumps(statement["predicate"])
    assert '"max_shard_size": 1000000' in predicate and '"kind": "resharded"' in predicate
    assert cli("verify", str(out)).returncode == 0
    cli("revert", str(out), "-o", str(tmp_path / "back"))
    assert diff(snapshot(tmp_path / "back"), before) == []
    assert diff(snapshot(base), before) == []


def test_reshard_in_place_on_a_hub_snapshot_reverts_exactly(kimi_dir, tmp_path):
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(kimi_dir, tmp_path / "hub", "org/kimi", commit="a" * 40)
    repo = snap.parents[1]
    blobs_before, before = blobs(repo), snapshot(snap)
    api.apply_in_place("sm120-fp16-kv", snap, max_shard_size=2 * 10**6)
    assert len(_layout(snap)) == 3 and not (snap / "model-00004-of-00004.safetensors").exists()
    _assert_same_tensors(kimi_dir, snap)
    _assert_index_exact(snap)
    assert blobs(repo) == blobs_before
    assert cli("verify", str(snap)).returncode == 0
    cli("revert", str(snap))
    assert diff(snapshot(snap), before) == []
    assert blobs(repo) == blobs_before


def test_reshard_to_one_file_drops_the_index_and_keeps_logits(tiny_bf16_dir, tmp_path):
    recipe = tmp_path / "one.yaml"
    recipe.write_text(CONFIG_ONLY + "output:\n  max_shard_size: 10GB\n")
    out = api.apply(recipe, tiny_bf16_dir, out=tmp_path / "v").output
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert not (out / INDEX).exists()
    _assert_same_tensors(tiny_bf16_dir, out)
    assert torch.equal(transformers_logits(tiny_bf16_dir), transformers_logits(out))
    back = api.revert(out, out=tmp_path / "back").output
    assert diff(snapshot(back), snapshot(tiny_bf16_dir)) == []


def test_a_single_file_model_gains_an_index(tmp_path):
    tensors = {f"w{i}": torch.full((256,), float(i)) for i in range(6)}       # 1 KiB each
    base = write_model(tmp_path / "m", {"model.safetensors": tensors}, index=False)
    plan = api.plan(load_recipe(CONFIG_ONLY), base, options={"max_shard_size": 2048})
    actions = {f.path: f.action.value for f in plan.files}
    assert actions["model.safetensors"] == "drop" and actions[INDEX] == "add"
    out = api.apply(load_recipe(CONFIG_ONLY), base, out=tmp_path / "v",
                    max_shard_size=2048).output
    assert [len(ts) for ts in _layout(out).values()] == [2, 2, 2]
    _assert_index_exact(out)
    _assert_same_tensors(base, out)
    # and back to one file: nothing but the layout changes
    again = api.apply(load_recipe(CONFIG_ONLY.replace("false", "true")), out,
                      out=tmp_path / "v2", max_shard_size=5 * 10**9).output
    assert sorted(p.name for p in again.glob("*.safetensors")) == ["model.safetensors"]
    assert read_header(again / "model.safetensors").data_size == \
        read_header(base / "model.safetensors").data_size
    _assert_same_tensors(base, again)


def test_a_layout_that_does_not_change_links_every_shard(tmp_path):
    big = {"a": torch.zeros(1000), "b": torch.ones(1000)}
    base = write_model(tmp_path / "m", {"model-00001-of-00002.safetensors": {"a": big["a"]},
                                        "model-00002-of-00002.safetensors": {"b": big["b"]}})
    plan = api.plan(load_recipe(CONFIG_ONLY), base, options={"max_shard_size": 4000})
    assert {f.path: f.action.value for f in plan.files if f.path.endswith("safetensors")} == \
        {"model-00001-of-00002.safetensors": "link", "model-00002-of-00002.safetensors": "link"}


def test_a_tensor_larger_than_the_limit_gets_a_shard_of_its_own(tmp_path):
    base = write_model(tmp_path / "m", {"model.safetensors": {
        "small1": torch.zeros(10), "huge": torch.zeros(5000), "small2": torch.zeros(10)}},
        index=False)
    out = api.apply(load_recipe(CONFIG_ONLY), base, out=tmp_path / "v",
                    max_shard_size=1000).output
    # file order is huge, small1, small2 (safetensors sorts equal dtypes by name)
    assert [[t for t, _ in ts] for ts in _layout(out).values()] == \
        [["huge"], ["small1", "small2"]]
    _assert_same_tensors(base, out)


def test_drop_and_reshard_together(kimi_dir, tmp_path):
    variant = api.apply("sm120-fp16-kv", kimi_dir, out=tmp_path / "v1").output
    out = api.apply("drop-kv-scales", variant, out=tmp_path / "v2",
                    max_shard_size=3 * 10**6).output
    names = set(read_tensors(out))
    assert not any(n.endswith(("k_scale", "v_scale")) for n in names)
    assert names == {n for n in read_tensors(kimi_dir) if not n.endswith(("k_scale", "v_scale"))}
    assert len(_layout(out)) == 2
    _assert_index_exact(out)
    back = api.revert(out, out=tmp_path / "back", all_patches=True).output
    assert diff(snapshot(back), snapshot(kimi_dir)) == []


def test_a_new_shard_name_taken_by_another_file_is_refused(tmp_path):
    base = write_model(tmp_path / "m", {"model-00001-of-00002.safetensors": {"a": torch.ones(4)},
                                        "model-00002-of-00002.safetensors": {"b": torch.ones(4)}})
    from safetensors.torch import save_file

    save_file({"old": torch.zeros(2)}, base / "model.safetensors")     # a leftover, unindexed
    before = snapshot(base)
    result = cli("apply", str(_recipe(tmp_path)), str(base), "--max-shard-size", "1GB")
    assert result.returncode == 2 and "model.safetensors" in result.stderr
    assert "Traceback" not in result.stderr and len(problem_lines(result.stderr)) == 1
    assert diff(snapshot(base), before) == []
    with pytest.raises(PlanError, match="not one of its shards"):
        api.plan(load_recipe(CONFIG_ONLY), base, options={"max_shard_size": 10**9})


def test_bad_cli_size_is_a_usage_error(kimi_dir):
    result = cli("plan", "sm120-fp16-kv", str(kimi_dir), "--max-shard-size", "lots")
    assert result.returncode == 2 and "is not a size such as 5GB" in result.stderr


def test_too_many_shards_is_refused(kimi_dir, monkeypatch):
    import patcher.plan.resharding as resharding

    monkeypatch.setattr(resharding, "MAX_SHARDS", 100)      # kimi has 276 tensors
    with pytest.raises(PlanError, match="276 shards .at most 100."):
        api.plan("sm120-fp16-kv", kimi_dir, options={"max_shard_size": 1})


def _recipe(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG_ONLY)
    return path
