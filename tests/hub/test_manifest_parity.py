"""One plan, one manifest: a local apply, ``apply hf:// --publish`` and ``apply --in-place`` of
the same recipes and ``--set`` values record the same provenance, apart from what belongs to
the output (its files, the run's times and id, how the files were carried)."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from hub_fixtures import hub, own_digest_cache  # noqa: F401

from patcher import api
from patcher.cli import main

RECIPES = ("sm120-fp16-kv", "sampling-defaults")
SETS = ("--set", "temperature=0.6", "--set", "top_p=0.95")
# how and where the output was written (a config-only apply on the hub computes nothing, so it
# records no jobs or device: ``PlanOptions.to_json``); the rest of the options must agree
OUTPUT_OPTIONS = ("in_place", "link", "jobs", "device", "executor", "ray_address")


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def comparable(statement: dict) -> dict:
    """``statement`` without its output's own fields."""
    build = statement["predicate"]["buildDefinition"]
    external = dict(build["externalParameters"])
    external["options"] = {k: v for k, v in external["options"].items()
                           if k not in OUTPUT_OPTIONS}
    run = statement["predicate"]["runDetails"]
    return {"externalParameters": external,
            "resolvedDependencies": build["resolvedDependencies"],
            "buildType": build["buildType"],
            "byproducts": run.get("byproducts"),
            "builder": run["builder"]}


def subjects(statement: dict) -> dict:
    return {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}


@pytest.mark.parametrize("signed", [False, True])
def test_local_published_and_in_place_applies_record_the_same_manifest(hub, kimi_dir, tmp_path,
                                                                      monkeypatch, signed):
    """A signed variant as the base: its ``model.sig`` and manifest are recorded by all three
    alike."""
    from remote_fixtures import store_model

    if signed:
        from signing_helpers import write_key

        kimi_dir = api.apply("sampling-defaults", kimi_dir, out=tmp_path / "signed-kimi",
                             sign=write_key(tmp_path)[0]).output
    store_model(hub.root, "alice/kimi", kimi_dir)
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    monkeypatch.chdir(tmp_path)
    model = ["hf://alice/kimi", "--endpoint", hub.endpoint]
    cli("-q", "apply", *RECIPES, *model, *SETS, "-o", tmp_path / "local")
    local = json.loads((tmp_path / "local" / "modelpatch.provenance.json").read_text())

    cli("-q", "apply", *RECIPES, *model, *SETS, "--publish", "alice/kimi-v")
    hub.api("read-alice").hf_hub_download("alice/kimi-v", "modelpatch.provenance.json",
                                          local_dir=tmp_path / "dl")
    published = json.loads((tmp_path / "dl" / "modelpatch.provenance.json").read_text())

    base = tmp_path / "base"
    shutil.copytree(kimi_dir, base)
    cli("-q", "apply", *RECIPES, base, *SETS, "--in-place",
        "--base-model", "alice/kimi")
    in_place = json.loads((base / "modelpatch.provenance.json").read_text())

    assert ("base_signature" in comparable(local)["externalParameters"]) is signed
    assert comparable(published) == comparable(local)
    assert comparable(in_place) == comparable(local)
    readme = {"README.md"}          # the hub's model card stands in for the base's README
    assert {k: v for k, v in subjects(published).items() if k not in readme} == \
        {k: v for k, v in subjects(local).items() if k not in readme}
    assert subjects(in_place) == subjects(local)
