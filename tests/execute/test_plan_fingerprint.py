"""A plan carries what it read of the base (each file's device, inode, size and mtime, and its
link text); both executors refuse it, writing nothing, if the directory changed since. In-place
apply plans once, under the directory's exclusive lock."""

from __future__ import annotations

import os

import pytest
from fs_snapshot import copy_tree, snapshot

from patcher import api
from patcher.errors import PlanError
from patcher.execute import inplace
from patcher.execute.engine import apply_plan
from patcher.model.model_dir import ModelDir


def _touch(path, ns: int) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + ns))


def test_in_place_refuses_a_plan_of_a_directory_that_changed_since(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    model = ModelDir.open(root)
    the_plan = api.plan("sm120-fp16-kv", root, options={"in_place": True})
    _touch(root / "config.json", 10**9)        # same bytes, same size: only the mtime moved
    before = snapshot(root)
    with pytest.raises(PlanError) as raised:
        inplace.apply_in_place(the_plan, model)
    message = str(raised.value)
    assert "config.json was modified since the plan was made; nothing was written" in message
    assert "\n" not in message and raised.value.exit_code == 2
    assert snapshot(root) == before
    assert not (root / ".modelpatch").exists()


def test_out_of_place_refuses_a_plan_whose_base_gained_or_lost_a_file(kimi_dir, tmp_path):
    root = copy_tree(kimi_dir, tmp_path / "m")
    model = ModelDir.open(root)
    the_plan = api.plan("sm120-fp16-kv", root, out=tmp_path / "out")
    (root / "extra.txt").write_text("new")
    with pytest.raises(PlanError, match="extra.txt appeared since the plan was made"):
        apply_plan(the_plan, model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (root / "extra.txt").unlink()
    (root / "generation_config.json").unlink()
    with pytest.raises(PlanError, match="generation_config.json is gone since the plan"):
        apply_plan(the_plan, model, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_an_unchanged_directory_is_applied_and_in_place_plans_once(kimi_dir, tmp_path,
                                                                   monkeypatch):
    import patcher.plan.build

    root = copy_tree(kimi_dir, tmp_path / "m")
    calls = []
    real = patcher.plan.build.bind_recipe       # called once per plan() whoever imported plan()
    monkeypatch.setattr(patcher.plan.build, "bind_recipe",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    api.apply_in_place("sm120-fp16-kv", root)
    assert len(calls) == 1
    assert api.verify(root).ok
