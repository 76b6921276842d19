"""Input-driven costs of a recipe have budgets, each refused in one line naming it: include
loads (cached, depth and count capped, paths relative to the including file only) and files
read by ``from:`` next to a recipe (never in a dot-directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patcher.errors import RecipeError
from patcher.recipe import load as load_module
from patcher.recipe.load import load_recipe
from patcher.recipe.params import parse as params_parse

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
    assert params_parse.expanded_includes(recipe) == 2 ** (depth + 1) - 2


def test_a_long_include_chain_is_refused_by_the_depth_budget(tmp_path):
    """A chain of 200 includes: one line naming the budget, not a RecursionError."""
    for i in range(200):
        _write(tmp_path / f"c{i}.yaml", HEAD + f"include: [c{i + 1}.yaml]\n")
    _write(tmp_path / "c200.yaml", HEAD)
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "c0.yaml")
    line = _one_line(info.value)
    assert "include depth budget" in line and str(params_parse.MAX_INCLUDE_DEPTH) in line


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
    monkeypatch.setattr(params_parse, "MAX_INCLUDE_FILES", 3)
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
    with pytest.raises(RecipeError, match="outside the including recipe's directory"):
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
