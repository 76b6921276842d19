"""publish / pull / hub serve facing bad input and hostile repositories: one-line errors
without tracebacks, no remote state directories, card metadata that names cannot inject, and
hub output fit for a log."""
# ruff: noqa: F811  (the `hub` fixture is imported, then named as a test argument)

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_fixtures import (  # noqa: F401
    configure_hf_client,
    hub,
    own_digest_cache,
    variant,
)

from patcher import api
from patcher.cli import main
from patcher.integrity.manifest import read_manifest


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)                  # CliRunner keeps what would be a traceback
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) >= 1 and (lines[-1].startswith("modelpatch: error: ")
                                or lines[-1].startswith("Error: ")), result.stderr
    return lines[-1]


BAD_REPO_IDS = ["bad repo", "a/b/c", "a--b/x", "../x", "alice/x.git", "", "a/" + "n" * 97,
                "alice/\nx"]


# -- invalid ids, paths and options ------------------------------------------


def test_publish_refuses_malformed_input_in_one_line(variant, tmp_path, monkeypatch):
    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    endpoint = ["--endpoint", "http://127.0.0.1:9"]              # never reached
    for repo_id in BAD_REPO_IDS:
        line = assert_one_line_error(cli("publish", variant, repo_id, *endpoint), 2)
        assert line.startswith(f"modelpatch: error: invalid repo id {repo_id!r} ("), line
    (tmp_path / "file").write_text("x")
    for args, code in ((["publish", tmp_path / "missing", "alice/x"], 2),
                       (["publish", tmp_path / "file", "alice/x"], 2),
                       (["publish", tmp_path, "alice/x"], 2),      # not a variant
                       (["publish", variant, "alice/x", "--revision", "bad rev"], 3),
                       (["publish", variant, "alice/x", "--bogus"], 2),
                       (["publish", variant], 2)):
        assert_one_line_error(cli(*args, *endpoint), code)


def test_pull_refuses_malformed_input_in_one_line(hub, variant, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    monkeypatch.chdir(tmp_path)
    for repo_id in BAD_REPO_IDS:
        assert_one_line_error(cli("pull", repo_id, "--endpoint", hub.endpoint), 2)
    for repo_id in ("hf://bad repo", "hf://a--b/x"):
        assert_one_line_error(cli("apply", "sm120-fp16-kv", repo_id, "--endpoint",
                                  hub.endpoint), 2)
    api.publish(variant, "alice/ok", endpoint=hub.endpoint)
    (tmp_path / "taken").write_text("x")
    for args, code in ((["pull", "alice/ok", "-o", tmp_path / "no" / "such" / "dir"], 2),
                       (["pull", "alice/ok", "-o", tmp_path / "taken"], 2),
                       (["pull", "alice/ok", "--revision", "no such rev"], 2),   # named, bad input
                       (["pull", "alice/ok", "--revision", "a\nb"], 3),
                       (["pull", "alice/missing"], 3),
                       (["pull", "alice/ok", "--bogus"], 2)):
        assert_one_line_error(cli(*args, "--endpoint", hub.endpoint), code)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(("hf", "kimi",
                                                                               "digest"))) \
        == ["hub", "taken"]


def test_hub_serve_refuses_malformed_input_in_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    bad_tokens = tmp_path / "bad-tokens"
    bad_tokens.mkdir()
    (bad_tokens / "tokens.json").write_text('{"tokens": {"t": {"user": "a b"}}}')
    root = tmp_path / "root"
    for args in (["--root", tmp_path / "file"], ["--root", tmp_path / "file" / "sub"],
                 ["--root", bad_tokens], ["--root", root, "--port", "99999"],
                 ["--root", root, "--port", "-1"], ["--root", root, "--port", "x"],
                 ["--root", root, "--host", "bad host"], ["--root", root, "--host", "999.1.1.1"],
                 ["--root", root, "--bogus"], [],
                 ["--root", tmp_path, "--public-url", "ftp://hub.example"]):
        assert_one_line_error(cli("hub", "serve", *args), 2)
    for args in (["--root", tmp_path / "missing"], ["--root", tmp_path / "file"],
                 ["--root", tmp_path, "--grace", "-1"], []):
        assert_one_line_error(cli("hub", "gc", *args), 2)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_error(cli("hub", "gc", "--root", tmp_path), 2)      # not a hub: untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# -- help ----------------------------------------------------------------------


@pytest.mark.parametrize("command", [["publish"], ["pull"], ["hub", "serve"], ["hub", "gc"]])
def test_every_hub_option_has_help(command):
    cmd = main
    for name in command:
        cmd = cmd.commands[name]
    missing = [p.opts[0] for p in cmd.params
               if getattr(p, "param_type_name", "") == "option" and not p.help
               and p.opts[0] not in ("-q",)]
    assert missing == []


# -- no remote state directories ------------------------------------------------


@pytest.mark.parametrize("hostile", [".modelpatch/journal.json", ".git/config",
                                     ".cache/huggingface/download/x.metadata",
                                     ".ModelPatch/journal.json"])
def test_pull_refuses_a_repo_with_files_in_state_directories(hub, variant, tmp_path, monkeypatch,
                                                             hostile):
    """A hostile hub serves them (written into its store directly: this hub, like
    huggingface_hub's client, refuses a .git/ path in a commit)."""
    from patcher.hub.store import commit_ops
    from patcher.hub.store.commit_ops import Op
    from patcher.hub.store.git_objects import regular_entry
    from patcher.hub.store.storage import Store

    monkeypatch.setattr(commit_ops, "check_path", lambda path: path)   # the hostile hub
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/crafted", endpoint=hub.endpoint)
    store = Store(hub.root)
    data = b'{"op": "apply"}'
    store.commit(store.get_repo("model", "alice/crafted"), "main",
                 [Op("add", hostile, regular_entry(store.put_bytes(data), data))],
                 message="add state", description="", author="alice")
    out = tmp_path / "pulled"
    result = cli("pull", "alice/crafted", "-o", out, "--endpoint", hub.endpoint)
    line = assert_one_line_error(result, 2)
    assert line.startswith("modelpatch: error: alice/crafted: refusing to pull: ")
    assert repr(hostile) in line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".pulled" in p.name]


def test_pull_still_keeps_the_hub_card_in_its_own_state_directory(hub, variant, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/card", endpoint=hub.endpoint)
    out = api.pull("alice/card", tmp_path / "p", endpoint=hub.endpoint, progress=False).output
    assert (out / ".modelpatch" / "hub" / "README.md").read_text().startswith("---\n")
    assert api.verify(out).ok


# -- card metadata ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["evil: yes", "kimi\nlicense: evil\ntags: [pwned]",
                                  "a\n---\ntitle: x", "quote' \"and\" #hash", "- list"])
def test_card_front_matter_cannot_be_injected_by_a_directory_name(variant, name):
    from huggingface_hub import ModelCard

    from patcher.hub.client.model_card import render_card

    # A plain directory has no hub identity: its name appears only in the card's body, on one
    # line, and never in the front matter.
    card = render_card(None, read_manifest(variant), None, f"/models/{name}")
    data = ModelCard(card).data.to_dict()
    assert sorted(data) == ["modelpatch_recipe", "tags"]
    assert data["tags"] == ["modelpatch", "modelpatch-recipe:sm120-fp16-kv"]
    assert " ".join(name.split()).replace("`", "'") in card
    # The existing card's metadata and text survive a second rendering, and a base_model that
    # is known lands in the front matter as a value.
    again = ModelCard(render_card(card.replace("---\n", "---\nlicense: mit\n", 1),
                                  read_manifest(variant), "org/base", f"/models/{name}"))
    assert again.data.to_dict()["license"] == "mit" and again.data.base_model == "org/base"
    assert sorted(again.data.to_dict()) == ["base_model", "license", "modelpatch_recipe", "tags"]
    assert again.text.count("<!-- modelpatch:begin -->") == 1


def test_publish_of_a_base_whose_name_holds_a_newline(hub, kimi_dir, tmp_path, monkeypatch):
    base = tmp_path / "kimi\nlicense: evil"
    shutil.copytree(kimi_dir, base)
    variant = api.apply("sm120-fp16-kv", base, out=tmp_path / "v").output
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    result = cli("-q", "publish", variant, "alice/nl", "--endpoint", hub.endpoint)
    assert result.exit_code == 0, result.output
    info = hub.api("write-alice").model_info("alice/nl")
    assert info.card_data is None or "license" not in info.card_data.to_dict()
    from huggingface_hub import ModelCard, hf_hub_download

    card = ModelCard(Path(hf_hub_download("alice/nl", "README.md", endpoint=hub.endpoint,
                                          token="write-alice",
                                          cache_dir=tmp_path / "dl")).read_text())
    assert card.data.base_model is None and "license" not in card.data.to_dict()
    assert "`kimi license: evil`" in card.text          # named once, on one line, in the body


# -- hub output fit for a log -------------------------------------------------


def test_publish_and_pull_print_no_bars_to_a_non_terminal(hub, variant, tmp_path, monkeypatch,
                                                          capfd, caplog):
    """Without a terminal (and without TQDM_POSITION=-1 forcing them) huggingface_hub's bars,
    escape codes included, stay off; one plain line says what is transferred."""
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="modelpatch"):
        published = cli("publish", variant, "alice/log", "--endpoint", hub.endpoint)
        pulled = cli("pull", "alice/log", "-o", tmp_path / "p", "--endpoint", hub.endpoint)
    assert published.exit_code == 0 and pulled.exit_code == 0, published.output + pulled.output
    err = published.stderr + pulled.stderr + capfd.readouterr().err
    assert "\x1b" not in err and "\r" not in err and "it/s" not in err, err
    said = [r.getMessage() for r in caplog.records if r.name == "modelpatch"]
    assert any(re.fullmatch(r"publish: 0 files \(0 B\) copied server-side, \d+ files "
                            r"\(\S+ \w+\) uploaded over Git LFS, to alice/log", m)
               for m in said), said
    assert any(re.fullmatch(r"pull: alice/log@\w{12}: 0 files \(0 B\) reused from local files, "
                            r"\d+ files \(\S+ \w+\) to download", m) for m in said), said


def test_quiet_publish_of_an_unchanged_variant_prints_nothing(hub, variant, monkeypatch):
    """huggingface_hub's "No files have been modified" warning: never under -q, once without
    (not twice: through its own handler and again through the root logger's). Child processes,
    so that stderr is a real non-terminal file."""
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    api.publish(variant, "alice/same", endpoint=hub.endpoint, progress=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    quiet, loud = (subprocess.run([sys.executable, "-m", "patcher.cli", *flags, "publish",
                                   str(variant), "alice/same", "--endpoint", hub.endpoint],
                                  env=env, capture_output=True, text=True, timeout=120)
                   for flags in (["-q"], []))
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    assert quiet.stderr == ""
    assert loud.stderr.count("No files have been modified since last commit") == 1, loud.stderr
    assert "\x1b" not in loud.stderr
