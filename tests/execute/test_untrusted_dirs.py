"""The engine side of untrusted directories: recipes write only model files, ``git clone`` and ``hf
download --local-dir`` directories patch, verify and revert like any other, ``--force`` never
deletes revert data, a bad ``files: add`` is refused by ``plan``, and recovery that cannot roll
forward rolls back once and for all.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner
from fault_helpers import tree_state
from fs_snapshot import cli
from hostile_helpers import Untouched, invoke, make_model, write_recipe
from hub_fixtures import hub  # noqa: F401
from model_helpers import entry, st_bytes

from patcher.cli import main


def _git_clone_like(root):
    """A model as ``git clone`` plus ``hf download --local-dir`` leave it."""
    model = make_model(root)
    (model / ".git" / "objects").mkdir(parents=True)
    (model / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (model / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (model / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "download" / "config.json.metadata").write_text("x\n1\n")
    (model / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    return model


def _ok(result):
    assert result.exit_code == 0, (result.exit_code, result.output)
    return result


# ------------------------------------------------------------- recipes write only the model's files

@pytest.mark.parametrize("body", [
    "files:\n  - add: .git/config\n    content: \"[core]\\n\\tfsmonitor = touch /tmp/pwned\\n\"\n",
    "files:\n  - add: .cache/huggingface/download/x\n    content: x\n",
    "files:\n  - add: sub/.hidden/x\n    content: x\n",
    "files:\n  - add: .git\n    content: x\n",
    "files:\n  - drop: .git/HEAD\n",
    "config:\n  .git/x.json:\n    - set: /a\n      value: 1\n",
], ids=["git-config", "hf-cache", "dot-dir", "git-itself", "drop-in-git", "config-in-git"])
def test_recipes_never_write_outside_model_files(tmp_path, body):
    model = _git_clone_like(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r" / "evil.yaml", body)
    with Untouched(model):
        invoke("apply", recipe, model, "--in-place", code=2, needles=("evil.yaml:",
                                                                       "not a model file"))


def test_recipes_may_still_add_a_dotfile_at_the_root(tmp_path):
    model = make_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r" / "ok.yaml",
                          "files:\n  - add: .gitattributes\n    content: \"x\\n\"\n")
    _ok(CliRunner().invoke(main, ["plan", str(recipe), str(model)]))


# ------------------------------------------------------ files: add onto a directory or under a file

@pytest.mark.parametrize("name, needle", [("docs", "has a directory there"),
                                          ("config.json/x", "config.json is a file"),
                                          ("docs/readme.md/x", "docs/readme.md is a file")])
def test_plan_refuses_an_add_onto_a_directory_or_under_a_file(tmp_path, name, needle):
    model = make_model(tmp_path / "m")
    (model / "docs").mkdir()
    (model / "docs" / "readme.md").write_text("hi\n")
    recipe = write_recipe(tmp_path / "r" / "add.yaml",
                          f"files:\n  - add: {name}\n    content: x\n")
    with Untouched(model):
        invoke("plan", recipe, model, code=2, needles=(needle, "add.yaml:"))
        invoke("apply", recipe, model, "--in-place", code=2, needles=(needle,))


def test_recovery_that_cannot_roll_forward_rolls_back_and_never_loops(tmp_path):
    """A kill in the middle of the switch; then something blocks the step still to take. The
    next command rolls the patch back (the directory is its original self again) instead of
    retrying the failing step, and every later command works."""
    model = make_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r" / "add.yaml",
                          "files:\n  - add: notes.txt\n    content: x\n"
                          "config:\n  config.json:\n    - set: /extra\n      value: 1\n")
    before = tree_state(model)
    r = cli("apply", recipe, model, "--in-place",
            env={"MODELPATCH_FAULT": "kill@journal:install:notes.txt"})
    assert r.returncode == -9, r.stderr
    (model / "notes.txt").mkdir()                  # blocks the install still to take
    (model / "notes.txt" / "keep").write_text("k")
    r = cli("verify", model)
    assert "could not complete the interrupted apply" in r.stderr and "rolled it back" in r.stderr
    assert r.returncode == 2 and "modelpatch.provenance.json" in r.stderr   # a base: no manifest
    after = tree_state(model)
    assert {k: v for k, v in after.items() if not k.startswith("notes.txt")} == before
    assert not (model / ".modelpatch").exists()
    r = cli("apply", "sm120-fp16-kv", model, "--in-place")
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------- git clones and hf --local-dir checkouts

def test_git_clone_and_hf_local_dir_patch_verify_and_revert_in_place(tmp_path):
    model = _git_clone_like(tmp_path / "m")
    before = tree_state(model)
    _ok(CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(model), "--in-place"]))
    _ok(CliRunner().invoke(main, ["verify", str(model)]))
    _ok(CliRunner().invoke(main, ["revert", str(model)]))
    assert tree_state(model) == before


def test_git_clone_patched_in_place_publishes_without_its_git_dir(hub, tmp_path,  # noqa: F811
                                                                 monkeypatch):
    model = _git_clone_like(tmp_path / "m")
    _ok(CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(model), "--in-place"]))
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    _ok(CliRunner().invoke(main, ["publish", str(model), "alice/m", "--endpoint", hub.endpoint]))
    pulled = tmp_path / "pulled"
    _ok(CliRunner().invoke(main, ["pull", "alice/m", "-o", str(pulled), "--endpoint",
                                  hub.endpoint]))
    assert not (pulled / ".git").exists() and not (pulled / ".cache").exists()
    assert (pulled / ".gitattributes").exists()


def test_git_file_of_a_worktree_is_not_a_model_file(tmp_path):
    model = make_model(tmp_path / "m")
    (model / ".git").write_text("gitdir: /elsewhere/.git/worktrees/m\n")
    _ok(CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(model), "--in-place"]))
    _ok(CliRunner().invoke(main, ["verify", str(model)]))
    manifest = json.loads((model / "modelpatch.provenance.json").read_text())
    assert ".git" not in {s["name"] for s in manifest["subject"]}


# --------------------------------------------------------- --force and directories patched in place

def test_force_never_replaces_a_directory_patched_in_place(tmp_path):
    base = make_model(tmp_path / "base")
    patched = make_model(tmp_path / "patched")
    _ok(CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(patched), "--in-place"]))
    assert any((patched / ".modelpatch").rglob("originals/config.json"))
    with Untouched(patched):
        invoke("apply", "sm120-fp16-kv", base, "-o", patched, "--force", code=2,
               needles=("revert data of its own",))


def test_force_still_replaces_an_earlier_variant(tmp_path):
    base = make_model(tmp_path / "base")
    out = tmp_path / "out"
    _ok(CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(base), "-o", str(out)]))
    _ok(CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(base), "-o", str(out),
                                  "--force"]))


# ------------------------------------------------------------------------ added JSON is strict JSON

@pytest.mark.parametrize("content", ['{"a": NaN}', '{"a": -Infinity}', '[Infinity]'])
def test_added_json_with_nan_is_not_json(tmp_path, content):
    model = make_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r" / "nan.yaml",
                          f"files:\n  - add: x.json\n    content: {json.dumps(content)}\n")
    with Untouched(model):
        invoke("plan", recipe, model, code=2, needles=("x.json is not valid JSON",))



# -------------------------------------------------------------------- edits that put the mtime back

def test_same_size_same_mtime_edit_of_a_base_file_is_rehashed(tmp_path):
    """The base is a variant (it has a manifest) whose files the digest cache knows. A same-size
    edit that puts the mtime back (``cp -p``) changes only the ctime: neither the manifest nor
    the cache may vouch for the old digest, and the new variant verifies."""
    model = make_model(tmp_path / "m")
    hour_ago = time.time_ns() - 3600 * 10**9
    for path in model.iterdir():
        os.utime(path, ns=(hour_ago, hour_ago))       # old enough for the digest cache
    first = tmp_path / "v1"
    _ok(CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(model), "-o", str(first)]))
    time.sleep(0.05)
    shard = first / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF                                  # lm_head's last byte
    st = shard.stat()
    os.chmod(shard, 0o644)
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    recipe = write_recipe(tmp_path / "r" / "note.yaml",
                          "files:\n  - add: notes.txt\n    content: x\n")
    second = tmp_path / "v2"
    _ok(CliRunner().invoke(main, ["apply", str(recipe), str(first), "-o", str(second)]))
    _ok(CliRunner().invoke(main, ["verify", str(second)]))


# ---------------------------------------------------------------- header names that are not Unicode

@pytest.mark.parametrize("header", [
    {"\ud800": entry("F32", [1], 0, 4)},
    {"w": entry("F32", [1], 0, 4), "__metadata__": {"format": "pt\udfff"}},
], ids=["tensor-name", "metadata"])
def test_lone_surrogate_escape_in_a_header_is_refused(tmp_path, header):
    """``"\\ud800"`` is valid JSON but not Unicode: safetensors refuses it, and so does every
    command here, before anything could try to write it."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(st_bytes(header, 4))
    (model / "config.json").write_text("{}")
    recipe = write_recipe(tmp_path / "r" / "all.yaml",
                          "tensors:\n  - select: {regex: '.'}\n    drop: true\n")
    invoke("inspect", model, code=2, needles=("not valid Unicode", "model.safetensors"))
    with Untouched(model):
        invoke("apply", recipe, model, "-o", tmp_path / "out", code=2,
               needles=("not valid Unicode",))


@pytest.mark.parametrize("value", ["9" * 5000, "-" + "1" * 5000, "1." + "5" * 5000])
def test_recipe_number_with_thousands_of_digits(tmp_path, value):
    model = make_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r" / "big.yaml",
                          f"config:\n  config.json:\n    - set: /x\n      value: {value}\n")
    with Untouched(model):
        invoke("plan", recipe, model, code=2, needles=("big.yaml:7:14", "too long"))


def test_device_meta_is_refused_before_anything_is_written(tmp_path):
    model = make_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r" / "cast.yaml",
                          "tensors:\n  - select: {glob: '*.weight'}\n    cast: fp32\n")
    with Untouched(model):
        invoke("plan", recipe, model, "--device", "meta", code=2, needles=("--device meta",))
        invoke("apply", recipe, model, "-o", tmp_path / "out", "--device", "meta", code=2,
               needles=("--device meta", "holds no data"))
