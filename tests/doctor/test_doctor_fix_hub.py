"""``doctor --fix hf://ORG/NAME`` fixes the commit it diagnosed, on the hub it read, however the
branch moves in between: the fix applies to what the report is about."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import json

from click.testing import CliRunner
from hub_fixtures import hub, own_digest_cache  # noqa: F401

from patcher import api
from patcher.cli import main
from patcher.integrity.manifest import read_manifest


def test_doctor_fix_of_a_hub_model_applies_to_the_commit_it_diagnosed(hub, kimi_dir, tmp_path,
                                                                      monkeypatch):
    from remote_fixtures import store_model

    store_model(hub.root, "alice/kimi", kimi_dir)
    writer = hub.api("write-alice")
    diagnosed = writer.model_info("alice/kimi").sha
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    monkeypatch.chdir(tmp_path)
    doctor = api.doctor
    moved = []

    def doctor_then_push(*args, **kwargs):
        report = doctor(*args, **kwargs)
        if not moved:           # main moves on once the report is made
            config = json.loads((kimi_dir / "config.json").read_text())
            writer.upload_file(path_or_fileobj=json.dumps({**config, "moved": True}).encode(),
                               path_in_repo="config.json", repo_id="alice/kimi")
            moved.append(writer.model_info("alice/kimi").sha)
        return report

    monkeypatch.setattr(api, "doctor", doctor_then_push)
    result = CliRunner().invoke(main, ["-q", "doctor", "hf://alice/kimi", "--endpoint",
                                       hub.endpoint, "--engine", "vllm==0.15.1", "--gpu",
                                       "sm120", "--fix", "-o", str(tmp_path / "fixed")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert moved and moved[0] != diagnosed
    fixed = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert "moved" not in fixed                 # the diagnosed commit's config, fixed
    statement = read_manifest(tmp_path / "fixed").statement
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["base_model"] == \
        "alice/kimi"
