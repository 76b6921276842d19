"""``modelpatch hub gc``: xorbs no repository references are reclaimed; a xorb another repository
still uses never is, whoever deleted what; a revision deleted keeps its commits' files; and the
collector runs safely beside a stock client uploading at the same moment."""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time

from click.testing import CliRunner
from hub_fixtures import TOKENS, running_hub
from xet_clients import built_upload, call, run_client, xet_token

from patcher.cli import main
from patcher.hub.store.xet_gc import collect_garbage


def _data(seed: int, size: int = 150_000) -> bytes:
    rng = random.Random(seed)
    return rng.randbytes(size // 2) + bytes(size - size // 2)


def _upload_and_commit(hub, repo: str, data: bytes) -> dict:
    from huggingface_hub import CommitOperationAdd

    built = built_upload(data)
    token = xet_token(hub.endpoint, repo, "write-alice", write=True)
    assert call(hub.endpoint, "POST", f"/cas/v1/xorbs/default/{built['xorb_hex']}",
                token=token, body=built["xorb"])[0] == 200
    assert call(hub.endpoint, "POST", "/cas/v1/shards", token=token, body=built["shard"])[0] \
        == 200
    hub.api("write-alice").create_commit(
        repo, operations=[CommitOperationAdd("w.bin", data)], commit_message="add")
    return built


def _age(root, seconds: float) -> None:
    past = time.time() - seconds
    for path in (root / "xet").rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


def test_gc_keeps_what_any_repo_uses_and_reclaims_the_rest(tmp_path, monkeypatch):
    from hub_fixtures import configure_hf_client

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    with running_hub(tmp_path / "hub", TOKENS) as hub:
        api = hub.api("write-alice")
        for repo in ("alice/a", "alice/b", "alice/c"):
            api.create_repo(repo, private=True)
        shared, own = _data(1), _data(2)
        built = _upload_and_commit(hub, "alice/a", shared)
        _upload_and_commit(hub, "alice/b", shared)
        # a file only on a branch that is then deleted: its commit stays, so does the file
        api.create_branch("alice/c", branch="side")
        from huggingface_hub import CommitOperationAdd
        own_built = built_upload(own)
        token = xet_token(hub.endpoint, "alice/c", "write-alice", write=True)
        call(hub.endpoint, "POST", f"/cas/v1/xorbs/default/{own_built['xorb_hex']}",
             token=token, body=own_built["xorb"])
        call(hub.endpoint, "POST", "/cas/v1/shards", token=token, body=own_built["shard"])
        api.create_commit("alice/c", operations=[CommitOperationAdd("o.bin", own)],
                          commit_message="o", revision="side")
        api.delete_branch("alice/c", branch="side")
        # an orphan: uploaded, never in any shard
        orphan = built_upload(_data(3))
        call(hub.endpoint, "POST", f"/cas/v1/xorbs/default/{orphan['xorb_hex']}",
             token=token, body=orphan["xorb"])
        store = hub.state.hub.store
        _age(hub.root, 7200)
        api.delete_repo("alice/a")
        report = collect_garbage(store)
        assert report.removed == [orphan["xorb_hex"]]
        assert store.xet.has_xorb(built["xorb_hex"]) and store.xet.has_xorb(own_built["xorb_hex"])
        reader = xet_token(hub.endpoint, "alice/b", "read-alice")
        assert call(hub.endpoint, "GET", f"/cas/v2/reconstructions/{built['file_hex']}",
                    token=reader)[0] == 200
        # a file uploaded over LFS: its xorbs are indexes of its blob; gc drops them, not it
        api.create_repo("alice/lfs", private=True)
        lfs_data = _data(4)
        api.upload_file(path_or_fileobj=lfs_data, path_in_repo="l.bin", repo_id="alice/lfs")
        lfs_sha = hashlib.sha256(lfs_data).hexdigest()
        lfs_xorbs = store.xet.file_xorbs(store.xet.xet_hash_of(lfs_sha))
        assert lfs_xorbs and all(store.xet.has_xorb(x) for x in lfs_xorbs)
        _age(hub.root, 7200)
        api.delete_repo("alice/lfs")
        api.delete_repo("alice/b")
        assert collect_garbage(store, grace_s=3600).xorbs_removed == 1 + len(lfs_xorbs)
        assert not any(store.xet.has_xorb(x) for x in lfs_xorbs)
        assert store.blob_path(lfs_sha).exists()
        assert not store.xet.has_xorb(built["xorb_hex"])
        result = CliRunner().invoke(main, ["hub", "gc", "--root", str(hub.root), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output) == {"xorbs_removed": 0, "bytes_freed": 0,
                                             "xorbs_kept": 1, "files_removed": 0}


def test_gc_beside_a_concurrent_stock_upload(tmp_path):
    with running_hub(tmp_path / "hub", TOKENS) as hub:
        store = hub.state.hub.store
        stale = [built_upload(_data(10 + i)) for i in range(3)]
        call(hub.endpoint, "POST", "/api/repos/create", token="write-alice",
             body=json.dumps({"name": "old", "organization": "alice"}).encode(),
             headers={"Content-Type": "application/json"})
        token = xet_token(hub.endpoint, "alice/old", "write-alice", write=True)
        for b in stale:
            call(hub.endpoint, "POST", f"/cas/v1/xorbs/default/{b['xorb_hex']}", token=token,
                 body=b["xorb"])
        _age(hub.root, 7200)
        folder = tmp_path / "up"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(_data(20, 400_000))
        stop, sweeps = threading.Event(), []

        def sweep() -> None:
            while not stop.is_set():
                sweeps.append(collect_garbage(store).xorbs_removed)
                stop.wait(0.05)

        thread = threading.Thread(target=sweep)
        thread.start()
        try:
            results = run_client(hub.endpoint, [
                ["create", "write-alice", "alice/new", True],
                ["upload_folder", "write-alice", "alice/new", str(folder)],
                ["download", "read-alice", "alice/new", "model.safetensors",
                 str(tmp_path / "c")],
            ], tmp_path / "home")
        finally:
            stop.set()
            thread.join()
        assert all("ok" in r for r in results), results
        assert results[2]["ok"] == hashlib.sha256(_data(20, 400_000)).hexdigest()
        assert sum(sweeps) == 3 and len(sweeps) > 1
        assert not any(store.xet.has_xorb(b["xorb_hex"]) for b in stale)
