"""The embedded hub's Xet side driven request by request, with xorbs and shards built by the
format library: tokens (scope, expiry, tampering), every upload check (a xorb's hash recomputed,
a shard's files rebuilt and hashed), budgets, downloads only of files of readable repos, ranges,
signed xorb URLs, and a global dedupe that never reveals a private repo's chunk."""

from __future__ import annotations

import json
import os
import random
import time

import pytest
from hub_fixtures import TOKENS, running_hub
from xet_clients import built_upload, call, rebuild, xet_token

from patcher.hub.server import routes_cas
from patcher.hub.server.xet_auth import XetGrant, issue_token
from patcher.hub.xet import hashing, shard


@pytest.fixture
def xhub(tmp_path, monkeypatch):
    from hub_fixtures import configure_hf_client

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    with running_hub(tmp_path / "hub", TOKENS) as running:
        for token, repo, private in (("write-alice", "alice/private", True),
                                     ("write-alice", "alice/public", False),
                                     ("write-bob", "bob/secret", True)):
            running.api(token).create_repo(repo, private=private)
        yield running


def _data(seed: int, size: int = 200_000) -> bytes:
    rng = random.Random(seed)
    return rng.randbytes(size // 2) + bytes(size - size // 2)


def _upload(hub, repo: str, hub_token: str, built: dict) -> None:
    token = xet_token(hub.endpoint, repo, hub_token, write=True)
    status, _, body = call(hub.endpoint, "POST", f"/cas/v1/xorbs/default/{built['xorb_hex']}",
                           token=token, body=built["xorb"])
    assert status == 200, body
    status, _, body = call(hub.endpoint, "POST", "/cas/v1/shards", token=token,
                           body=built["shard"])
    assert (status, json.loads(body)) == (200, {"result": 1}), body


def _commit(hub, repo: str, hub_token: str, path: str, data: bytes) -> str:
    """A commit naming ``data`` as an LFS file (already uploaded: nothing is sent again)."""
    from huggingface_hub import CommitOperationAdd

    op = CommitOperationAdd(path_in_repo=path, path_or_fileobj=data)
    return hub.api(hub_token).create_commit(repo, operations=[op], commit_message="add").oid


def _error(body: bytes) -> str:
    message = json.loads(body)["error"]
    assert "\n" not in message
    return message


def test_token_routes_scope_each_token_to_one_repo_and_level(xhub):
    ep = xhub.endpoint
    route = "/api/models/alice/private/xet-{}-token/main"
    assert call(ep, "GET", route.format("read"))[0] == 401            # no token
    assert call(ep, "GET", route.format("read"), token="write-bob")[0] == 404   # hidden repo
    assert call(ep, "GET", route.format("write"), token="read-alice")[0] == 403
    assert call(ep, "GET", "/api/models/alice/private/xet-read-token/nope",
                token="read-alice")[0] == 404
    status, headers, body = call(ep, "GET", route.format("read"), token="read-alice")
    doc = json.loads(body)
    assert status == 200 and doc["casUrl"] == ep + "/cas" == headers["x-xet-cas-url"]
    assert headers["x-xet-access-token"] == doc["accessToken"]
    assert int(headers["x-xet-token-expiration"]) == doc["exp"] > time.time()
    # the CAS URL follows --public-url
    xhub.state.hub.public_url = "https://hub.example:8443"
    try:
        _, headers, _ = call(ep, "GET", route.format("read"), token="read-alice")
        assert headers["x-xet-cas-url"] == "https://hub.example:8443/cas"
    finally:
        xhub.state.hub.public_url = None


def test_xet_tokens_refused_when_expired_altered_read_only_or_for_another_repo(xhub):
    ep, built = xhub.endpoint, built_upload(_data(1))
    path = f"/cas/v1/xorbs/default/{built['xorb_hex']}"
    hub = xhub.state.hub
    expired = issue_token(hub, XetGrant("model", "alice/private", True, "alice", (),
                                        int(time.time()) - 1))
    status, _, body = call(ep, "POST", path, token=expired, body=built["xorb"])
    assert status == 401 and "expired" in _error(body)
    good = xet_token(ep, "alice/private", "write-alice", write=True)
    prefix, payload, sig = good.split(".")
    forged = issue_token(type("H", (), {"signer": type(hub.signer)(b"k" * 32)})(),
                         XetGrant("model", "alice/private", True, "alice", (), 2 ** 40))
    for bad in (f"{prefix}.{payload}.{sig[:-1]}0", f"{prefix}.{payload[:-2]}.{sig}", forged,
                "xet1..", "x" * 5000):
        assert call(ep, "POST", path, token=bad, body=built["xorb"])[0] == 401
    assert call(ep, "POST", path, body=built["xorb"])[0] == 401
    read = xet_token(ep, "alice/private", "read-alice")
    assert call(ep, "POST", path, token=read, body=built["xorb"])[0] == 403
    assert call(ep, "POST", "/cas/v1/shards", token=read, body=built["shard"])[0] == 403
    # a write token of one repo never registers files in another
    _upload(xhub, "alice/private", "write-alice", built)
    bob = xet_token(ep, "bob/secret", "write-bob")
    status, _, _ = call(ep, "GET", f"/cas/v1/reconstructions/{built['file_hex']}", token=bob)
    assert status == 404


def test_xorb_uploads_are_checked_and_capped(xhub, monkeypatch):
    ep, built = xhub.endpoint, built_upload(_data(2))
    token = xet_token(ep, "alice/private", "write-alice", write=True)
    other = built_upload(_data(3))
    cases = [
        (f"/cas/v1/xorbs/default/{other['xorb_hex']}", built["xorb"], 400, "hash to"),
        (f"/cas/v1/xorbs/default/{built['xorb_hex']}", built["xorb"][:-5], 400, "chunk"),
        (f"/cas/v1/xorbs/default/{built['xorb_hex']}", b"\x01" + built["xorb"][1:], 400,
         "version"),
        ("/cas/v1/xorbs/default/" + "Z" * 64, built["xorb"], 400, "malformed xorb hash"),
        ("/cas/v1/xorbs/default/..%2F..%2Fx", built["xorb"], 400, "malformed"),
    ]
    for path, body, status, words in cases:
        got, _, answer = call(ep, "POST", path, token=token, body=body)
        assert (got, words in _error(answer)) == (status, True), (path, answer)
    assert not list((xhub.root / "xet" / "xorbs").rglob("*.idx"))
    monkeypatch.setattr(routes_cas, "MAX_XORB_BODY", 1000)
    status, _, answer = call(ep, "POST", f"/cas/v1/xorbs/default/{built['xorb_hex']}",
                             token=token, body=built["xorb"])
    assert status == 413 and "larger than 1000 bytes" in _error(answer)
    monkeypatch.setattr(routes_cas, "MAX_SHARD_BODY", 100)
    status, _, answer = call(ep, "POST", "/cas/v1/shards", token=token, body=built["shard"])
    assert status == 413 and "larger than 100 bytes" in _error(answer)
    monkeypatch.undo()
    _upload(xhub, "alice/private", "write-alice", built)
    # uploading it again needs the same bytes, not just the name
    status, _, answer = call(ep, "POST", f"/cas/v1/xorbs/default/{built['xorb_hex']}",
                             token=token, body=other["xorb"])
    assert status == 400


def _shard_with(built: dict, **changes) -> bytes:
    info = built["info"]
    term = info.terms[0]
    term = shard.FileTerm(changes.pop("xorb", term.xorb_hash), changes.pop("size", term.size),
                          term.chunk_start, changes.pop("end", term.chunk_end))
    info = shard.FileInfo(changes.pop("file_hash", info.file_hash), (term,),
                          changes.pop("verification", info.verification),
                          changes.pop("sha256", info.sha256))
    return shard.serialize_shard(shard.Shard([info], []))


def test_shards_register_only_files_that_rebuild_to_what_they_claim(xhub):
    ep, built = xhub.endpoint, built_upload(_data(4))
    token = xet_token(ep, "alice/private", "write-alice", write=True)
    assert call(ep, "POST", f"/cas/v1/xorbs/default/{built['xorb_hex']}", token=token,
                body=built["xorb"])[0] == 200
    n = len(built["chunks"])
    bad = {
        "wrong sha256": (_shard_with(built, sha256=b"\x01" * 32), "sha256"),
        "wrong file hash": (_shard_with(built, file_hash=b"\x02" * 32), "hash to"),
        "wrong verification": (_shard_with(built, verification=(b"\x03" * 32,)), "verification"),
        "wrong size": (_shard_with(built, size=5), "claims 5 bytes"),
        "chunks past the end": (_shard_with(built, end=n + 1), "chunks"),
        "unknown xorb": (_shard_with(built, xorb=b"\x04" * 32), "does not have"),
        "not a shard": (b"HFRepoMetaData" + bytes(100), "header tag"),
        "cut short": (built["shard"][:70], "ends inside"),
    }
    for what, (body, words) in bad.items():
        status, _, answer = call(ep, "POST", "/cas/v1/shards", token=token, body=body)
        assert (status, words in _error(answer)) == (400, True), (what, answer)
    assert xhub.state.hub.store.xet.xet_hash_of(built["sha256"]) is None
    # nothing registered: a commit naming the file's sha256 is refused, in one line
    lines = [{"key": "header", "value": {"summary": "add"}},
             {"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256",
                                          "oid": built["sha256"], "size": len(_data(4))}}]
    status, _, answer = call(ep, "POST", "/api/models/alice/private/commit/main",
                             token="write-alice",
                             body="\n".join(json.dumps(x) for x in lines).encode(),
                             headers={"Content-Type": "application/x-ndjson"})
    assert status == 400 and "was not uploaded" in _error(answer)
    status, _, answer = call(ep, "POST", "/cas/v1/shards", token=token, body=built["shard"])
    assert status == 200, answer
    _commit(xhub, "alice/private", "write-alice", "w.bin", _data(4))
    # kept as xorbs only, rebuilt for plain HTTP downloads, whole or by range
    data, url = _data(4), "/alice/private/resolve/main/w.bin"
    assert not xhub.state.hub.store.blob_path(built["sha256"]).exists()
    status, _, answer = call(ep, "GET", url, token="read-alice")
    assert status == 200 and answer == data
    status, headers, answer = call(ep, "GET", url, token="read-alice",
                                   headers={"Range": "bytes=70000-150000"})
    assert (status, answer) == (206, data[70000:150001])
    assert headers["content-range"] == f"bytes 70000-150000/{len(data)}"
    status, headers, answer = call(ep, "HEAD", url, token="read-alice")
    assert (status, headers["content-length"], answer) == (200, str(len(data)), b"")
    assert call(ep, "GET", url, token="read-alice",
                headers={"Range": f"bytes={len(data)}-"})[0] == 416
    assert call(ep, "GET", url, token="read-alice", headers={"Range": "bytes=-5"})[2] == data


def test_a_shard_cannot_use_a_xorb_of_a_repo_its_user_cannot_read(xhub):
    secret = built_upload(_data(5))
    _upload(xhub, "bob/secret", "write-bob", secret)
    token = xet_token(xhub.endpoint, "alice/private", "write-alice", write=True)
    status, _, answer = call(xhub.endpoint, "POST", "/cas/v1/shards", token=token,
                             body=secret["shard"])
    assert status == 400 and "does not have" in _error(answer)
    status, _, _ = call(xhub.endpoint, "HEAD", f"/cas/v1/xorbs/default/{secret['xorb_hex']}",
                        token=token)
    assert status == 404


def test_downloads_rebuild_files_and_ranges_only_for_readers(xhub):
    ep, data = xhub.endpoint, _data(6, 300_000)
    built = built_upload(data)
    _upload(xhub, "alice/private", "write-alice", built)
    _commit(xhub, "alice/private", "write-alice", "w.bin", data)
    token = xet_token(ep, "alice/private", "read-alice")
    for version in (1, 2):
        status, _, body = call(ep, "GET", f"/cas/v{version}/reconstructions/{built['file_hex']}",
                               token=token)
        assert status == 200 and rebuild(ep, json.loads(body)) == data
        status, _, body = call(ep, "GET", f"/cas/v{version}/reconstructions/{built['file_hex']}",
                               token=token, headers={"Range": "bytes=70000-150000"})
        assert rebuild(ep, json.loads(body))[:80001] == data[70000:150001]
    status, headers, _ = call(ep, "HEAD", f"/cas/v1/files/{built['file_hex']}", token=token)
    assert (status, headers["content-length"]) == (200, str(len(data)))
    status, _, body = call(ep, "POST", "/cas/v1/reconstructions", token=token,
                           body=json.dumps([{"prefix": "default", "hash": built["file_hex"]}])
                           .encode())
    assert status == 200 and built["file_hex"] in json.loads(body)["files"]
    assert call(ep, "GET", f"/cas/v1/reconstructions/{built['file_hex']}", token=token,
                headers={"Range": f"bytes={len(data)}-"})[0] == 416
    # another repo's token, even of the same user, a public one, or another user's: not found
    for repo, hub_token in (("alice/public", "write-alice"), ("bob/secret", "write-bob")):
        other = xet_token(ep, repo, hub_token)
        for method, path in (("GET", f"/cas/v2/reconstructions/{built['file_hex']}"),
                             ("HEAD", f"/cas/v1/files/{built['file_hex']}")):
            assert call(ep, method, path, token=other)[0] == 404
    # xorb URLs: only as signed, only the signed range
    answer = json.loads(call(ep, "GET", f"/cas/v2/reconstructions/{built['file_hex']}",
                             token=token)[2])
    entry = answer["xorbs"][built["xorb_hex"]][0]
    last = entry["ranges"][0]["bytes"]["end"]
    assert call(ep, "GET", entry["url"], headers={"Range": "bytes=0-10"})[0] == 206
    assert call(ep, "GET", entry["url"], headers={"Range": f"bytes=0-{last + 1}"})[0] == 403
    assert call(ep, "GET", entry["url"].replace("&s=", "&s=0"))[0] == 403
    assert call(ep, "GET", entry["url"].replace(f"r=0-{last}", "r=0-1"))[0] == 403


def test_global_dedupe_answers_only_from_readable_repos(xhub):
    ep, data = xhub.endpoint, _data(7)
    built = built_upload(data)
    _upload(xhub, "alice/private", "write-alice", built)
    first = hashing.hash_to_hex(built["hashes"][0])        # the first chunk of a file: indexed
    path = f"/cas/v1/chunks/default-merkledb/{first}"
    bob = xet_token(ep, "bob/secret", "write-bob")
    assert call(ep, "GET", path, token=bob)[0] == 404
    assert call(ep, "GET", path)[0] == 401
    alice = xet_token(ep, "alice/public", "write-alice")   # another of her repos: she reads it
    status, _, body = call(ep, "GET", path.replace("-merkledb", ""), token=alice)
    assert status == 200
    answer = shard.parse_shard(body)
    key = answer.footer.hmac_key
    assert key != hashing.ZERO_HASH and answer.files == []
    assert [hashing.hash_to_hex(x.xorb_hash) for x in answer.xorbs] == [built["xorb_hex"]]
    assert hashing.keyed_hash(built["hashes"][0], key) in {c.hash for c in answer.xorbs[0].chunks}
    assert built["hashes"][0] not in {c.hash for c in answer.xorbs[0].chunks}
    # once the private repo is public, anyone's token may dedupe against it
    xhub.api("write-alice").update_repo_settings("alice/private", private=False)
    assert call(ep, "GET", path, token=bob)[0] == 200


@pytest.mark.parametrize("path", [
    "/cas/v1/reconstructions/abc", "/cas/v2/reconstructions/" + "0" * 63 + "G",
    "/cas/v1/chunks/default/%2E%2E", "/cas/v1/files/" + "A" * 64, "/cas/xorbs/nothex",
])
def test_malformed_hashes_are_400s(xhub, path):
    token = xet_token(xhub.endpoint, "alice/public", "write-alice")
    method = "HEAD" if "/files/" in path else "GET"
    assert call(xhub.endpoint, method, path, token=token)[0] == 400


def test_random_shards_and_xorbs_never_get_a_5xx(xhub):
    ep, built = xhub.endpoint, built_upload(_data(8))
    token = xet_token(ep, "alice/private", "write-alice", write=True)
    rng = random.Random(9)
    for i in range(40):
        target = built["shard"] if i % 2 else built["xorb"]
        body = bytearray(target)
        for _ in range(rng.randint(1, 6)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        body = bytes(body[:rng.randint(1, len(body))]) if i % 3 == 0 else bytes(body)
        path = "/cas/v1/shards" if i % 2 else f"/cas/v1/xorbs/default/{built['xorb_hex']}"
        status, _, answer = call(ep, "POST", path, token=token, body=body)
        assert status < 500, answer
    assert call(ep, "POST", "/cas/v1/shards", token=token, body=os.urandom(5000))[0] == 400


def test_the_lfs_batch_offers_the_xet_transfer_to_clients_that_ask(xhub):
    lfs = "/alice/private.git/info/lfs/objects/batch"
    objects = [{"oid": "a" * 64, "size": 3}]
    for transfers, ref, expected in ((["basic", "multipart"], None, "basic"),
                                     (["basic", "xet"], {"name": "main"}, "xet"),
                                     (["xet"], 5, "xet")):
        body = {"operation": "upload", "transfers": transfers, "objects": objects, "ref": ref}
        status, _, answer = call(xhub.endpoint, "POST", lfs, token="write-alice",
                                 body=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
        doc = json.loads(answer)
        assert (status, doc["transfer"]) == (200, expected)
        href = doc["objects"][0]["actions"]["upload"]["href"]
        if expected == "xet":
            assert href == f"{xhub.endpoint}/api/models/alice/private/xet-write-token/main"
            assert call(xhub.endpoint, "GET", href, token="write-alice")[0] == 200
        else:
            assert "/info/lfs/objects/upload/" in href


def test_a_dedupe_answer_names_the_other_xorbs_of_the_same_file(xhub):
    import hashlib

    from patcher.hub.xet import chunking, xorb

    ep, data = xhub.endpoint, _data(11, 400_000)
    chunks = chunking.chunk_bytes(data)
    hashes = [hashing.chunk_hash(c) for c in chunks]
    halves = [(0, len(chunks) // 2), (len(chunks) // 2, len(chunks))]
    token = xet_token(ep, "alice/private", "write-alice", write=True)
    terms, verification, xorb_hexes = [], [], []
    for lo, hi in halves:
        raw = hashing.xorb_hash([(h, len(c)) for h, c in zip(hashes[lo:hi], chunks[lo:hi])])
        xorb_hexes.append(hashing.hash_to_hex(raw))
        assert call(ep, "POST", f"/cas/v1/xorbs/default/{xorb_hexes[-1]}", token=token,
                    body=xorb.serialize_xorb(chunks[lo:hi]))[0] == 200
        terms.append(shard.FileTerm(raw, sum(map(len, chunks[lo:hi])), 0, hi - lo))
        verification.append(hashing.verification_hash(hashes[lo:hi]))
    info = shard.FileInfo(hashing.file_hash([(h, len(c)) for h, c in zip(hashes, chunks)]),
                          tuple(terms), tuple(verification),
                          hashing.hex_to_hash(hashlib.sha256(data).hexdigest()))
    assert call(ep, "POST", "/cas/v1/shards", token=token,
                body=shard.serialize_shard(shard.Shard([info], [])))[0] == 200
    path = f"/cas/v1/chunks/default/{hashing.hash_to_hex(hashes[0])}"
    status, _, body = call(ep, "GET", path, token=xet_token(ep, "alice/public", "read-alice"))
    assert status == 200
    assert sorted(hashing.hash_to_hex(x.xorb_hash) for x in shard.parse_shard(body).xorbs) == \
        sorted(xorb_hexes)
    assert call(ep, "GET", path, token=xet_token(ep, "bob/secret", "write-bob"))[0] == 404


def test_the_streaming_shard_upload_ends_in_a_result_or_an_error_event(xhub, monkeypatch):
    ep, built = xhub.endpoint, built_upload(_data(12))
    token = xet_token(ep, "alice/private", "write-alice", write=True)
    call(ep, "POST", f"/cas/v1/xorbs/default/{built['xorb_hex']}", token=token,
         body=built["xorb"])
    bad = _shard_with(built, sha256=b"\x01" * 32)
    status, headers, body = call(ep, "POST", "/cas/v2/shards", token=token, body=bad)
    events = [json.loads(line) for line in body.splitlines()]
    assert status == 200 and headers["content-type"].startswith("application/x-ndjson")
    assert events[0]["type"] == "validating" and events[-1]["type"] == "error"
    assert "sha256" in events[-1]["message"] and "\n" not in events[-1]["message"]
    monkeypatch.setattr(routes_cas, "SHARD_HEARTBEAT_S", 0.001)
    status, _, body = call(ep, "POST", "/cas/v2/shards", token=token, body=built["shard"])
    events = [json.loads(line) for line in body.splitlines()]
    assert events[-1] == {"type": "result", "result": 1}
    assert call(ep, "POST", "/cas/v2/shards", body=built["shard"])[0] == 401
    assert call(ep, "POST", "/cas/v2/shards", token=xet_token(ep, "alice/private", "read-alice"),
                body=built["shard"])[0] == 403
