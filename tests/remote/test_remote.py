"""``inspect``/``plan`` of ``hf://`` models: JSON files and safetensors headers only, by Range."""

from __future__ import annotations

import json
import struct

import pytest
from hub_fixtures import TOKENS, configure_hf_client, running_hub
from remote_fixtures import big_sharded_model, store_model

from patcher import api
from patcher.errors import HubError, SafetensorsFormatError, ShardIndexError
from patcher.remote.model import RemoteModel

BIG = "alice/big"
KIMI = "alice/Kimi-K2.5-NVFP4"


def _kimi_with_real_vocab_share(path):
    """The Kimi-K2.5-NVFP4 look-alike with a vocabulary of 8192 (real: 163840) instead of 1024:
    at 4.4 MB its JSON files alone would be 1.6% of it; the real repo's headers are ~0.01%."""
    from examples import generate

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(generate.KIMI_TEXT, "vocab_size", 8192)
        return generate.make_kimi_nvfp4(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One hub for the module: ``alice/big`` (16 MiB, 4 shards) and hostile repositories."""
    base = tmp_path_factory.mktemp("remote")
    model = big_sharded_model(base / "big")
    hub_root = base / "hub"
    store_model(hub_root, BIG, model)
    store_model(hub_root, KIMI, _kimi_with_real_vocab_share(base / "kimi"))
    with pytest.MonkeyPatch.context() as mp:
        configure_hf_client(mp, base / "hf-home")
        with running_hub(hub_root, TOKENS) as hub:
            yield hub, model


def _hostile_repo(served, repo: str, shard: bytes, index: dict | None = None) -> str:
    hub, model = served
    d = hub.root.parent / repo.replace("/", "--")
    d.mkdir()
    (d / "config.json").write_bytes((model / "config.json").read_bytes())
    name = "model.safetensors" if index is None else "model-00001-of-00001.safetensors"
    (d / name).write_bytes(shard)
    if index is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    store_model(hub.root, repo, d)
    return f"hf://{repo}"


def test_inspect_remote_matches_local_and_fetches_under_one_percent(served):
    hub, model = served
    remote = api.inspect(f"hf://{BIG}", endpoint=hub.endpoint)
    local = api.inspect(model)
    for key in ("architectures", "quantization", "tensors", "kv_cache_tensors"):
        assert getattr(remote, key) == getattr(local, key)
    assert remote.shards["files"] == local.shards["files"]
    assert remote.index == local.index
    assert remote.path == f"hf://{BIG}"
    transfer = remote.remote
    size = sum(f.stat().st_size for f in model.iterdir())
    assert transfer["repo_bytes"] == size
    assert 0 < transfer["bytes_transferred"] < size / 100
    # the listing, 2 requests per shard (length, then header), the index and config.json
    assert transfer["requests"] == 1 + 2 * 4 + 2


def test_remote_headers_agree_with_huggingface_hub_metadata(served):
    """The real client's ranged reader (get_safetensors_metadata) against the embedded hub."""
    hub, _ = served
    meta = hub.api().get_safetensors_metadata(BIG)
    model = RemoteModel.open(f"hf://{BIG}", endpoint=hub.endpoint)
    assert meta.weight_map == model.tensor_shards
    for shard, info in meta.files_metadata.items():
        ours = model.shards[shard].tensors
        theirs = {n: (t.dtype, list(t.shape), list(t.data_offsets))
                  for n, t in info.tensors.items()}
        assert theirs == {n: (t.dtype, list(t.shape), [t.start, t.end]) for n, t in ours.items()}


def test_embedded_hub_serves_exact_byte_ranges(served):
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import get_session

    hub, model = served
    name = "model-00002-of-00004.safetensors"
    url = hf_hub_url(BIG, name, endpoint=hub.endpoint)
    answer = get_session().get(url, headers={"Range": "bytes=3-10"})
    assert answer.status_code == 206
    assert answer.content == (model / name).read_bytes()[3:11]
    assert answer.headers["Content-Range"] == f"bytes 3-10/{(model / name).stat().st_size}"


CTX_RECIPE = ("modelpatch: 1\nname: ctx\ndescription: longer context\nconfig:\n  config.json:\n"
              "    - {set: /max_position_embeddings, value: 8192}\n")


def test_remote_plan_cli_shows_the_transfer(served, tmp_path, capsys):
    from patcher.cli import main

    hub, _ = served
    (tmp_path / "ctx.yaml").write_text(CTX_RECIPE)
    args = ["plan", str(tmp_path / "ctx.yaml"), f"hf://{BIG}", "--endpoint", hub.endpoint]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--json"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    out = json.loads(captured.out)
    assert out["base"] == f"hf://{BIG}"
    assert [f["path"] for f in out["files"] if f["action"] == "write-json"] == ["config.json"]
    assert 0 < out["remote"]["bytes_transferred"] < out["remote"]["repo_bytes"] / 100
    with pytest.raises(SystemExit):
        main(args)
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("fetched ") and "of the repository's 16.01 MiB (alice/big@" in last


def test_hostile_remote_header_gets_the_local_one_line_error(served):
    header = b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}'
    url = _hostile_repo(served, "alice/hostile-header",
                        struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(SafetensorsFormatError) as err:
        RemoteModel.open(url, endpoint=served[0].endpoint)
    assert "needs 8 bytes but data_offsets span 16" in str(err.value)
    assert "hf://alice/hostile-header/model.safetensors" in str(err.value)


def test_absurd_remote_header_length_is_refused_before_reading_it(served):
    url = _hostile_repo(served, "alice/absurd", struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(SafetensorsFormatError, match="absurd"):
        RemoteModel.open(url, endpoint=served[0].endpoint)


def test_remote_index_is_checked_against_the_headers(served):
    header = b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    shard = struct.pack("<Q", len(header)) + header + b"\0" * 8
    url = _hostile_repo(served, "alice/bad-index", shard, index={
        "metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors",
                                       "ghost": "model-00001-of-00001.safetensors"}})
    with pytest.raises(ShardIndexError, match="ghost|no such tensor"):
        RemoteModel.open(url, endpoint=served[0].endpoint)


def test_unknown_remote_repo_is_a_one_line_hub_error(served):
    with pytest.raises(HubError, match="not found"):
        RemoteModel.open("hf://alice/nothing-here", endpoint=served[0].endpoint)


def test_doctor_on_the_hub_finds_the_fp8_kv_blocker_before_any_download(served, tmp_path):
    """The issue's case: Kimi-K2.5-NVFP4 for vLLM 0.15.1 on SM120, known before the download."""
    from click.testing import CliRunner

    from patcher.cli import main

    hub, _ = served
    args = ["doctor", f"hf://{KIMI}", "--endpoint", hub.endpoint, "--engine", "vllm==0.15.1",
            "--gpu", "sm120"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    findings = {f["rule"]: f for f in report["findings"]}
    assert set(findings) == {"fp8-kv-mla-vllm-sm120", "eos-inconsistent"}   # EOS as Kimi's
    finding = findings["fp8-kv-mla-vllm-sm120"]
    assert (finding["rule"], finding["severity"]) == ("fp8-kv-mla-vllm-sm120", "blocker")
    assert finding["fix"] == {"recipe": "sm120-fp16-kv"}
    assert finding["evidence"][0] == {"source": "https://github.com/vllm-project/vllm/pull/34597",
                                      "versions": "vllm < 0.18.0 (fixed in v0.18.0)"}
    remote = report["remote"]
    assert 0 < remote["bytes_transferred"] < remote["repo_bytes"] / 100
    assert not list((hub.root.parent / "hf-home").glob("**/*.safetensors"))   # nothing cached

    fixed = CliRunner().invoke(main, [*args, "--fix", "-o", str(tmp_path / "fixed")])
    assert fixed.exit_code == 0, fixed.output
    assert fixed.output.splitlines()[-1] == "no findings"        # the second diagnosis
    assert list((hub.root.parent / "hf-home").glob("**/*.safetensors"))     # apply hf:// path
    assert api.verify(tmp_path / "fixed").ok


def test_oversized_remote_json_is_refused_not_fetched(served, monkeypatch):
    from patcher.remote import model as remote_model

    monkeypatch.setattr(remote_model, "MAX_FETCHED_FILE", 100)      # config.json is larger
    with pytest.raises(remote_model.ModelDirError, match="not fetched for a remote model"):
        RemoteModel.open(f"hf://{BIG}", endpoint=served[0].endpoint)


def test_a_range_answer_for_another_file_size_is_refused(served):
    """The listing said one size, the hub's Content-Range another: the file is not the one
    listed, and nothing read from it is trusted."""
    from patcher.remote.hub_files import HubFiles

    files = HubFiles(BIG, None, served[0].endpoint)
    name = "model-00001-of-00004.safetensors"
    assert len(files.read(name, 0, 8)) == 8
    files.sizes[name] += 1
    with pytest.raises(HubError, match="the hub sent Content-Range"):
        files.read(name, 0, 8)
