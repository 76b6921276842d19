"""The plan's options (``patcher.plan.PlanOptions``): one frozen value built by each caller, and
what the provenance manifest records of it."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from patcher import api
from patcher.errors import InputError
from patcher.integrity.manifest import read_manifest
from patcher.plan.types import PlanOptions


def test_options_are_frozen_and_a_dict_of_the_same_names_gives_the_same_plan(kimi_dir):
    options = PlanOptions(max_shard_size=10**9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.jobs = 2
    from_dict = api.plan("sm120-fp16-kv", kimi_dir, options={"max_shard_size": 10**9})
    from_options = api.plan("sm120-fp16-kv", kimi_dir, options=options)
    assert from_dict.options == from_options.options == options
    assert from_dict.to_json() == from_options.to_json()


def test_an_unknown_option_is_refused_in_one_line(kimi_dir):
    with pytest.raises(InputError, match=r"unknown plan option 'max_shard'.*max_shard_size"):
        api.plan("sm120-fp16-kv", kimi_dir, options={"max_shard": 1})


@pytest.mark.parametrize("options, recorded", [
    (PlanOptions(link="auto", jobs=None, device="cpu"),
     {"link": "auto", "jobs": None, "device": "cpu", "in_place": False, "max_shard_size": None}),
    (PlanOptions(in_place=True, jobs=2, device="cpu", params={"x": 1}),
     {"jobs": 2, "device": "cpu", "in_place": True, "max_shard_size": None, "params": {"x": 1}}),
    (PlanOptions(device=None, params={}),
     {"in_place": False, "max_shard_size": None}),
])
def test_the_manifest_records_the_options_each_caller_recorded_before(options, recorded):
    """The keys the three callers' dicts had: out of place (link, jobs, device), in place (no
    link) and the hub's config-only remote apply (neither jobs nor device); params only if any."""
    assert options.to_json() == recorded


def test_apply_and_apply_in_place_record_their_options(kimi_dir, tmp_path):
    out = tmp_path / "variant"
    api.apply("sm120-fp16-kv", kimi_dir, out=out, jobs=1)
    assert read_manifest(out).options == {"link": "auto", "jobs": 1, "device": "cpu",
                                          "in_place": False, "max_shard_size": None}
    here = tmp_path / "here"
    shutil.copytree(kimi_dir, here)
    api.apply_in_place("sm120-fp16-kv", here)
    recorded = json.loads((here / "modelpatch.provenance.json").read_text())
    options = recorded["predicate"]["buildDefinition"]["externalParameters"]["options"]
    assert options == {"jobs": None, "device": "cpu", "in_place": True, "max_shard_size": None}


def test_tensor_planning_runs_with_the_collector_paused(deepseek_fp8_dir, monkeypatch):
    """Planning makes several objects per tensor, all kept in the plan: automatic collections
    would only rescan them (4.3 of 22.6 s at 497k tensors). Enabled again afterwards."""
    import gc

    from patcher.plan import tensors as planning

    seen = []
    real = planning.plan_tensor_ops

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(planning, "plan_tensor_ops", spy)
    api.plan("fp8-block-to-bf16", deepseek_fp8_dir)
    assert seen == [False] and gc.isenabled()


def test_options_are_built_and_checked_in_one_place():
    """``PlanOptions.of``: a mapping or options, updated by the fields given (None: not given);
    in place drops the link mode, ``force_copy`` is ``link="copy"``, no params is None."""
    assert PlanOptions.of({"jobs": 2}, in_place=True, link="auto") == \
        PlanOptions(in_place=True, jobs=2)
    assert PlanOptions.of(PlanOptions(jobs=3), link="auto", force_copy=True, params={}) == \
        PlanOptions(link="copy", jobs=3)
    assert PlanOptions.of(jobs=None, device=None).device == "cpu"
    assert PlanOptions.of({"device": None}).device is None
    for bad, message in [({"link": "symlink"}, "link mode 'symlink'"),
                         ({"executor": "dask"}, "unknown executor 'dask'"),
                         ({"ray_address": "auto"}, "--ray-address needs --executor ray"),
                         ({"link": "hardlink", "force_copy": True}, "excludes link='hardlink'")]:
        with pytest.raises(InputError, match=message):
            PlanOptions.of(**bad)


def test_the_executor_reads_its_settings_from_the_plan_only(kimi_dir, tmp_path):
    """``apply_plan`` takes no link or jobs of its own: what the plan's options say is what is
    done, and what the manifest records."""
    import inspect

    from patcher.execute.engine import apply_plan

    assert {"link", "jobs"}.isdisjoint(inspect.signature(apply_plan).parameters)
    result = api.apply("sm120-fp16-kv", kimi_dir, out=tmp_path / "v",
                       options=PlanOptions(link="copy", jobs=1))
    assert result.link_method == "copy" and result.bytes_linked == 0
    assert read_manifest(tmp_path / "v").options["link"] == "copy"


def test_a_plan_reads_from_contents_only_through_the_sources_it_is_given(kimi_dir, tmp_path):
    """``plan()`` reaches no hub by itself: ``from:`` contents come through its ``sources``
    (the API hands it a ``SourceFetcher``); given none, a recipe that reads one is refused in
    one line. The content's record names its recipe line under ``recipe_line``."""
    from patcher.model.model_dir import ModelDir
    from patcher.plan import plan

    head = "modelpatch: 1\nname: r\ndescription: d\nfiles:\n  - add: note.txt\n"
    hub = tmp_path / "hub.yaml"
    hub.write_text(head + "    from: hf://alice/base@main/note.txt\n")
    model = ModelDir.open(kimi_dir)
    with pytest.raises(InputError, match="given no source fetcher"):
        plan(api.load(hub), model)
    (tmp_path / "note.txt").write_text("hello\n")
    local = tmp_path / "local.yaml"
    local.write_text(head + "    from: ./note.txt\n")
    the_plan = plan(api.load(local), model)
    source = next(c.to_json() for c in the_plan.changes if c.kind == "content_source")
    assert source["recipe_line"].startswith(f"{local}:") and "loc" not in source


def test_the_plan_types_name_what_they_hold():
    """A file's task, the link estimate and the change log are typed (their contracts in
    ``plan.types`` and ``plan.changes``), never ``Any``; every record is a ``Change``."""
    import typing

    from patcher.plan import changes, types

    hints = {**typing.get_type_hints(types.FilePlan), **typing.get_type_hints(types.Plan)}
    assert hints["shard_task"] == typing.Optional[types.FileTask]
    assert hints["link"] == typing.Optional[types.LinkEstimate]
    assert hints["changes"] == tuple[changes.Change, ...]
    records = [v for v in vars(changes).values() if isinstance(v, type)
               and v.__module__ == changes.__name__ and v is not changes.Change
               and hasattr(v, "to_json")]
    assert records and all(issubclass(r, changes.Change) for r in records)
