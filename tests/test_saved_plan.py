"""Saved plans (``patcher.saved_plan``): ``plan --save PLAN.json`` then ``apply PLAN.json``
carries out exactly that plan, and refuses a stale, tampered, foreign or unknown one in one line
with nothing written."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from patcher import api
from patcher.cli.commands import main
from patcher.integrity.manifest import read_manifest
from patcher.saved_plan import _digest


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _saved(recipe, model, path, *extra):
    result = run("plan", recipe, model, "--save", path, *extra)
    assert result.exit_code == 0, result.output
    return json.loads(path.read_text())


def _rewrite(path, doc, *, keep_digest=False):
    """Write ``doc`` back, with a digest that matches it (a deliberate forgery) unless
    ``keep_digest``."""
    if not keep_digest:
        doc["sha256"] = _digest({k: v for k, v in doc.items() if k != "sha256"})
    path.write_text(json.dumps(doc))


@pytest.fixture
def model(deepseek_fp8_dir, tmp_path):
    """A private copy of a 3-shard block-FP8 model (the tests change it)."""
    return shutil.copytree(deepseek_fp8_dir, tmp_path / "base")


def test_a_saved_plan_applies_exactly_without_reading_its_recipe(model, tmp_path):
    """A tensor rewrite with a recipe file that is gone by apply time: the saved plan writes
    the variant a direct apply writes, file for file, and records the same recipe."""
    recipe = tmp_path / "to-bf16.yaml"
    shutil.copy(api.load("fp8-block-to-bf16").path, recipe)
    direct = api.apply(recipe, model, out=tmp_path / "direct", jobs=1)
    saved = _saved(recipe, model, tmp_path / "plan.json")
    assert saved["format"] == "modelpatch.plan" and saved["version"] == 1
    recipe.unlink()
    result = run("apply", tmp_path / "plan.json", "-o", tmp_path / "from-plan", "-j", "1")
    assert result.exit_code == 0, result.output
    planned, applied = read_manifest(tmp_path / "from-plan"), read_manifest(direct.output)
    assert planned.subjects == applied.subjects
    assert planned.recipe["sha256"] == applied.recipe["sha256"]
    assert planned.options == applied.options
    assert _change_log(planned) == _change_log(applied)
    assert api.verify(tmp_path / "from-plan").ok


def test_set_values_travel_in_the_plan(kimi_dir, tmp_path):
    recipe = "sampling-defaults"
    base = shutil.copytree(kimi_dir, tmp_path / "kimi")
    if not (base / "generation_config.json").exists():
        (base / "generation_config.json").write_text("{}\n")
    _saved(recipe, base, tmp_path / "p.json", "--set", "temperature=0.6")
    result = run("apply", tmp_path / "p.json", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())[
        "temperature"] == 0.6
    assert read_manifest(tmp_path / "out").recipe["params"]["temperature"] == 0.6


def test_a_stale_plan_is_refused_and_nothing_is_written(model, tmp_path):
    _saved("fp8-block-to-bf16", model, tmp_path / "plan.json")
    config = model / "config.json"
    config.write_text(config.read_text() + " ")
    result = run("apply", tmp_path / "plan.json", "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert "plan is stale: config.json was modified since the plan was made" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tamper, message", [
    (lambda d: d["files"][0].update(path="../evil.json"), "has a '..' component"),
    (lambda d: d["files"][0].update(path=".modelpatch/patches/x"), "dot-directory"),
    (lambda d: d["files"][0].update(path="modelpatch.provenance.json"), "the manifest"),
    (lambda d: d["files"][0].update(source="/etc/passwd"), "is not a file of the base"),
    (lambda d: _first_job(d)["inputs"][0].__setitem__(4, 0), "is not a tensor of the base"),
    (lambda d: _first_job(d)["inputs"][0].__setitem__(0, "../../x.safetensors"),
     "is not a tensor of the base"),
    (lambda d: _first_job(d).update(op="exec"), "unknown tensor job 'exec'"),
    (lambda d: d["options"].update(link="symlink"), "link mode 'symlink'"),
    (lambda d: d["options"].update(surprise=1), "unknown plan option 'surprise'"),
    (lambda d: d["recipe"]["record"].update(name="../x"), "is not a recipe name"),
    (lambda d: d.update(version=2), "plan format version 2 is not supported"),
])
def test_a_tampered_plan_is_refused_in_one_line(model, tmp_path, tamper, message):
    path = tmp_path / "plan.json"
    doc = _saved("fp8-block-to-bf16", model, path)
    tamper(doc)
    _rewrite(path, doc)
    result = run("apply", path, "-o", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "evil.json").exists()


def test_an_edit_without_a_new_digest_is_caught(model, tmp_path):
    path = tmp_path / "plan.json"
    doc = _saved("fp8-block-to-bf16", model, path)
    doc["warnings"].append("approved")
    _rewrite(path, doc, keep_digest=True)
    result = run("apply", path)
    assert result.exit_code == 2
    assert "was modified after it was written" in result.stderr


def test_a_plan_from_another_model_is_refused(model, deepseek_fp8_dir, tmp_path):
    """Given with another MODEL, or pointed at another directory: either way refused."""
    path = tmp_path / "plan.json"
    doc = _saved("fp8-block-to-bf16", model, path)
    other = shutil.copytree(deepseek_fp8_dir, tmp_path / "other")
    result = run("apply", path, other, "-o", tmp_path / "out")
    assert result.exit_code == 2 and "the plan was made for" in result.stderr
    doc["base"] = str(other)
    _rewrite(path, doc)
    result = run("apply", path, "-o", tmp_path / "out")
    assert result.exit_code == 2 and "plan is stale" in result.stderr
    assert not (tmp_path / "out").exists()


def test_options_that_shape_a_plan_are_refused_with_a_saved_one(model, tmp_path):
    _saved("fp8-block-to-bf16", model, tmp_path / "plan.json")
    result = run("apply", tmp_path / "plan.json", "--set", "x=1")
    assert result.exit_code == 2 and "--set belongs to `modelpatch plan`" in result.stderr


def test_a_plan_of_a_hub_model_is_not_saved(tmp_path):
    from patcher.errors import InputError
    from patcher.saved_plan import plan_document

    class Remote:
        fingerprint, base = None, tmp_path

    with pytest.raises(InputError, match="on a hub cannot be saved"):
        plan_document(Remote())
    assert not os.path.exists(tmp_path / "plan.json")


def test_a_gguf_rewrite_round_trips_and_its_ranges_are_checked(tmp_path):
    from gguf_fixtures import tiny_dir

    base = tiny_dir(tmp_path)
    path = tmp_path / "plan.json"
    doc = _saved("gguf-context", base, path)
    result = run("apply", path, "-o", tmp_path / "from-plan")
    assert result.exit_code == 0, result.output
    direct = api.apply("gguf-context", base, out=tmp_path / "direct")
    assert read_manifest(tmp_path / "from-plan").subjects == \
        read_manifest(direct.output).subjects
    task = next(f["gguf_task"] for f in doc["files"] if f["gguf_task"])
    task["copies"][0][3] = 1 << 40                  # past the end of the base file
    _rewrite(path, doc)
    result = run("apply", path, "-o", tmp_path / "out")
    assert result.exit_code == 2 and "is not a range of a file of the base" in result.stderr


def _change_log(manifest):
    byproducts = manifest.statement["predicate"]["runDetails"]["byproducts"]
    return [b["digest"] for b in byproducts]


def _first_job(doc):
    return next(f["shard_task"]["jobs"][0] for f in doc["files"] if f["shard_task"])


def test_a_plan_file_over_the_budget_is_refused_before_it_is_parsed(model, tmp_path,
                                                                     monkeypatch):
    from patcher import saved_plan

    _saved("fp8-block-to-bf16", model, tmp_path / "plan.json")
    monkeypatch.setattr(saved_plan, "MAX_PLAN_BYTES", 1 << 10)
    result = run("apply", tmp_path / "plan.json")
    assert result.exit_code == 2 and "more than the" in result.stderr


def test_a_mutated_plan_is_applied_or_refused_in_one_line_never_a_traceback(model, tmp_path):
    """Any leaf of a plan file replaced by a value of another kind (with a matching digest):
    the apply succeeds or refuses in one line; it never ends in a traceback."""
    import random

    path = tmp_path / "plan.json"
    original = _saved("fp8-block-to-bf16", model, path)
    leaves = list(_leaves(original))
    rng = random.Random(20261206)
    values = [None, -1, 2**70, "", "../x", [], {}, True, 1.5, "F8_E4M3", [1, 2]]
    for i in range(40):
        doc = json.loads(json.dumps(original))
        parent, key = rng.choice(leaves)
        _at(doc, parent)[key] = rng.choice(values)
        _rewrite(path, doc)
        result = run("apply", path, "-o", tmp_path / f"out-{i}")
        # 3: the shard writer's own size check caught an output shape the loader let through
        assert result.exit_code in (0, 1, 2, 3), (parent, key, result.output)
        if result.exit_code:
            assert len(result.stderr.strip().splitlines()) == 1, (parent, key, result.stderr)
            assert not (tmp_path / f"out-{i}").exists()


def _leaves(value, trail=()):
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, child in items:
        if isinstance(child, (dict, list)) and child:
            yield from _leaves(child, trail + (key,))
        elif key != "sha256":
            yield trail, key


def _at(doc, trail):
    for key in trail:
        doc = doc[key]
    return doc


def test_a_quantizing_plan_round_trips(tmp_path):
    """Quantize jobs (with fused peers across shards) pass the checks and write what a direct
    apply writes."""
    import torch
    from tensor_helpers import write_model, write_recipe

    g = torch.Generator().manual_seed(1)
    attn = "model.layers.0.self_attn"
    w = {p: (torch.randn(32, 32, generator=g) * 0.1).to(torch.bfloat16)
         for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    base = write_model(tmp_path / "base", {
        "a.safetensors": {f"{attn}.q_proj.weight": w["q_proj"],
                          f"{attn}.o_proj.weight": w["o_proj"]},
        "b.safetensors": {f"{attn}.k_proj.weight": w["k_proj"],
                          f"{attn}.v_proj.weight": w["v_proj"]}})
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "*_proj.weight"}
          quantize: {scheme: fp8-tensor, layout: modelopt}
    """)
    api.save_plan(api.plan(recipe, base), tmp_path / "plan.json")
    saved = api.apply_saved(tmp_path / "plan.json", out=tmp_path / "from-plan")
    direct = api.apply(recipe, base, out=tmp_path / "direct")
    assert read_manifest(saved.output).subjects == read_manifest(direct.output).subjects


def test_a_saved_plan_applied_with_sign_writes_a_signed_variant(model, tmp_path):
    """``--sign`` says how the variant is committed, not what it holds: it goes with a saved
    plan, and the variant verifies against the signer's key."""
    from signing_helpers import write_key

    private, public = write_key(tmp_path)
    _saved("fp8-block-to-bf16", model, tmp_path / "plan.json")
    result = run("apply", tmp_path / "plan.json", "-o", tmp_path / "out", "--sign", private)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "model.sig").is_file()
    assert run("verify", tmp_path / "out", "--key", public).exit_code == 0


def test_a_saved_plan_checks_the_base_signature_on_the_executor_it_runs_on(model, tmp_path,
                                                                           monkeypatch):
    """The executor comes from the plan's options for all the work, the base's signature check
    (its hashing) included, as for a direct apply."""
    import contextlib

    from patcher import signatures
    from patcher.execute import ray_executor

    inside: list[bool] = []
    seen: list[bool] = []

    @contextlib.contextmanager
    def fake_ray(address=None, **_):
        inside.append(True)
        try:
            yield None
        finally:
            inside.pop()

    def recording(base, trust, jobs):
        seen.append(bool(inside))
        return None

    monkeypatch.setattr(ray_executor, "executing_on_ray", fake_ray)
    monkeypatch.setattr(signatures, "base_signature_of", recording)
    monkeypatch.setattr(api, "base_signature_of", recording)
    _saved("fp8-block-to-bf16", model, tmp_path / "plan.json")
    api.apply_saved(tmp_path / "plan.json", out=tmp_path / "v", executor="ray", jobs=1)
    api.apply("fp8-block-to-bf16", model, out=tmp_path / "direct", executor="ray", jobs=1)
    assert seen == [True, True]


def test_a_plan_whose_tasks_run_elsewhere_than_its_options_say_is_refused(model, tmp_path):
    """The device is the options' (which the manifest records), checked on this machine before
    anything is written, as planning checks it: a task naming another device is refused."""
    doc = _saved("fp8-block-to-bf16", model, tmp_path / "plan.json")
    task = next(f["shard_task"] for f in doc["files"] if f["shard_task"])
    task["device"] = "cuda:3"
    _rewrite(tmp_path / "plan.json", doc)
    result = run("apply", tmp_path / "plan.json", "-o", tmp_path / "v")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1].endswith(
        "runs on device 'cuda:3', not on the plan's device 'cpu'"), result.stderr
    assert not (tmp_path / "v").exists()
