"""``api.apply`` takes its options as ``api.plan`` does (a ``PlanOptions``, a dict of its
fields, or those fields as keywords), and what it writes is what they say."""

from __future__ import annotations

import json
import os

import pytest

from patcher import api
from patcher.errors import InputError
from patcher.plan import PlanOptions


def options_recorded(variant) -> dict:
    statement = json.loads((variant / "modelpatch.provenance.json").read_text())
    return statement["predicate"]["buildDefinition"]["externalParameters"]["options"]


@pytest.mark.parametrize("options, given", [
    (PlanOptions(in_place=True), {}), ({"in_place": True}, {}), (None, {"in_place": True})])
def test_apply_refuses_options_for_a_patch_in_place(kimi_dir, tmp_path, options, given):
    """A variant is never written from a plan made for patching the model itself (it would
    record ``in_place: true``, and a GGUF header rewritten in place would be half a file)."""
    with pytest.raises(InputError, match="apply_in_place"):
        api.apply("sm120-fp16-kv", kimi_dir, options=options, out=tmp_path / "v", **given)
    assert not os.path.lexists(tmp_path / "v")


def test_apply_with_plan_options_records_them(kimi_dir, tmp_path):
    options = PlanOptions.of(link="copy", jobs=1, params=None)
    planned = api.plan("sm120-fp16-kv", kimi_dir, options=options, out=tmp_path / "v")
    result = api.apply("sm120-fp16-kv", kimi_dir, options=options, out=tmp_path / "v")
    assert result.link_method == "copy" and planned.options.link == "copy"
    assert options_recorded(result.output) == planned.options.to_json() == {
        "link": "copy", "jobs": 1, "device": "cpu", "in_place": False, "max_shard_size": None}
