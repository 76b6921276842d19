"""Input-driven costs of a recipe have budgets, each refused in one line naming it: include
loads (cached, depth and count capped, paths relative to the including file only) and files
read by ``from:`` next to a recipe (never in a dot-directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patcher.errors import RecipeError
from patcher.recipe import load as load_module
from patcher.recipe.load import load_recipe
from patcher.recipe.params import include as includes

HEAD = "modelpatch: 1\nname: t\ndescription: d\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------ include

def test_a_recipe_included_twice_is_read_once(tmp_path, monkeypatch):
    """A binary tree of includes (each file includes the next one twice) reads each file once,
    not 2^depth times."""
    depth = 6
    _write(tmp_path / f"r{depth}.yaml", HEAD)
    for i in range(depth):
        _write(tmp_path / f"r{i}.yaml", HEAD + f"include: [r{i + 1}.yaml, ./r{i + 1}.yaml]\n")
    reads = []
    real = load_module._read_capped
    monkeypatch.setattr(load_module, "_read_capped",
                        lambda path, source: reads.append(path) or real(path, source))
    recipe = load_recipe(tmp_path / "r0.yaml")
    assert len(reads) == depth + 1
    assert includes.expanded_includes(recipe) == 2 ** (depth + 1) - 2


def test_a_long_include_chain_is_refused_by_the_depth_budget(tmp_path):
    """A chain of 200 includes: one line naming the budget, not a RecursionError."""
    for i in range(200):
        _write(tmp_path / f"c{i}.yaml", HEAD + f"include: [c{i + 1}.yaml]\n")
    _write(tmp_path / "c200.yaml", HEAD)
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "c0.yaml")
    line = _one_line(info.value)
    assert "include depth budget" in line and str(includes.MAX_INCLUDE_DEPTH) in line


def test_an_include_fan_out_is_refused_by_the_count_budget(tmp_path):
    """Few files, many include items each: the expansion binding would walk is bounded."""
    _write(tmp_path / "leaf.yaml", HEAD)
    items = ", ".join(["leaf.yaml"] * 20)
    _write(tmp_path / "mid.yaml", HEAD + f"include: [{items}]\n")
    mids = ", ".join(["mid.yaml"] * 20)
    top = _write(tmp_path / "top.yaml", HEAD + f"include: [{mids}]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(top)
    assert "include count budget" in _one_line(info.value)


def test_the_include_file_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(includes, "MAX_INCLUDE_FILES", 3)
    for i in range(5):
        _write(tmp_path / f"f{i}.yaml", HEAD)
    top = _write(tmp_path / "top.yaml",
                 HEAD + "include: [" + ", ".join(f"f{i}.yaml" for i in range(5)) + "]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(top)
    assert "include file budget" in _one_line(info.value)


@pytest.mark.parametrize("target, reason", [
    ("ABS", "absolute"),
    ("../outside.yaml", "'..'"),
    ("sub/../../outside.yaml", "'..'"),
    (".hidden/r.yaml", "dot-directory"),
], ids=["absolute", "dotdot", "dotdot-inside", "dot-directory"])
def test_include_paths_stay_relative_to_the_including_file(tmp_path, target, reason):
    outside = _write(tmp_path / "outside.yaml", HEAD)
    _write(tmp_path / "rec" / ".hidden" / "r.yaml", HEAD)
    _write(tmp_path / "rec" / "sub" / "x.yaml", HEAD)
    name = str(outside) if target == "ABS" else target
    top = _write(tmp_path / "rec" / "top.yaml", HEAD + f"include: ['{name}']\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(top)
    line = _one_line(info.value)
    assert reason in line and "top.yaml:4:" in line


def test_an_include_through_a_symlink_out_of_the_directory_is_refused(tmp_path):
    _write(tmp_path / "elsewhere" / "r.yaml", HEAD)
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "link").symlink_to(tmp_path / "elsewhere")
    top = _write(tmp_path / "rec" / "top.yaml", HEAD + "include: [link/r.yaml]\n")
    with pytest.raises(RecipeError, match="leads outside the directory .* of top.yaml"):
        load_recipe(top)


def test_relative_includes_below_the_file_still_load(tmp_path):
    _write(tmp_path / "rec" / "lib" / "inner.yaml", HEAD.replace("name: t", "name: inner"))
    top = _write(tmp_path / "rec" / "top.yaml",
                 HEAD + "include: [lib/inner.yaml, ./lib/inner.yaml, fix-eos]\n")
    recipe = load_recipe(top)
    assert [i.recipe.name for i in recipe.includes] == ["inner", "inner", "fix-eos"]


# -------------------------------------------------------------------------------- from:

@pytest.mark.parametrize("name", [".ssh/id_rsa", ".cache/huggingface/token",
                                  "./.ssh/id_rsa", "sub/.git/config"])
def test_from_beside_a_recipe_never_reads_a_dot_directory(tmp_path, name):
    """A recipe saved in $HOME cannot copy ~/.ssh/id_rsa into a variant that gets published."""
    _write(tmp_path / name.lstrip("./"), "SECRET\n")
    recipe = _write(tmp_path / "r.yaml", HEAD + f"files:\n  - add: notes.txt\n    from: {name}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe)
    line = _one_line(info.value)
    assert "dot-directory" in line and "r.yaml:6:" in line and "SECRET" not in line


def test_from_beside_a_recipe_still_reads_plain_files(tmp_path):
    _write(tmp_path / "templates" / "chat.jinja", "{{ x }}\n")
    recipe = _write(tmp_path / "r.yaml", HEAD + "files:\n  - add: chat.jinja\n"
                    "    from: ./templates/chat.jinja\n")
    assert load_recipe(recipe).files[0].content == "{{ x }}\n"


# ------------------------------------------------------------------------------- regexes

EXPERT = "model.layers.{}.mlp.experts.{}.gate_proj.weight"   # 48 characters at 2-digit ids
SLOW = ".*.*.*.*.*Z"         # polynomial backtracking the loader lets through: ~45 ms a name


def _expert_names(count: int) -> list[str]:
    return [EXPERT.format(10 + i // 90, 10 + i % 90) for i in range(count)]


def test_a_catastrophic_pattern_over_273k_names_is_refused_in_one_line(monkeypatch):
    """The budget is the plan's, not a name's: at ~45 ms a name, Kimi-K2.5's 273k tensors
    would take hours; the pattern is refused once its pace is known (the default plan budget,
    its pace measured over 0.3 s of CPU instead of 1 s to keep the test short)."""
    from types import SimpleNamespace

    from hostile_helpers import deadline

    from patcher.errors import PlanError
    from patcher.plan.tensor_view import select
    from patcher.recipe import regex_bound

    recipe = load_recipe((HEAD + "tensors:\n  - select: {regex: '%s'}\n    drop: true\n"
                          % SLOW).encode(), source_name="r.yaml")
    monkeypatch.setattr(regex_bound, "PROJECT_AFTER_SECONDS", 0.3)
    view = dict.fromkeys(_expert_names(273_000), SimpleNamespace(dtype="BF16"))
    with deadline(120), regex_bound.plan_wide(), pytest.raises(PlanError) as info:
        select(view, recipe.tensors[0])
    line = _one_line(info.value)
    assert line.startswith("r.yaml:5:5: ") and "273,000 tensor names" in line
    assert "regex budget" in line and " h of CPU" in line


def _apply_refused(tmp_path, ops: str, count: int) -> str:
    from hostile_helpers import make_model, refuse_apply, write_recipe

    model = make_model(tmp_path / "m", shards={"model.safetensors": {
        n: ("BF16", [4], 8) for n in _expert_names(count)}}, config={"architectures": ["X"]})
    recipe = write_recipe(tmp_path / "r" / "r.yaml", "tensors:\n" + ops)
    return refuse_apply(model, tmp_path, "regex budget", recipe=recipe, timeout=60)


def test_apply_refuses_a_pattern_that_would_overrun_the_plan_budget(tmp_path, monkeypatch):
    from patcher.recipe import regex_bound

    monkeypatch.setattr(regex_bound, "PLAN_MATCH_CPU_SECONDS", 0.5)
    monkeypatch.setattr(regex_bound, "PROJECT_AFTER_SECONDS", 0.2)
    line = _apply_refused(tmp_path, "  - select: {regex: '%s'}\n    drop: true\n" % SLOW, 300)
    assert "r.yaml:5:5" in line and "300 tensor names" in line


def test_the_regex_budget_is_shared_by_every_pattern_of_the_plan(tmp_path, monkeypatch):
    """Patterns each within the budget alone overrun it together: the budget is twice the CPU
    one pattern takes over the model's names, measured here, and five such patterns follow one
    another (a margin for a busy machine, where one pattern's CPU varies from run to run)."""
    import re
    import time

    from patcher.recipe import regex_bound

    names = _expert_names(16)
    start = time.process_time()
    for name in names:
        re.search(SLOW, name)
    one = time.process_time() - start
    monkeypatch.setattr(regex_bound, "PLAN_MATCH_CPU_SECONDS", 2 * one)
    monkeypatch.setattr(regex_bound, "PROJECT_AFTER_SECONDS", 1000.0)
    ops = "".join("  - select: {regex: '%s'}\n    allow_empty: true\n    drop: true\n" % p
                  for p in (SLOW, *(SLOW.replace("Z", c) for c in "VWXY")))
    line = _apply_refused(tmp_path, ops, len(names))
    assert "has spent the plan's regex budget" in line
    assert re.search(r"r\.yaml:(8|11|14|17):5", line), line          # not the first pattern



def test_config_array_patterns_draw_on_the_plan_budget(tmp_path, monkeypatch):
    """each: matches a recipe's regex against every element of a model's config array (an
    ignore list of thousands of module names): the same plan budget bounds it."""
    from hostile_helpers import make_model, refuse_apply, write_recipe

    from patcher.recipe import regex_bound

    monkeypatch.setattr(regex_bound, "PLAN_MATCH_CPU_SECONDS", 0.5)
    monkeypatch.setattr(regex_bound, "PROJECT_AFTER_SECONDS", 0.2)
    config = {"architectures": ["X"], "quantization_config": {"ignore": _expert_names(300)}}
    model = make_model(tmp_path / "m", shards={"model.safetensors": {"a": ("BF16", [4], 8)}},
                       config=config)
    recipe = write_recipe(tmp_path / "r" / "r.yaml", "config:\n  config.json:\n"
                          "    - each: /quantization_config/ignore\n"
                          "      match: {regex: '%s'}\n      remove: true\n" % SLOW)
    line = refuse_apply(model, tmp_path, "regex budget", recipe=recipe, timeout=60)
    assert "r.yaml:6:7" in line and "300 array elements" in line


@pytest.mark.parametrize("op, message", [
    ("- select: {regex: '%s'}\n      drop: true" % ("(" * 3000 + ")" * 3000), "nested too deeply"),
    ("- select: {regex: '(a+)+Z'}\n      drop: true", "can backtrack catastrophically"),
    ("- select: {glob: '*'}\n      rename: {pattern: '(a+)+Z', to: b}",
     "can backtrack catastrophically"),
    ("- select: {glob: '*'}\n      rename: {pattern: '(a)', to: '\\9'}", "invalid group"),
], ids=["deep", "exponential-select", "exponential-rename", "bad-replacement"])
def test_gguf_tensor_patterns_get_the_same_load_checks(op, message):
    """A gguf: section's patterns are checked like a tensors: section's: refused at load in
    one line (a deeply nested one raised RecursionError; a bad replacement failed at plan)."""
    with pytest.raises(RecipeError) as info:
        load_recipe((HEAD + "gguf:\n  tensors:\n    " + op + "\n").encode(),
                    source_name="r.yaml")
    line = _one_line(info.value)
    assert line.startswith("r.yaml:6:") or line.startswith("r.yaml:7:"), line
    assert message in line


def test_a_model_ignore_pattern_draws_on_the_plan_budget(monkeypatch):
    """A model's own re: ignore entries are matched against each dequantized module when the plan
    checks the quantization it still declares: a catastrophic one (0.2 s a name, matched from the
    start as compressed-tensors does) is refused in one line by the plan budget, and a
    nested-too-deeply one is no pattern (no RecursionError)."""
    from patcher.errors import PlanError
    from patcher.plan.changes import TensorConverted
    from patcher.plan.quant_consistency import quantization_warnings
    from patcher.recipe import regex_bound

    monkeypatch.setattr(regex_bound, "PROJECT_AFTER_SECONDS", 0.2)
    names = [n.replace("gate_proj.weight", "gate_proj.x.weight") for n in _expert_names(300)]
    changes = [TensorConverted(n + "_packed", "dequantize:nvfp4-compressed-tensors", "s", {}, {},
                               "r:1:1", to=n) for n in names]
    deep = "re:" + "(" * 3000 + ")" * 3000
    config = {"quantization_config": {"quant_method": "compressed-tensors",
                                      "ignore": [deep, "re:" + ".*" * 7 + "Z"]}}
    with regex_bound.plan_wide(), pytest.raises(PlanError) as info:
        quantization_warnings(config, None, {}, changes)
    line = _one_line(info.value)
    assert line.startswith("config.json: ") and "300 module names" in line

# --------------------------------------------------------------------------- copy / split

def _plan_cli(tmp_path, tensors: dict, ops: str):
    from click.testing import CliRunner
    from hostile_helpers import make_model, write_recipe

    from patcher.cli import main

    model = make_model(tmp_path / "m", shards={"model.safetensors": tensors},
                       config={"architectures": ["X"]})
    recipe = write_recipe(tmp_path / "r" / "r.yaml", "tensors:\n" + ops)
    return CliRunner().invoke(main, ["plan", str(recipe), str(model)])


BIG = {"a.weight": ("BF16", [64, 64], 8192), "b.weight": ("BF16", [64, 64], 8192)}


@pytest.mark.parametrize("ops, line", [
    # each copy doubles the model: seven of them (a few hundred bytes of recipe) made it 128x
    ("".join("  - select: {glob: '*.weight'}\n    copy: {pattern: 'weight$', to: w%d}\n" % i
             for i in range(7)), "r.yaml:7:5"),
    # one split with many parts
    ("  - select: {glob: '*.weight'}\n    split: {pattern: 'weight$', to: [%s]}\n"
     % ", ".join(f"p{i}" for i in range(117)), "r.yaml:5:5"),
], ids=["copy-chain", "split-fan-out"])
def test_copy_and_split_are_bounded_by_the_base_size(tmp_path, ops, line):
    result = _plan_cli(tmp_path, BIG, ops)
    assert result.exit_code == 2, result.output
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("modelpatch: error: ") and line in error
    assert "copy budget" in error and "Traceback" not in result.output


def test_copy_and_split_within_the_budget_plan_and_name_their_source(tmp_path):
    """A plan lists a split part as "(split of SOURCE)", not "(split of None)"."""
    tensors = {"m.layers.0.self_attn.kv_scale": ("F32", [], 4), **BIG}
    result = _plan_cli(tmp_path, tensors,
                       "  - select: {glob: '*.kv_scale'}\n"
                       "    split: {pattern: 'kv_scale$', to: [k_scale, v_scale]}\n"
                       "  - select: {glob: 'a.weight'}\n"
                       "    copy: {pattern: '^a', to: c}\n")
    assert result.exit_code == 0, result.output
    assert "(split of m.layers.0.self_attn.kv_scale)" in result.output
    assert "(copy of a.weight)" in result.output and "None" not in result.output


def test_the_copy_budget_refuses_before_the_op_makes_its_tensors(tmp_path, monkeypatch):
    """A split with 117 parts over a model is refused from its counts, before it builds 117
    views of every selected tensor."""
    from patcher.plan import tensors as planning

    built = []
    monkeypatch.setitem(planning._HANDLERS, "split", lambda *args: built.append(args))
    ops = ("  - select: {glob: '*.weight'}\n    split: {pattern: 'weight$', to: [%s]}\n"
           % ", ".join(f"p{i}" for i in range(117)))
    result = _plan_cli(tmp_path, BIG, ops)
    assert result.exit_code == 2 and "copy budget" in result.output, result.output
    assert built == []


def test_copying_every_tensor_of_a_large_model_is_planned_in_linear_time():
    """copy: over 100k names (within the budget: as many tensors as the base) checks its
    collisions once, not once per name (that was 1e10 comparisons, minutes of CPU)."""
    from hostile_helpers import deadline

    from patcher.model.safetensors_io import OutputTensor
    from patcher.plan import tensors as planning
    from patcher.plan.tensor_view import VirtualTensor
    from patcher.tensors.tasks import TensorJob, TensorSource

    names = [f"model.layers.{i // 1000}.mlp.experts.{i % 1000}.w" for i in range(100_000)]
    view = {}
    for i, n in enumerate(names):
        source = TensorSource("/m/model.safetensors", "model.safetensors", n, "BF16", (2,), 0, 4)
        view[n] = VirtualTensor(n, "model.safetensors", "BF16", (2,),
                                TensorJob(OutputTensor(n, "BF16", (2,)), "copy", (source,)), i)
    recipe = load_recipe((HEAD + "tensors:\n  - select: {glob: '*.w'}\n"
                          "    copy: {pattern: 'w$', to: c}\n").encode(), source_name="r.yaml")
    changes = []
    with deadline(30):
        planning._copy(view, names, recipe.tensors[0], changes)
    assert len(view) == 200_000 and len(changes) == 100_000
