"""publish and pull through Xet against the embedded hub, with the real huggingface_hub and
hf_xet clients: a variant whose shards were rewritten sends only the chunks the hub lacks, pull
rebuilds it from the local base's chunks, and a hub that refuses Xet is spoken to over LFS."""
# ruff: noqa: F811

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hub_fixtures import TOKENS, configure_hf_client, running_hub  # noqa: F401

from patcher import api


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.fixture
def xet_hub(tmp_path, monkeypatch):
    """The embedded hub, with huggingface_hub free to use Xet (a fresh Xet cache: nothing is
    deduplicated against an earlier test's uploads on this machine)."""
    from huggingface_hub import constants

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet-cache"))
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    with running_hub(tmp_path / "hub", TOKENS) as running:
        yield running


def _refuse_xet(monkeypatch) -> None:
    """The hub's Xet token routes answer as an older hub's do (400: no Xet)."""
    from patcher.hub.server import app as server_app

    async def no_xet(hub, request, p):
        from patcher.hub.request_errors import BadRequest

        raise BadRequest("this hub does not speak Xet")

    routes = [(methods, rx, no_xet if "xet-" in rx.pattern else handler)
              for methods, rx, handler in server_app._COMPILED]
    monkeypatch.setattr(server_app, "_COMPILED", routes)


def test_a_hub_without_xet_gets_lfs(tmp_path, monkeypatch, caplog):
    _refuse_xet(monkeypatch)
    from huggingface_hub import constants

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    monkeypatch.setenv("HF_TOKEN", "write-alice")
    base, _ = _base_model(tmp_path / "base")
    variant = api.apply("drop-kv-scales", base, out=tmp_path / "variant").output
    with running_hub(tmp_path / "hub", TOKENS) as hub, \
            caplog.at_level(logging.INFO, logger="modelpatch"):
        result = api.publish(variant, "alice/old-hub", endpoint=hub.endpoint)
        pulled = api.pull("alice/old-hub", tmp_path / "pulled", endpoint=hub.endpoint)
    assert result.plan.transport == "lfs" and not result.plan.xet.files
    assert any("uploaded over Git LFS" in r.getMessage() for r in caplog.records)
    assert api.verify(pulled.output).ok
    assert constants.HF_HUB_DISABLE_XET is False          # only for the upload


SHARD_MB = 2


def _base_model(root: Path) -> tuple[Path, int]:
    """A two-shard model (each shard 2 MB of distinct random BF16 bytes, and the layer's two
    FP8 KV-cache scales in the middle of it); returns its directory and shard bytes."""
    import json
    import random

    from model_helpers import entry, st_bytes

    root.mkdir()
    weight_map, shard_bytes, tensor_bytes = {}, 0, 0
    for i in range(2):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        half = SHARD_MB * 1024 * 1024 // 2
        p = f"model.layers.{i}.self_attn"
        header, offset, data = {}, 0, b""
        for tensor, dtype, n in ((f"{p}.k_proj.weight", "BF16", half),
                                 (f"{p}.k_proj.k_scale", "F32", 4),
                                 (f"{p}.v_proj.v_scale", "F32", 4),
                                 (f"{p}.v_proj.weight", "BF16", half)):
            header[tensor] = entry(dtype, [n // (2 if dtype == "BF16" else 4)] if n > 4 else [],
                                   offset, offset + n)
            data += random.Random(f"{i}{tensor}").randbytes(n) if n > 4 else b"\0\0\x80\x3f"
            offset += n
            tensor_bytes += n
            weight_map[tensor] = name
        (root / name).write_bytes(st_bytes(header, data))
        shard_bytes += (root / name).stat().st_size
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": tensor_bytes}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
         "hidden_size": 64, "torch_dtype": "bfloat16"}))
    return root, shard_bytes


@pytest.fixture
def published(xet_hub, tmp_path):
    """The base published through Xet, downloaded into the Hugging Face cache (through Xet:
    huggingface_hub links the snapshot's blobs to its cache-wide shared store), and its
    drop-kv-scales variant made from that snapshot."""
    from huggingface_hub import snapshot_download

    base, shard_bytes = _base_model(tmp_path / "base")
    api.publish(base, "alice/base", base=True, endpoint=xet_hub.endpoint)
    snapshot = snapshot_download("alice/base", endpoint=xet_hub.endpoint)
    variant = api.apply("drop-kv-scales", snapshot, out=tmp_path / "variant").output
    return xet_hub, base, variant, shard_bytes


def test_publish_of_rewritten_shards_sends_only_new_chunks(published, caplog):
    hub, _, variant, shard_bytes = published
    before = hub.traffic.snapshot()[0]
    with caplog.at_level(logging.INFO, logger="modelpatch"):
        result = api.publish(variant, "alice/variant", endpoint=hub.endpoint)
    sent = hub.traffic.snapshot()[0] - before
    assert result.plan.transport == "xet"
    assert result.plan.xet.files >= 2 and result.plan.xet.file_bytes >= shard_bytes - 4096
    assert sent < shard_bytes // 4, (sent, shard_bytes)        # the shards were not sent
    assert result.plan.xet.new_bytes < shard_bytes // 4
    assert any("through Xet:" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("where", ["cache", "reuse"])
def test_pull_rebuilds_changed_shards_from_local_chunks(published, tmp_path, monkeypatch,
                                                        where):
    from huggingface_hub import constants

    hub, base, variant, shard_bytes = published
    api.publish(variant, "alice/variant", endpoint=hub.endpoint)
    reuse = ()
    if where == "reuse":               # no cache: the base is a directory given with --reuse
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        reuse = (base,)
    before = hub.traffic.snapshot()[1]
    result = api.pull("alice/variant", tmp_path / "pulled", endpoint=hub.endpoint, reuse=reuse)
    received = hub.traffic.snapshot()[1] - before
    assert api.verify(result.output).ok
    assert result.rebuilt_bytes >= shard_bytes - 4096
    assert result.received_bytes < shard_bytes // 4
    assert received < shard_bytes // 4, (received, shard_bytes)


def test_a_hub_lying_about_chunks_is_refused_and_nothing_is_left(published, tmp_path,
                                                                 monkeypatch):
    """A hub whose xorb bytes are other valid chunks: the rebuilt file does not have the
    variant's Xet hash, pull fails in one line and leaves neither output nor staging."""
    from patcher.errors import HubError
    from patcher.hub.client import xet_pull

    hub, _, variant, _ = published
    api.publish(variant, "alice/variant", endpoint=hub.endpoint)
    real = xet_pull.Cas.chunks

    def lying(self, fetch, what):
        return [(digest, bytes(len(data))) for digest, data in real(self, fetch, what)]

    monkeypatch.setattr(xet_pull.Cas, "chunks", lying)
    with pytest.raises(HubError, match="do not hash to its Xet hash") as err:
        api.pull("alice/variant", tmp_path / "pulled", endpoint=hub.endpoint)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "pulled").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(("pulled", ".pulled"))] == []


def test_a_dedupe_answer_covers_the_whole_file(tmp_path, monkeypatch):
    """One hit on an indexed chunk of a file answers all the xorbs of that file (a client
    rewriting it then dedupes the rest without a hit in each xorb), only for readers."""
    import hashlib
    import random

    from huggingface_hub import CommitOperationAdd
    from xet_clients import call, xet_token

    from patcher.hub.xet import chunking, hashing, shard, xorb

    configure_hf_client(monkeypatch, tmp_path / "hf-home")
    data = random.Random(5).randbytes(600_000)
    chunks = chunking.chunk_bytes(data)
    hashes = [hashing.chunk_hash(c) for c in chunks]
    halves = [range(0, len(chunks) // 2), range(len(chunks) // 2, len(chunks))]
    xorbs = [hashing.xorb_hash([(hashes[i], len(chunks[i])) for i in h]) for h in halves]
    terms = tuple(shard.FileTerm(x, sum(len(chunks[i]) for i in h), 0, len(h))
                  for x, h in zip(xorbs, halves))
    info = shard.FileInfo(hashing.file_hash([(h, len(c)) for h, c in zip(hashes, chunks)]),
                          terms, tuple(hashing.verification_hash([hashes[i] for i in h])
                                       for h in halves),
                          hashing.hex_to_hash(hashlib.sha256(data).hexdigest()))
    with running_hub(tmp_path / "hub", TOKENS) as hub:
        for repo, token, private in (("alice/m", "write-alice", True),
                                     ("bob/m", "write-bob", True)):
            hub.api(token).create_repo(repo, private=private)
        ep, write = hub.endpoint, xet_token(hub.endpoint, "alice/m", "write-alice", write=True)
        for x, h in zip(xorbs, halves):
            assert call(ep, "POST", f"/cas/v1/xorbs/default/{hashing.hash_to_hex(x)}",
                        token=write, body=xorb.serialize_xorb([chunks[i] for i in h]))[0] == 200
        assert call(ep, "POST", "/cas/v1/shards", token=write,
                    body=shard.serialize_shard(shard.Shard([info], [])))[0] == 200
        hub.api("write-alice").create_commit("alice/m", operations=[
            CommitOperationAdd("w.bin", data)], commit_message="add")
        path = f"/cas/v1/chunks/default/{hashing.hash_to_hex(hashes[0])}"
        status, _, body = call(ep, "GET", path, token=xet_token(ep, "alice/m", "read-alice"))
        assert status == 200
        assert {x.xorb_hash for x in shard.parse_shard(body).xorbs} == set(xorbs)
        assert call(ep, "GET", path, token=xet_token(ep, "bob/m", "write-bob"))[0] == 404
