"""A hostile hub endpoint: every name it gives is a name, never a path.

The hub (``hub_fixtures.hostile_hub``) serves traversal names in its listing, paths-info and
tree answers, traversal ETags and commit ids in its ``/resolve/`` headers, and traversal oids in
its LFS batch answers. Every command that talks to it exits with one line, and nothing is
written outside the temporary, staging and output directories. Its budgets (the listing's
bytes, the total time of an ``hf://`` read) are refused in one line naming them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_fixtures import HostileHub, configure_hf_client, hostile_hub

from patcher.cli import main

CONFIG = json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}).encode()
RECIPE = """\
modelpatch: 1
name: touch
description: one config edit
config:
  config.json:
    - op: add
      path: /touched
      value: 1
"""


@pytest.fixture
def world(tmp_path, monkeypatch):
    """The client configured (cache under ``tmp_path/hf-home``), the temporary directory under
    ``tmp_path/tmp``, the current directory ``tmp_path/cwd``, a recipe, and where an attack
    would land: ``tmp_path/planted`` (absolute and ``..`` forms)."""
    import tempfile

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    for var in ("HF_ENDPOINT", "MODELPATCH_HUB_DEADLINE", "MODELPATCH_HUB_MAX_LISTING_BYTES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    recipe = tmp_path / "touch.yaml"
    recipe.write_text(RECIPE)
    return tmp_path, recipe


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result, code: int | None = None) -> str:
    assert result.exit_code != 0, result.output
    assert code is None or result.exit_code == code, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)                  # CliRunner keeps what would be a traceback
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert lines and lines[-1].startswith("modelpatch: error: "), result.stderr
    return lines[-1]


def planted(root: Path) -> list[str]:
    """Files an attack made: anything named ``planted*`` anywhere under ``root``."""
    return sorted(str(p) for p in root.rglob("planted*"))


# -- the listing's names -------------------------------------------------------------------


def _names(root: Path) -> list[str]:
    """A name that is absolute and one that climbs out with ``..`` (deep enough from any
    directory under ``root``), both landing on ``root/planted...``."""
    climb = "../" * (len(root.parts) + 4)
    return [str(root / "planted-abs"), climb + str(root / "planted-rel").lstrip("/")]


@pytest.fixture(params=["client", "command"])
def checked_by(request, monkeypatch):
    """``client``: the HTTP client refuses the answer; ``command``: its listing checks are
    switched off, and the command's own checks must refuse the names before any file call."""
    if request.param == "command":
        from patcher.hub.client import guard

        monkeypatch.setattr(guard, "_check_listing", lambda data: None)
    return request.param


@pytest.mark.parametrize("which", [0, 1], ids=["absolute", "dotdot"])
def test_apply_publish_writes_no_listed_name_outside_its_temporary_directory(world, which,
                                                                            checked_by):
    tmp_path, recipe = world
    name = _names(tmp_path)[which]
    hub = HostileHub(files={"config.json": CONFIG, name: b"ssh-ed25519 AAAA attacker\n"})
    with hostile_hub(hub):
        result = cli("apply", recipe, f"hf://{hub.repo}", "--publish", "evil/variant",
                     "--endpoint", hub.endpoint)
    assert planted(tmp_path) == []
    line = one_line_error(result, 2)
    assert "the hub's file listing entry" in line


@pytest.mark.parametrize("which", [0, 1], ids=["absolute", "dotdot"])
def test_pull_links_no_cached_blob_outside_its_staging_directory(world, which, checked_by):
    """The attacker names a blob of the user's Hugging Face cache by its sha256 and lists it
    under a name out of the staging directory: nothing is linked there, before or after the
    pull fails."""
    tmp_path, _ = world
    secret = b"the user's cached file\n"
    sha = hashlib.sha256(secret).hexdigest()
    blobs = tmp_path / "hf-home" / "hub" / "models--someone--private" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / sha).write_bytes(secret)
    name = _names(tmp_path)[which]
    hub = HostileHub(files={"config.json": CONFIG, name: secret}, lfs={name: sha})
    with hostile_hub(hub):
        result = cli("pull", hub.repo, "-o", tmp_path / "out", "--endpoint", hub.endpoint)
    assert planted(tmp_path) == [] and not (tmp_path / "out").exists()
    one_line_error(result, 2)


def test_pull_refuses_a_traversal_sha256_before_looking_for_it(world, checked_by):
    tmp_path, _ = world
    (tmp_path / "planted-source").write_bytes(b"x" * 10)
    hub = HostileHub(files={"config.json": CONFIG, "model.safetensors": b"x" * 10},
                     lfs={"model.safetensors": "../../../../planted-source"})
    with hostile_hub(hub):
        result = cli("pull", hub.repo, "-o", tmp_path / "out", "--endpoint", hub.endpoint)
    one_line_error(result, 2)
    assert not (tmp_path / "out").exists()


# -- the /resolve/ headers: ETag, X-Linked-Etag, X-Repo-Commit, Location ---------------------


def _download_commands(recipe: Path, hub: HostileHub, out: Path) -> dict[str, list]:
    url = f"hf://{hub.repo}"
    return {"apply": ["apply", recipe, url, "-o", out, "--endpoint", hub.endpoint],
            "doctor --fix": ["doctor", url, "--fix", "-o", out, "--endpoint", hub.endpoint],
            "inspect": ["inspect", url, "--endpoint", hub.endpoint],
            "plan": ["plan", recipe, url, "--endpoint", hub.endpoint],
            "pull": ["pull", hub.repo, "-o", out, "--endpoint", hub.endpoint]}


@pytest.mark.parametrize("header", ["etag", "linked_etag", "repo_commit"])
@pytest.mark.parametrize("command", ["apply", "doctor --fix", "inspect", "plan", "pull"])
def test_resolve_headers_never_name_a_path(world, header, command):
    """huggingface_hub stores a download at ``blobs/<ETag>`` and ``snapshots/<X-Repo-Commit>``
    unchecked: the hub's headers are refused before it acts on them."""
    tmp_path, recipe = world
    hub = HostileHub(files={"config.json": CONFIG})
    setattr(hub, header, str(tmp_path / "planted-header"))
    with hostile_hub(hub):
        args = _download_commands(recipe, hub, tmp_path / "out")[command]
        line = one_line_error(cli(*args))
    assert "header" in line, line
    assert planted(tmp_path) == [] and not (tmp_path / "out").exists()


def test_a_redirect_with_dotdot_segments_is_refused(world):
    tmp_path, recipe = world
    hub = HostileHub(files={"config.json": CONFIG}, location="/a/../../planted")
    with hostile_hub(hub):
        line = one_line_error(cli("inspect", f"hf://{hub.repo}", "--endpoint", hub.endpoint))
    assert "redirected" in line


# -- the API answers: paths-info, tree, preupload, LFS batch ------------------------------------


@pytest.mark.parametrize("route", ["paths-info", "tree", "preupload", "lfs-batch"])
def test_every_api_answer_is_checked(world, route):
    """The routes huggingface_hub takes names and oids from, through the client modelpatch
    installs: a traversal name or oid is refused before the answer reaches huggingface_hub."""
    from patcher.errors import UnsafeName
    from patcher.hub.client.connection import client

    tmp_path, _ = world
    hub = HostileHub(files={"../planted": b"x"}, oid="../planted" if route != "preupload"
                     else None)
    with hostile_hub(hub):
        api = client(hub.endpoint)
        calls = {
            "paths-info": lambda: api.get_paths_info(hub.repo, ["config.json"]),
            "tree": lambda: list(api.list_repo_tree(hub.repo)),
            "preupload": lambda: _post(f"{hub.endpoint}/api/models/{hub.repo}/preupload/main"),
            "lfs-batch": lambda: _post(f"{hub.endpoint}/{hub.repo}.git/info/lfs/objects/batch"),
        }
        with pytest.raises(UnsafeName):
            calls[route]()
    assert planted(tmp_path) == []


def _post(url: str):
    from huggingface_hub.utils import get_session

    return get_session().post(url, json={})


# -- budgets and malformed answers --------------------------------------------------------------


def test_a_listing_that_is_not_json_is_one_line(world):
    hub = HostileHub(files={"config.json": CONFIG}, listing=b"<html>not a hub</html>")
    with hostile_hub(hub):
        line = one_line_error(cli("inspect", f"hf://{hub.repo}", "--endpoint", hub.endpoint), 3)
    assert "is not JSON" in line


def test_a_listing_over_its_budget_is_refused_naming_it(world, monkeypatch):
    monkeypatch.setenv("MODELPATCH_HUB_MAX_LISTING_BYTES", "100000")
    hub = HostileHub(files={"config.json": CONFIG}, padding=1_000_000)
    with hostile_hub(hub):
        line = one_line_error(cli("inspect", f"hf://{hub.repo}", "--endpoint", hub.endpoint), 3)
    assert "listing budget of 100000 bytes" in line and "MODELPATCH_HUB_MAX_LISTING_BYTES" in line


def test_a_compressed_listing_cannot_dodge_the_budget(world):
    from patcher.errors import HubError
    from patcher.hub.client import guard

    class Answer:
        headers = {"Content-Encoding": "gzip"}

    with pytest.raises(HubError, match="compressed"):
        guard._read_api_answer(Answer(), "/api/models/evil/model")


@pytest.mark.parametrize("command", ["inspect", "doctor", "plan"])
def test_a_dripping_hub_is_refused_at_the_deadline(world, monkeypatch, command):
    """Every byte of every answer, the status line and headers included, a little apart: the
    whole hf:// read is refused at the deadline, naming it."""
    tmp_path, recipe = world
    monkeypatch.setenv("MODELPATCH_HUB_DEADLINE", "1")
    hub = HostileHub(files={"config.json": CONFIG}, drip=0.02)
    args = {"inspect": ["inspect"], "doctor": ["doctor"], "plan": ["plan", recipe]}[command]
    with hostile_hub(hub):
        line = one_line_error(cli(*args, f"hf://{hub.repo}", "--endpoint", hub.endpoint), 3)
    assert "1 s deadline" in line and "MODELPATCH_HUB_DEADLINE" in line


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_budget_setting_is_one_line(world, monkeypatch, value):
    monkeypatch.setenv("MODELPATCH_HUB_DEADLINE", value)
    hub = HostileHub(files={"config.json": CONFIG})
    with hostile_hub(hub):
        line = one_line_error(cli("inspect", f"hf://{hub.repo}", "--endpoint", hub.endpoint), 2)
    assert "MODELPATCH_HUB_DEADLINE" in line


# -- an hf:// reference is never a local path ---------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "doctor"])
def test_a_gguf_repository_is_never_read_from_the_current_directory(world, command):
    """``hf://ORG/NAME`` of a GGUF repository: ``./hf:/ORG/NAME/FILE.gguf`` of the current
    directory (a cloned repository may ship one) is never opened in the hub's place."""
    from gguf_fixtures import write_tiny

    tmp_path, _ = world
    hub = HostileHub(files={"model.gguf": b"GGUF" + b"\0" * 60})
    local = Path("hf:") / hub.repo / "model.gguf"
    local.parent.mkdir(parents=True)
    write_tiny(local, arch="plantedarch")
    with hostile_hub(hub):
        result = cli(command, f"hf://{hub.repo}", "--endpoint", hub.endpoint)
    assert "plantedarch" not in result.output
    one_line_error(result, 2)
    assert os.path.exists(local)


def test_reuse_checks_every_name_before_linking_any(tmp_path):
    """``link_into`` itself: one traversal name among good ones, and no link is made at all."""
    from patcher.errors import UnsafeName
    from patcher.hub.client.reuse import link_into

    source = tmp_path / "blob"
    source.write_bytes(b"bytes")
    sha = hashlib.sha256(b"bytes").hexdigest()
    (tmp_path / "staging").mkdir()
    wanted = {"a.safetensors": (sha, 5), "../planted": (sha, 5)}
    with pytest.raises(UnsafeName):
        link_into(tmp_path / "staging", wanted, {sha: source})
    assert planted(tmp_path) == [] and list((tmp_path / "staging").iterdir()) == []


@pytest.mark.parametrize("linked", [False, True], ids=["weak-etag", "linked-etag"])
def test_what_real_hubs_send_still_passes(world, linked):
    """No false refusal: a file in a dot-directory (the Hub's ``.eval_results/``), a weak ETag
    (``W/"..."``), an ``X-Linked-Etag`` beside the ETag, and budgets left at their defaults."""
    from hub_fixtures import _git_sha1

    hub = HostileHub(files={"config.json": CONFIG, ".eval_results/mmlu.yaml": b"score: 1\n"},
                     etag=f'W/"{_git_sha1(CONFIG)}"',
                     linked_etag=hashlib.sha256(CONFIG).hexdigest() if linked else None)
    with hostile_hub(hub):
        result = cli("inspect", f"hf://{hub.repo}", "--endpoint", hub.endpoint, "--json")
    assert result.exit_code == 0, result.output
