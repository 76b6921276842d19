"""Secrets: a hub token never appears in output, logs, error messages, tracebacks or files.

A distinctive token is served by the embedded hub (127.0.0.1, the real huggingface_hub client)
and handed to modelpatch through ``HF_TOKEN``. Commands run as subprocesses (the real CLI, with
``--debug``, ``MODELPATCH_DEBUG=1`` and huggingface_hub's ``HF_DEBUG=1`` too) and in process
(every logging record at DEBUG level, on every logger, captured; every exception formatted with
its whole chain, which is what a traceback under ``--debug`` prints). Cases: publish and pull that
succeed; a wrong token (one that contains the real one, so a leak of either shows); no token on a
private repository; a read-only token publishing; an unreachable endpoint; a variant that no
longer verifies; apply from ``hf://`` through the cache.

Afterwards every file the commands wrote is scanned: the variant, the pulled directories, the
model card, the manifest, the digest cache, the huggingface_hub home (cache included), the
working directory, and the hub's storage (except ``tokens.json``, which holds the token by
design). The token must be in none of them, nor in any captured text.
"""

from __future__ import annotations

import logging
import os
import shutil
import traceback
from pathlib import Path

import pytest
from fault_helpers import run_cli
from hub_fixtures import configure_hf_client, running_hub

from patcher import api
from patcher.errors import PatchError

TOKEN = "hf_Zq7SecretToken4Tests9xJ2mK"        # distinctive: found only where it leaked
WRONG = TOKEN + "-revoked"                     # a refused token that contains the real one
READ_TOKEN = "hf_Rd3OnlyTokenForTests8pQ"
TOKENS = {TOKEN: {"user": "alice", "write": True}, READ_TOKEN: {"user": "alice"}}
SECRETS = (TOKEN, READ_TOKEN)


def _leaks(text: str | bytes) -> list[str]:
    if isinstance(text, bytes):
        return [s for s in SECRETS if s.encode() in text]
    return [s for s in SECRETS if s in text]


@pytest.fixture(scope="module")
def world(tmp_path_factory, kimi_dir):
    """A hub with the distinctive tokens, a variant to publish, and a client home."""
    root = tmp_path_factory.mktemp("secrets")
    mp = pytest.MonkeyPatch()
    configure_hf_client(mp, root / "hf-home")
    mp.setenv("MODELPATCH_CACHE_DIR", str(root / "digest-cache"))
    mp.chdir(root / "hf-home")                     # the CLI's working directory
    base = root / "kimi"
    shutil.copytree(kimi_dir, base)
    variant = api.apply("sm120-fp16-kv", base, out=root / "variant", jobs=1).output
    with running_hub(root / "hub", TOKENS) as hub:
        yield {"root": root, "hub": hub, "variant": variant, "base": base, "texts": []}
    mp.undo()


def _run(world, *args, token: str | None = TOKEN, env: dict | None = None, code: int = 0):
    full = {"HF_ENDPOINT": world["hub"].endpoint}
    full.update(env or {})
    if token is not None:
        full["HF_TOKEN"] = token
    else:
        full["HF_TOKEN"] = ""
    r = run_cli(*args, env=full, timeout=120, cwd=world["root"] / "hf-home")
    world["texts"].append((" ".join(map(str, args)), r.stdout + r.stderr))
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    assert _leaks(r.stdout + r.stderr) == [], (args, r.stderr)
    return r


# --debug lists problems; the traceback (whose frames could hold a token) needs a second --debug
# or MODELPATCH_TRACEBACK=1, with the documented exit code all the same
DEBUG_MODES = [{}, {"MODELPATCH_DEBUG": "1", "MODELPATCH_TRACEBACK": "1"},
               {"HF_DEBUG": "1", "MODELPATCH_DEBUG": "2"}]
MODES = [pytest.param(0, id="plain"), pytest.param(1, id="debug", marks=pytest.mark.slow),
         pytest.param(2, id="hf-debug")]


@pytest.mark.parametrize("mode", MODES)
def test_publish_and_pull_succeed_without_leaking(world, mode):
    env = DEBUG_MODES[mode]
    repo = f"alice/leak-{mode}"
    _run(world, "publish", world["variant"], repo, env=env)
    _run(world, "pull", repo, "-o", world["root"] / f"pulled-{mode}", env=env)
    assert api.verify(world["root"] / f"pulled-{mode}").ok


@pytest.mark.parametrize("mode", [pytest.param(0, id="plain"),
                                  pytest.param(1, id="debug", marks=pytest.mark.slow),
                                  pytest.param(2, id="hf-debug", marks=pytest.mark.slow)])
def test_failures_do_not_leak(world, mode):
    env = DEBUG_MODES[mode]
    root, variant = world["root"], world["variant"]
    _run(world, "publish", variant, "alice/private-src", env=env)
    # Wrong token: refused by the hub (a traceback in the debug modes).
    r = _run(world, "publish", variant, "alice/wrong", token=WRONG, env=env, code=3)
    assert WRONG not in r.stderr and "revoked" not in r.stderr
    assert ("Traceback" in r.stderr) == bool(env)
    _run(world, "pull", "alice/private-src", "-o", root / f"w{mode}", token=WRONG, env=env,
         code=3)
    # No token at all on a private repository.
    _run(world, "pull", "alice/private-src", "-o", root / f"n{mode}", token=None, env=env,
         code=3)
    # A read-only token cannot publish (in process too, below).
    _run(world, "publish", variant, "alice/ro", token=READ_TOKEN, env=env, code=3)
    # Nothing listens there (publish: in process, below).
    _run(world, "pull", "alice/x", "-o", root / f"u{mode}", "--endpoint", "http://127.0.0.1:9",
         env=env, code=3)
    for name in (f"w{mode}", f"n{mode}", f"u{mode}"):
        assert not (root / name).exists()


def test_failures_under_full_debug_do_not_leak(world):
    """The representative failures with tracebacks and huggingface_hub's request logging on."""
    env = DEBUG_MODES[2]
    r = _run(world, "publish", world["variant"], "alice/wrong-dbg", token=WRONG, env=env, code=3)
    assert "Traceback" in r.stderr
    _run(world, "pull", "alice/x", "-o", world["root"] / "u-dbg", "--endpoint",
         "http://127.0.0.1:9", env=env, code=3)


def test_variant_that_does_not_verify_is_refused_without_leaking(world, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(world["variant"], broken, symlinks=True)
    (broken / "extra.bin").write_bytes(b"x")
    _run(world, "publish", broken, "alice/broken", env=DEBUG_MODES[1], code=1)


def test_apply_from_the_hub_cache_does_not_leak(world):
    _run(world, "publish", world["base"], "alice/base-model", code=2)   # not a variant
    client = world["hub"].api(TOKEN)
    client.create_repo("alice/base-model", private=True, exist_ok=True)
    client.upload_folder(folder_path=str(world["base"]), repo_id="alice/base-model")
    _run(world, "apply", "sm120-fp16-kv", "hf://alice/base-model", "-o",
         world["root"] / "from-hub", "-q")
    _run(world, "apply", "sm120-fp16-kv", "hf://alice/base-model", "-o",
         world["root"] / "from-hub-wrong", token=WRONG, code=3,
         env={"HF_HOME": str(world["root"] / "hf-home-empty")})     # nothing cached there


def test_in_process_logs_and_exception_chains(world, monkeypatch, caplog):
    """Every log record (DEBUG, all loggers: modelpatch, huggingface_hub, urllib3, httpx, the
    hub's server) and every exception's full formatted chain, in process."""
    caplog.set_level(logging.DEBUG)
    for name in ("", "modelpatch", "modelpatch.hub", "huggingface_hub", "urllib3", "httpx",
                 "httpcore", "uvicorn", "uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    hub_log = logging.getLogger("modelpatch.hub")
    propagate = hub_log.propagate
    hub_log.propagate = True
    endpoint = world["hub"].endpoint
    failures: list[BaseException] = []
    try:
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        api.publish(world["variant"], "alice/inproc", endpoint=endpoint)
        api.pull("alice/inproc", world["root"] / "pulled-inproc", endpoint=endpoint)
        for token, call in [
            (WRONG, lambda: api.publish(world["variant"], "alice/inproc2", endpoint=endpoint)),
            (WRONG, lambda: api.pull("alice/inproc", world["root"] / "x1", endpoint=endpoint)),
            (READ_TOKEN, lambda: api.publish(world["variant"], "alice/ro2", endpoint=endpoint)),
            (TOKEN, lambda: api.pull("alice/none", world["root"] / "x2", endpoint=endpoint)),
            (TOKEN, lambda: api.publish(world["variant"], "alice/y",
                                        endpoint="http://127.0.0.1:9")),
        ]:
            monkeypatch.setenv("HF_TOKEN", token)
            with pytest.raises(PatchError) as info:
                call()
            failures.append(info.value)
    finally:
        hub_log.propagate = propagate
    assert caplog.records, "nothing was logged"
    for record in caplog.records:
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info)
                                      if record.exc_info else "")
        assert _leaks(text) == [], (record.name, text)
        assert WRONG not in text
    for exc in failures:
        text = "".join(traceback.format_exception(exc)) + repr(exc) + str(exc.__context__)
        assert _leaks(text) == [] and WRONG not in text, text
        assert exc.exit_code == 3 and "\n" not in exc.one_line()


def test_nothing_written_holds_the_token(world, monkeypatch):
    """Runs after the tests above (module order): scan every file they wrote (run alone, it
    publishes and pulls once itself)."""
    root = world["root"]
    if not list(root.glob("pulled-*/.modelpatch/hub/README.md")):
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        api.publish(world["variant"], "alice/scan", endpoint=world["hub"].endpoint)
        api.pull("alice/scan", root / "pulled-scan", endpoint=world["hub"].endpoint)
    scanned, leaks = 0, []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if path == root / "hub" / "tokens.json" or path.is_symlink() or not path.is_file():
                continue
            scanned += 1
            data = path.read_bytes()
            if _leaks(data) or WRONG.encode() in data:
                leaks.append(str(path.relative_to(root)))
    assert leaks == []
    assert scanned > 50
    # The places that matter most were written: card, manifest, digest cache, hub storage.
    assert list(root.glob("pulled-*/.modelpatch/hub/README.md"))
    assert (root / "digest-cache").is_dir() and any((root / "digest-cache").iterdir())
    assert any((root / "hub").rglob("*")) and any((root / "hf-home").rglob("*"))
    for what, text in world["texts"]:
        assert _leaks(text) == [] and WRONG not in text, what
