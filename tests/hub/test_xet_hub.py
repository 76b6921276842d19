"""The embedded hub with stock huggingface_hub + hf_xet clients at their DEFAULT settings (Xet on;
no HF_HUB_DISABLE_XET anywhere in their environment), and in LFS mode (HF_HUB_DISABLE_XET=1),
each in its own process: create_repo, upload_folder, snapshot_download, hf_hub_download, a
server-side copy, private repos and every auth case, and files crossing modes (uploaded one way,
downloaded the other)."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest
from hub_fixtures import TOKENS, running_hub
from xet_clients import run_client

from patcher.hub.xet import chunking, hashing


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _xet_hash(data: bytes) -> str:
    return hashing.hash_to_hex(hashing.file_hash(
        [(hashing.chunk_hash(c), len(c)) for c in chunking.chunk_bytes(data)]))


@pytest.fixture
def xhub(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="modelpatch.hub")
    with running_hub(tmp_path / "hub", TOKENS) as running:
        yield running


def _requests(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "modelpatch.hub"]


def _folder(tmp_path, name: str, size: int, seed: int) -> tuple[object, dict[str, bytes]]:
    folder = tmp_path / name
    folder.mkdir()
    rng = __import__("random").Random(seed)
    files = {"model.safetensors": rng.randbytes(size // 2) + bytes(size - size // 2),
             "config.json": b'{"model_type": "tiny"}'}
    for fname, data in files.items():
        (folder / fname).write_bytes(data)
    return folder, files


def test_stock_xet_client_round_trip_copy_and_auth(xhub, tmp_path, caplog):
    folder, files = _folder(tmp_path, "model", 300_000, 1)
    weights = files["model.safetensors"]
    cache = str(tmp_path / "cache")
    results = run_client(xhub.endpoint, [
        ["create", "write-alice", "alice/private", True],
        ["upload_folder", "write-alice", "alice/private", str(folder)],
        ["snapshot", "write-alice", "alice/private", cache],
        ["download", "read-alice", "alice/private", "model.safetensors", cache + "2"],
        ["create", "write-alice", "alice/copy", False],
        ["copy", "write-alice", "alice/private", "model.safetensors", "alice/copy", "w.bin"],
        ["download", "write-bob", "alice/copy", "w.bin", cache + "3"],
        # every auth case: no token, another user, a read token writing
        ["download", None, "alice/private", "model.safetensors", cache + "4"],
        ["download", "write-bob", "alice/private", "model.safetensors", cache + "5"],
        ["upload_folder", "read-alice", "alice/private", str(folder)],
        ["upload_folder", "write-bob", "alice/copy", str(folder)],
    ], tmp_path / "home")
    assert all("ok" in r for r in results[:7]), results
    assert results[2]["ok"] == {name: _sha(data) for name, data in files.items()}
    assert results[3]["ok"] == _sha(weights) == results[6]["ok"]
    assert [r.get("status") for r in results[7:]] == [401, 404, 403, 403], results[7:]
    log = _requests(caplog)
    # uploaded and downloaded through the CAS API, never through LFS
    assert any("POST /cas/v2/shards 200" in m for m in log)      # the streaming registration
    assert any("/cas/v2/reconstructions/" in m and " 200 " in m for m in log)
    assert not any("/info/lfs/objects" in m for m in log)
    # the hub keeps the file under its Xet hash, the one hf_xet computed, as xorbs only
    store = xhub.state.hub.store
    assert store.xet.xet_hash_of(_sha(weights)) == _xet_hash(weights)
    assert not store.blob_path(_sha(weights)).exists()
    assert store.blob_size(_sha(weights)) == len(weights)


def test_files_cross_modes(xhub, tmp_path, caplog):
    """Uploaded over LFS, downloaded over Xet; uploaded over Xet, downloaded over plain HTTP."""
    lfs_folder, lfs_files = _folder(tmp_path, "via-lfs", 250_000, 2)
    xet_folder, xet_files = _folder(tmp_path, "via-xet", 250_000, 3)
    home = tmp_path / "home"
    up = run_client(xhub.endpoint, [
        ["create", "write-alice", "alice/lfs", True],
        ["upload_folder", "write-alice", "alice/lfs", str(lfs_folder)],
    ], home, xet=False)
    assert all("ok" in r for r in up), up
    assert any("/info/lfs/objects/batch" in m for m in _requests(caplog))
    # its xorbs are made from the blob: an index each, no second copy of the bytes
    xorbs = xhub.root / "xet" / "xorbs"
    assert list(xorbs.rglob("*.src")) and not [p for p in xorbs.rglob("*") if p.is_file()
                                               and p.suffix not in (".idx", ".src")]
    caplog.clear()
    down = run_client(xhub.endpoint, [
        ["download", "read-alice", "alice/lfs", "model.safetensors", str(tmp_path / "c1")],
        ["create", "write-alice", "alice/xet", True],
        ["upload_folder", "write-alice", "alice/xet", str(xet_folder)],
    ], home)
    assert down[0]["ok"] == _sha(lfs_files["model.safetensors"]), down
    assert "ok" in down[2], down
    assert any("/cas/v2/reconstructions/" in m and " 200 " in m for m in _requests(caplog))
    caplog.clear()
    plain = run_client(xhub.endpoint, [
        ["snapshot", "read-alice", "alice/xet", str(tmp_path / "c2")],
    ], home, xet=False)
    assert plain[0]["ok"] == {name: _sha(data) for name, data in xet_files.items()}
    log = _requests(caplog)
    assert any("GET /alice/xet/resolve/" in m and "model.safetensors 200" in m for m in log)
    assert not any("/cas/" in m for m in log)


def test_xet_dedupes_a_second_upload_against_the_first(xhub, tmp_path, caplog):
    """The same content uploaded again (another repo, another name) sends no xorb: hf_xet finds
    its chunks through the global dedupe query, answered from a repo the user can read."""
    folder, files = _folder(tmp_path, "once", 200_000, 4)
    again = tmp_path / "again"
    again.mkdir()
    (again / "renamed.safetensors").write_bytes(files["model.safetensors"])
    home = tmp_path / "home"
    first = run_client(xhub.endpoint, [["create", "write-alice", "alice/one", True],
                                       ["upload_folder", "write-alice", "alice/one", str(folder)]],
                       home)
    assert all("ok" in r for r in first), first
    uploads = sum("POST /cas/v1/xorbs/" in m for m in _requests(caplog))
    caplog.clear()
    second = run_client(xhub.endpoint, [["create", "write-alice", "alice/two", True],
                                        ["upload_folder", "write-alice", "alice/two", str(again)],
                                        ["download", "write-alice", "alice/two",
                                         "renamed.safetensors", str(tmp_path / "c")]],
                        tmp_path / "home2")
    assert second[2]["ok"] == _sha(files["model.safetensors"]), second
    log = _requests(caplog)
    assert uploads >= 1 and not any("POST /cas/v1/xorbs/" in m for m in log), log
    assert any("/cas/v1/chunks/" in m and " 200 " in m for m in log)


@pytest.mark.slow
def test_a_large_file_both_ways(xhub, tmp_path):
    data = os.urandom(48 * 1024 * 1024)
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "big.bin").write_bytes(data)
    results = run_client(xhub.endpoint, [
        ["create", "write-alice", "alice/big", False],
        ["upload_folder", "write-alice", "alice/big", str(folder)],
        ["download", None, "alice/big", "big.bin", str(tmp_path / "c")],
    ], tmp_path / "home", timeout=600)
    assert results[2]["ok"] == _sha(data), results
