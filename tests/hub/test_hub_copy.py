"""Cross-repository LFS copies on the embedded hub, driven by the real huggingface_hub client
(``CommitOperationCopy(src_repo_id=...)``: paths-info, then ``/lfs-files/duplicate``, then the
commit). One hub serves the whole module; each test uses its own repositories."""
# ruff: noqa: F811

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hub_fixtures import TOKENS, configure_hf_client, running_hub  # noqa: F401

SHARD = os.urandom(300_000)
SHARD_SHA = hashlib.sha256(SHARD).hexdigest()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hub-copy")
    with pytest.MonkeyPatch.context() as mp:
        configure_hf_client(mp, tmp / "hf-home")
        with running_hub(tmp / "hub", TOKENS) as running:
            yield running


def _source(hub, repo_id: str, *, private: bool) -> None:
    from huggingface_hub import CommitOperationAdd

    api = hub.api("write-alice")
    api.create_repo(repo_id, private=private)
    api.create_commit(repo_id, operations=[
        CommitOperationAdd("model.safetensors", SHARD),
        CommitOperationAdd("config.json", b'{"a": 1}\n'),
    ], commit_message="base")


def _copies(src: str, *paths: str):
    from huggingface_hub import CommitOperationCopy

    return [CommitOperationCopy(p, p, src_revision="main", src_repo_id=src, src_repo_type="model")
            for p in paths]


def _blob_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "blobs").rglob("*") if p.is_file())


def test_cross_repo_copy_moves_no_bytes(hub, tmp_path):
    from huggingface_hub import hf_hub_download

    _source(hub, "alice/base-a", private=True)
    api = hub.api("write-alice")
    api.create_repo("alice/variant-a")
    disk, (received, _) = _blob_bytes(hub.root), hub.traffic.snapshot()
    api.create_commit("alice/variant-a", operations=_copies("alice/base-a", "model.safetensors",
                                                            "config.json"),
                      commit_message="copy")
    assert hub.traffic.snapshot()[0] - received < 10_000        # the shard was not sent again
    assert _blob_bytes(hub.root) == disk                         # nor stored twice
    info = api.model_info("alice/variant-a", files_metadata=True)
    lfs = {s.rfilename: s.lfs.sha256 for s in info.siblings if s.lfs}
    assert lfs == {"model.safetensors": SHARD_SHA}
    got = hf_hub_download("alice/variant-a", "model.safetensors", endpoint=hub.endpoint,
                          token="write-alice", cache_dir=tmp_path)
    assert Path(got).read_bytes() == SHARD


def test_public_source_copies_into_another_namespace(hub):
    _source(hub, "alice/base-public", private=False)
    api = hub.api("write-bob")
    api.create_repo("bob/variant-public")
    api.create_commit("bob/variant-public",
                      operations=_copies("alice/base-public", "model.safetensors"),
                      commit_message="copy")
    assert "model.safetensors" in api.list_repo_files("bob/variant-public")


def test_private_source_is_invisible_to_others(hub):
    from huggingface_hub.errors import RepositoryNotFoundError

    _source(hub, "alice/base-private", private=True)
    api = hub.api("write-bob")
    api.create_repo("bob/variant-private")
    with pytest.raises(RepositoryNotFoundError):
        api.create_commit("bob/variant-private",
                          operations=_copies("alice/base-private", "model.safetensors"),
                          commit_message="copy")
    # the endpoint itself, asked directly with the sha256 alone: the same 404
    r = _duplicate(hub, "write-bob", "alice/base-private", "bob/variant-private", SHARD_SHA)
    assert r.status_code == 404
    assert "model.safetensors" not in api.list_repo_files("bob/variant-private")


def _duplicate(hub, token: str, src: str, target: str, sha: str):
    from huggingface_hub.utils import get_session

    return get_session().post(f"{hub.endpoint}/api/models/{src}/lfs-files/duplicate",
                      headers={"authorization": f"Bearer {token}"},
                      json={"target": {"type": "model", "name": target},
                            "files": [{"sha256": sha, "filename": "x.safetensors"}]})


def test_target_must_be_writable(hub):
    _source(hub, "alice/base-w", private=False)
    hub.api("write-alice").create_repo("alice/variant-w")
    assert _duplicate(hub, "write-bob", "alice/base-w", "alice/variant-w",
                      SHARD_SHA).status_code == 403
    assert _duplicate(hub, "read-alice", "alice/base-w", "alice/variant-w",
                      SHARD_SHA).status_code == 403
    assert _duplicate(hub, "write-alice", "alice/base-w", "alice/variant-w",
                      SHARD_SHA).json() == {"duplicated": 1, "failed": []}


def test_only_committed_objects_of_the_source_are_duplicated(hub):
    """An object uploaded to the source but never committed is nobody's to copy, and a sha256
    the source never held fails by name, however it is known."""
    from huggingface_hub import CommitOperationAdd

    _source(hub, "alice/base-u", private=False)
    hub.api("write-bob").create_repo("bob/variant-u")
    secret = os.urandom(200_000)
    hub.api("write-alice").preupload_lfs_files(
        "alice/base-u", additions=[CommitOperationAdd("secret.safetensors", secret)])
    for sha in (hashlib.sha256(secret).hexdigest(), "0" * 64):
        body = _duplicate(hub, "write-bob", "alice/base-u", "bob/variant-u", sha).json()
        assert body["duplicated"] == 0 and body["failed"][0]["sha256"] == sha
