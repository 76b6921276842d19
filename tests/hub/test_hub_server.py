"""The embedded hub against the real huggingface_hub client (HfApi, hf_hub_download,
snapshot_download), served by uvicorn on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hub_fixtures import RunningHub, hub, running_hub  # noqa: F401  (hub is a fixture)
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import get_hf_file_metadata
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.lfs import UploadInfo, post_lfs_batch_info
from huggingface_hub.utils import get_session

from patcher.errors import InputError
from patcher.hub.store.commit_ops import Op
from patcher.hub.store.git_objects import lfs_pointer, regular_entry
from patcher.hub.store.storage import Store

REPO = "alice/tiny-model"


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_model_dir(path: Path, weight_bytes: int = 5 * 1024 * 1024) -> dict[str, bytes]:
    """A small model directory: a real-format safetensors file (over 4 MiB, so uploads stream in
    several pieces), config JSONs and a nested file. Returns {relative path: content}."""
    n = weight_bytes // 4
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "model.embed.weight": {"dtype": "F32", "shape": [n],
                                                "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    files = {
        "model.safetensors": struct.pack("<Q", len(header)) + header + os.urandom(4 * n),
        "config.json": b'{\n  "architectures": ["TinyForCausalLM"],\n  "hidden_size": 8\n}\n',
        "generation_config.json": b'{"do_sample": false}\n',
        "nested/notes.txt": b"hello from a folder\n",
    }
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    return files


def blob_names(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "blobs").rglob("*") if p.is_file())


def tmp_leftovers(root: Path) -> list[Path]:
    """What the hub's temp area holds besides the (empty) session directories of live stores."""
    tmp = root / "tmp"
    return [p for p in tmp.rglob("*") if not (p.parent == tmp and p.name.startswith("session-"))]


@pytest.fixture
def model(hub: RunningHub, tmp_path: Path) -> dict[str, bytes]:
    """REPO (public) with the tiny model uploaded in one commit."""
    files = make_model_dir(tmp_path / "model")
    api = hub.api("write-alice")
    api.create_repo(REPO)
    api.upload_folder(folder_path=tmp_path / "model", repo_id=REPO, commit_message="Add model")
    return files


# -- repos and auth ----------------------------------------------------------------------------


def test_whoami_and_create_repo(hub: RunningHub) -> None:
    api = hub.api("write-alice")
    assert api.whoami()["name"] == "alice"
    with pytest.raises(HfHubHTTPError) as err:
        hub.api("not-a-token").whoami()
    assert err.value.response.status_code == 401

    url = api.create_repo("alice/public-model")
    assert (url.repo_id, url.repo_type) == ("alice/public-model", "model")
    api.create_repo("alice/private-model", private=True)
    assert api.model_info("alice/private-model").private is True
    assert api.model_info("alice/public-model").private is False
    assert api.model_info("alice/public-model").sha  # an initial commit on main

    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo("alice/public-model")
    assert err.value.response.status_code == 409
    assert api.create_repo("alice/public-model", exist_ok=True).repo_id == "alice/public-model"

    with pytest.raises(HfHubHTTPError) as err:  # read-only token
        hub.api("read-alice").create_repo("alice/other")
    assert err.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as err:  # someone else's namespace
        hub.api("write-bob").create_repo("alice/by-bob")
    assert err.value.response.status_code == 403
    assert hub.api("write-bob").create_repo("solo").repo_id == "bob/solo"  # own namespace
    assert api.create_repo("team/shared", repo_type="dataset").repo_type == "dataset"


def test_dataset_repos_settings_and_delete(hub: RunningHub, tmp_path: Path) -> None:
    api = hub.api("write-alice")
    api.create_repo("alice/calib", repo_type="dataset")
    rows = os.urandom(64 * 1024)
    api.upload_file(path_or_fileobj=rows, path_in_repo="data/rows.bin", repo_id="alice/calib",
                    repo_type="dataset")  # LFS, through /datasets/alice/calib.git/info/lfs
    path = hf_hub_download("alice/calib", "data/rows.bin", repo_type="dataset",
                           endpoint=hub.endpoint, token=False, cache_dir=tmp_path / "c")
    assert Path(path).read_bytes() == rows
    assert "datasets--alice--calib" in path
    with pytest.raises(RepositoryNotFoundError):  # a dataset is not a model
        api.model_info("alice/calib")

    api.update_repo_settings("alice/calib", repo_type="dataset", private=True)
    assert not hub.api(False).repo_exists("alice/calib", repo_type="dataset")
    assert api.dataset_info("alice/calib").private is True
    api.delete_repo("alice/calib", repo_type="dataset")
    assert not api.repo_exists("alice/calib", repo_type="dataset")
    assert sha256(rows) in blob_names(hub.root)  # blobs are kept (no garbage collection)


def test_private_repo_invisible_without_valid_token(hub: RunningHub, tmp_path: Path) -> None:
    owner = hub.api("write-alice")
    owner.create_repo("alice/secret", private=True)
    owner.upload_file(path_or_fileobj=b"classified\n", path_in_repo="notes.txt",
                      repo_id="alice/secret")
    cache = tmp_path / "cache"

    for who in (hub.api(False), hub.api("write-bob")):  # anonymous (401) and a stranger (404)
        with pytest.raises(RepositoryNotFoundError):
            who.model_info("alice/secret")
        with pytest.raises(RepositoryNotFoundError):
            who.list_repo_files("alice/secret")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("alice/secret", "notes.txt", endpoint=hub.endpoint, token=False,
                        cache_dir=cache)
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("alice/secret", endpoint=hub.endpoint, token=False, cache_dir=cache)
    # Its Xet token routes answer as for a repo that does not exist.
    from xet_clients import call

    for token, status in ((None, 401), ("write-bob", 404)):
        for kind in ("read", "write"):
            answers = [call(hub.endpoint, "GET", f"/api/models/alice/{name}/xet-{kind}-token/main",
                            token=token) for name in ("secret", "nothing")]
            assert [a[0] for a in answers] == [status, status]
            assert answers[0][2].replace(b"secret", b"nothing") == answers[1][2]

    # A wrong token is refused outright (401), on private and public repos alike.
    with pytest.raises(HfHubHTTPError) as err:
        hub.api("wrong-token").model_info("alice/secret")
    assert err.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as err:
        hf_hub_download("alice/secret", "notes.txt", endpoint=hub.endpoint, token="wrong-token",
                        cache_dir=cache)
    assert err.value.response.status_code == 401
    owner.create_repo("alice/open")
    with pytest.raises(HfHubHTTPError) as err:
        hub.api("wrong-token").model_info("alice/open")
    assert err.value.response.status_code == 401
    assert hub.api(False).model_info("alice/open").id == "alice/open"  # public: anyone

    # The owner's read-only token reads; nobody without write rights writes.
    path = hf_hub_download("alice/secret", "notes.txt", endpoint=hub.endpoint,
                           token="read-alice", cache_dir=cache)
    assert Path(path).read_bytes() == b"classified\n"
    for token, status in ((False, 401), ("read-alice", 403), ("write-bob", 403)):
        with pytest.raises(HfHubHTTPError) as err:
            hub.api(token).upload_file(path_or_fileobj=b"x", path_in_repo="x.txt",
                                       repo_id="alice/open")
        assert err.value.response.status_code == status


def test_errors_map_to_client_exceptions(hub: RunningHub, model: dict[str, bytes],
                                         tmp_path: Path) -> None:
    api = hub.api("write-alice")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("alice/missing")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch", endpoint=hub.endpoint,
                        token=False, cache_dir=tmp_path / "c")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.json", endpoint=hub.endpoint, token=False,
                        cache_dir=tmp_path / "c")
    with pytest.raises(EntryNotFoundError):
        api.list_repo_tree(REPO, path_in_repo="no-such-folder").__next__()


# -- upload and metadata -----------------------------------------------------------------------


def test_upload_folder_is_one_commit_with_lfs_metadata(hub: RunningHub, model: dict[str, bytes],
                                                       tmp_path: Path) -> None:
    api = hub.api("write-alice")
    commits = api.list_repo_commits(REPO)
    assert [c.title for c in commits] == ["Add model", "initial commit"]
    assert sorted(api.list_repo_files(REPO)) == sorted(model)

    info = api.model_info(REPO, files_metadata=True)
    assert info.sha == commits[0].commit_id
    siblings = {s.rfilename: s for s in info.siblings}
    weights = model["model.safetensors"]
    lfs = siblings["model.safetensors"].lfs
    assert lfs is not None and lfs.sha256 == sha256(weights) and lfs.size == len(weights)
    assert siblings["model.safetensors"].size == len(weights)
    assert siblings["model.safetensors"].blob_id == git_sha1(lfs_pointer(sha256(weights),
                                                                       len(weights)))
    for name in ("config.json", "generation_config.json", "nested/notes.txt"):
        assert siblings[name].lfs is None
        assert siblings[name].blob_id == git_sha1(model[name])
        assert siblings[name].size == len(model[name])

    found = api.get_paths_info(REPO, ["config.json", "nested", "model.safetensors", "absent"])
    by_path = {f.path: f for f in found}
    assert set(by_path) == {"config.json", "nested", "model.safetensors"}
    assert isinstance(by_path["nested"], RepoFolder)
    assert isinstance(by_path["config.json"], RepoFile)
    assert by_path["model.safetensors"].lfs.sha256 == sha256(weights)

    top = {e.path: type(e) for e in api.list_repo_tree(REPO)}
    assert top == {"nested": RepoFolder, "config.json": RepoFile, "model.safetensors": RepoFile,
                   "generation_config.json": RepoFile}
    expanded = list(api.list_repo_tree(REPO, path_in_repo="nested", expand=True))
    assert [e.path for e in expanded] == ["nested/notes.txt"]
    assert expanded[0].last_commit.oid == commits[0].commit_id

    # Uploading the unchanged folder again is a no-op: the preupload oids match, no commit.
    api.upload_folder(folder_path=tmp_path / "model", repo_id=REPO, commit_message="again")
    assert len(api.list_repo_commits(REPO)) == 2


def test_hf_hub_download_and_snapshot_make_a_standard_cache(hub: RunningHub,
                                                            model: dict[str, bytes],
                                                            tmp_path: Path) -> None:
    head = hub.api(False).model_info(REPO).sha
    weights = model["model.safetensors"]
    expected_blob = {name: sha256(data) if name.endswith(".safetensors") else git_sha1(data)
                     for name, data in model.items()}

    path = hf_hub_download(REPO, "config.json", endpoint=hub.endpoint, token=False,
                           cache_dir=tmp_path / "c1")
    assert Path(path).read_bytes() == model["config.json"]
    assert Path(os.path.realpath(path)).name == git_sha1(model["config.json"])

    snap = Path(snapshot_download(REPO, endpoint=hub.endpoint, token=False,
                                  cache_dir=tmp_path / "c2"))
    repo_cache = tmp_path / "c2" / "models--alice--tiny-model"
    assert snap == repo_cache / "snapshots" / head
    assert (repo_cache / "refs" / "main").read_text() == head
    for name, data in model.items():
        assert (snap / name).is_symlink()
        blob = Path(os.path.realpath(snap / name))
        assert blob.parent == repo_cache / "blobs" and blob.name == expected_blob[name]
        assert blob.read_bytes() == data

    # What hf_hub_download saw in the HEAD answer: the LFS file's real Xet hash and token route
    # (a client with Xet enabled downloads through the CAS API; this one has it disabled).
    from patcher.hub.xet import chunking, hashing

    url = hf_hub_url(REPO, "model.safetensors", endpoint=hub.endpoint)
    meta = get_hf_file_metadata(url, token=False)
    assert (meta.etag, meta.size, meta.commit_hash) == (sha256(weights), len(weights), head)
    chunks = chunking.chunk_bytes(weights)
    xet_hash = hashing.hash_to_hex(hashing.file_hash([(hashing.chunk_hash(c), len(c))
                                                      for c in chunks]))
    assert meta.xet_file_data.file_hash == xet_hash
    assert meta.xet_file_data.refresh_route == (
        f"{hub.endpoint}/api/models/{REPO}/xet-read-token/{head}")
    head_resp = get_session().head(url)
    assert head_resp.headers["etag"] == f'"{sha256(weights)}"'
    assert head_resp.headers["x-xet-hash"] == xet_hash

    ranged = get_session().get(url, headers={"Range": "bytes=100-199"})
    assert ranged.status_code == 206 and ranged.content == weights[100:200]
    assert ranged.headers["content-range"] == f"bytes 100-199/{len(weights)}"


# -- branches, tags, commits -------------------------------------------------------------------


def test_branches_and_tags(hub: RunningHub, model: dict[str, bytes], tmp_path: Path) -> None:
    api = hub.api("write-alice")
    api.create_branch(REPO, branch="fp16-kv")
    with pytest.raises(HfHubHTTPError) as err:
        api.create_branch(REPO, branch="fp16-kv")
    assert err.value.response.status_code == 409
    api.create_branch(REPO, branch="fp16-kv", exist_ok=True)
    api.upload_file(path_or_fileobj=b'{"patched": true}\n', path_in_repo="config.json",
                    repo_id=REPO, revision="fp16-kv", commit_message="patch config")
    api.create_branch(REPO, branch="user/feature")  # '/' in a branch name: one URL segment
    api.upload_file(path_or_fileobj=b"feature\n", path_in_repo="feature.txt", repo_id=REPO,
                    revision="user/feature")

    refs = api.list_repo_refs(REPO)
    assert {b.name for b in refs.branches} == {"main", "fp16-kv", "user/feature"}

    def download(name: str, revision: str) -> bytes:
        return Path(hf_hub_download(REPO, name, revision=revision, endpoint=hub.endpoint,
                                    token=False, cache_dir=tmp_path / "cache")).read_bytes()

    assert download("config.json", "fp16-kv") == b'{"patched": true}\n'
    assert download("config.json", "main") == model["config.json"]
    assert download("feature.txt", "user/feature") == b"feature\n"
    with pytest.raises(EntryNotFoundError):
        download("feature.txt", "main")
    snap = Path(snapshot_download(REPO, revision="fp16-kv", endpoint=hub.endpoint, token=False,
                                  cache_dir=tmp_path / "snap"))
    assert (snap / "config.json").read_bytes() == b'{"patched": true}\n'
    assert (snap / "model.safetensors").read_bytes() == model["model.safetensors"]

    api.create_tag(REPO, tag="v1", revision="fp16-kv")
    assert download("config.json", "v1") == b'{"patched": true}\n'
    assert [t.name for t in api.list_repo_refs(REPO).tags] == ["v1"]

    api.delete_branch(REPO, branch="fp16-kv")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="fp16-kv", endpoint=hub.endpoint,
                        token=False, cache_dir=tmp_path / "fresh")
    with pytest.raises(HfHubHTTPError):
        api.delete_branch(REPO, branch="main")


def test_create_commit_checks_parent_and_applies_deletes(hub: RunningHub,
                                                         model: dict[str, bytes]) -> None:
    api = hub.api("write-alice")
    head = api.model_info(REPO).sha
    api.upload_file(path_or_fileobj=b"one\n", path_in_repo="one.txt", repo_id=REPO)
    with pytest.raises(HfHubHTTPError) as err:  # head moved since `head`
        api.create_commit(REPO, operations=[CommitOperationAdd("two.txt", b"two\n")],
                          commit_message="stale", parent_commit=head)
    assert err.value.response.status_code == 412
    current = api.model_info(REPO).sha
    api.create_commit(REPO, commit_message="tidy", parent_commit=current, operations=[
        CommitOperationDelete("one.txt"), CommitOperationDelete("nested/"),
        CommitOperationAdd("two.txt", b"two\n")])
    assert sorted(api.list_repo_files(REPO)) == ["config.json", "generation_config.json",
                                                 "model.safetensors", "two.txt"]
    with pytest.raises(EntryNotFoundError):
        api.create_commit(REPO, commit_message="x", operations=[CommitOperationDelete("gone")])


# -- storage guarantees ------------------------------------------------------------------------


def test_same_content_twice_stores_one_blob(hub: RunningHub, model: dict[str, bytes],
                                            tmp_path: Path) -> None:
    expected = sorted({sha256(data) for data in model.values()})
    assert blob_names(hub.root) == expected
    api = hub.api("write-alice")
    api.create_repo("alice/copy")
    api.upload_folder(folder_path=tmp_path / "model", repo_id="alice/copy")
    api.upload_file(path_or_fileobj=model["model.safetensors"], path_in_repo="again.safetensors",
                    repo_id=REPO)
    assert blob_names(hub.root) == expected
    assert not tmp_leftovers(hub.root)


def test_interrupted_upload_leaves_no_partial_blob(hub: RunningHub,
                                                   model: dict[str, bytes]) -> None:
    data = os.urandom(3 * 1024 * 1024)
    oid = sha256(data)
    actions, errors, transfer = post_lfs_batch_info(
        upload_infos=[UploadInfo.from_bytes(data)], token="write-alice", repo_type="model",
        repo_id=REPO, endpoint=hub.endpoint)
    assert not errors and transfer == "basic"
    href = actions[0]["actions"]["upload"]["href"]

    # The connection dies half-way through the body. Wait until the hub has read that half (its
    # temporary blob exists by then) and has dropped what it wrote.
    url = urlsplit(href)
    received_before = hub.traffic.snapshot()[0]
    with socket.create_connection((url.hostname, url.port)) as conn:
        conn.sendall(f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data[:len(data) // 2])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
            hub.traffic.snapshot()[0] - received_before < len(data) // 2
            or tmp_leftovers(hub.root)):
        time.sleep(0.02)
    assert not tmp_leftovers(hub.root)
    assert oid not in blob_names(hub.root)

    # Complete bytes that do not hash to the oid are refused.
    forged = get_session().put(href, content=os.urandom(len(data)))
    assert forged.status_code == 400
    assert oid not in blob_names(hub.root)
    assert not tmp_leftovers(hub.root)

    # The real upload goes through; afterwards the batch API says there is nothing to send.
    hub.api("write-alice").upload_file(path_or_fileobj=data, path_in_repo="big.bin", repo_id=REPO)
    assert (hub.root / "blobs" / "sha256" / oid[:2] / oid).read_bytes() == data
    again, _, _ = post_lfs_batch_info(upload_infos=[UploadInfo.from_bytes(data)],
                                      token="write-alice", repo_type="model", repo_id=REPO,
                                      endpoint=hub.endpoint)
    assert "actions" not in again[0]


def test_lfs_object_of_another_repo_needs_an_upload(hub: RunningHub,
                                                    model: dict[str, bytes]) -> None:
    """Knowing a blob's sha256 is not enough to reference it from another repo."""
    weights = model["model.safetensors"]
    hub.api("write-bob").create_repo("bob/thief")
    actions, _, _ = post_lfs_batch_info(upload_infos=[UploadInfo.from_bytes(weights)],
                                        token="write-bob", repo_type="model",
                                        repo_id="bob/thief", endpoint=hub.endpoint)
    assert "upload" in actions[0]["actions"]
    line = {"key": "lfsFile", "value": {"path": "w.safetensors", "algo": "sha256",
                                        "oid": sha256(weights), "size": len(weights)}}
    body = b"".join(json.dumps(x).encode() + b"\n" for x in (
        {"key": "header", "value": {"summary": "steal", "description": ""}}, line))
    resp = get_session().post(f"{hub.endpoint}/api/models/bob/thief/commit/main", content=body,
                              headers={"authorization": "Bearer write-bob",
                                       "content-type": "application/x-ndjson"})
    assert resp.status_code == 400


def test_concurrent_commits_serialize(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    meta = store.create_repo("model", "alice/busy", private=False, author="alice")

    def add(i: int) -> None:
        data = f"file {i}\n".encode()
        store.commit(meta, "main", [Op("add", f"f{i}.txt", regular_entry(store.put_bytes(data),
                                                                         data))],
                     message=f"add {i}", description="", author="alice")

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    head = store.resolve(meta, "main")
    assert sorted(head.tree) == sorted(f"f{i}.txt" for i in range(8))
    assert len(list(store.history(meta, head))) == 9
    # the oid git hash-object gives
    assert head.tree["f0.txt"]["git_oid"] == "7fe7a21b0677ba28c909e9926592e3d47e97b0af"
    record = json.loads((meta.dir / "commits" / f"{head.id}.json").read_bytes())
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert head.id == hashlib.sha256(canonical.encode()).hexdigest()[:40]


def test_tokens_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hub_fixtures import configure_hf_client

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokens.json").write_text('{"tokens": {"t": {"write": true}}}')
    from patcher.hub.server.app import create_app
    with pytest.raises(InputError):
        create_app(bad)

    with running_hub(tmp_path / "hub", {"first": {"user": "carol", "write": True}}) as running:
        assert running.api("first").whoami()["name"] == "carol"
        hashed = "sha256:" + hashlib.sha256(b"second").hexdigest()
        (running.root / "tokens.json").write_text(json.dumps(
            {"tokens": {hashed: {"user": "dave", "write": False}}}))
        assert running.api("second").whoami()["name"] == "dave"  # re-read without a restart
        with pytest.raises(HfHubHTTPError):
            running.api("first").whoami()
