"""The change log's records (``patcher.plan.changes``): each kind's JSON, keys in order, is pinned
here, because the plan's ``--json`` and the provenance manifest's bytes come from it."""

from __future__ import annotations

import hashlib
import json

import pytest

from patcher.integrity.canonical_json import canonical_json
from patcher.integrity.change_log import grouped
from patcher.plan.changes import (
    ABSENT,
    ContentSource,
    FileAdded,
    FileDropped,
    GgufMetadata,
    GgufResharded,
    Resharded,
    TensorAdded,
    TensorConverted,
    TensorDropped,
    TensorRenamed,
    changes_json,
)

B = {"dtype": "F8_E4M3", "shape": [4, 4]}
A = {"dtype": "BF16", "shape": [4, 4]}

PINNED = [
    (FileDropped("a.json", size=3), '{"kind": "file_dropped", "file": "a.json", "size": 3}'),
    (FileDropped("s.safetensors", reason="no tensors left"),
     '{"kind": "file_dropped", "file": "s.safetensors", "reason": "no tensors left"}'),
    (FileAdded("t.jinja", 5, True, {"from": "t.jinja", "sha256": "ab"}),
     '{"kind": "file_added", "file": "t.jinja", "size": 5, "replaced": true, "from": "t.jinja", '
     '"sha256": "ab"}'),
    (TensorDropped("w", "s", B, "r:1:2", dtype="F8_E4M3", shape=[4, 4]),
     '{"kind": "tensor_dropped", "tensor": "w", "dtype": "F8_E4M3", "shape": [4, 4], "shard": "s", '
     '"before": {"dtype": "F8_E4M3", "shape": [4, 4]}, "after": null, "recipe_line": "r:1:2"}'),
    (TensorDropped("w_s", "s", B, "r:1:2", dtype="F32", shape=[], companion_of="w",
                   reason="dequantize:fp8-tensor"),
     '{"kind": "tensor_dropped", "tensor": "w_s", "dtype": "F32", "shape": [], "shard": "s", '
     '"before": {"dtype": "F8_E4M3", "shape": [4, 4]}, "after": null, "recipe_line": "r:1:2", '
     '"companion_of": "w", "reason": "dequantize:fp8-tensor"}'),
    (TensorDropped("blk.3.x", "m.gguf", A, "r:3:4"),
     '{"kind": "tensor_dropped", "tensor": "blk.3.x", "shard": "m.gguf", "before": {"dtype": '
     '"BF16", "shape": [4, 4]}, "after": null, "recipe_line": "r:3:4"}'),
    (TensorRenamed("a", "b", "s", A, A, "r:5:6"),
     '{"kind": "tensor_renamed", "tensor": "a", "to": "b", "shard": "s", "before": {"dtype": '
     '"BF16", "shape": [4, 4]}, "after": {"dtype": "BF16", "shape": [4, 4]}, "recipe_line": '
     '"r:5:6"}'),
    (TensorConverted("w", "dequantize:nvfp4-modelopt", "s", B, A, "r:7:8", removed=["w_s"],
                     to="w2"),
     '{"kind": "tensor_converted", "tensor": "w", "how": "dequantize:nvfp4-modelopt", "shard": '
     '"s", "before": {"dtype": "F8_E4M3", "shape": [4, 4]}, "after": {"dtype": "BF16", "shape": '
     '[4, 4]}, "recipe_line": "r:7:8", "removed": ["w_s"], "to": "w2"}'),
    (TensorConverted("w", "quantize:fp8-block", "s", A, B, "r:9:1", added=["w_scale_inv"]),
     '{"kind": "tensor_converted", "tensor": "w", "how": "quantize:fp8-block", "shard": "s", '
     '"before": {"dtype": "BF16", "shape": [4, 4]}, "after": {"dtype": "F8_E4M3", "shape": [4, '
     '4]}, "recipe_line": "r:9:1", "added": ["w_scale_inv"]}'),
    (TensorAdded("c", "s", "copy", A, "r:2:2", copy_of="a"),
     '{"kind": "tensor_added", "tensor": "c", "copy_of": "a", "shard": "s", "reason": "copy", '
     '"before": null, "after": {"dtype": "BF16", "shape": [4, 4]}, "recipe_line": "r:2:2"}'),
    (TensorAdded("w_s", "s", "quantize:fp8-tensor", A, "r:2:3", companion_of="w"),
     '{"kind": "tensor_added", "tensor": "w_s", "companion_of": "w", "shard": "s", "reason": '
     '"quantize:fp8-tensor", "before": null, "after": {"dtype": "BF16", "shape": [4, 4]}, '
     '"recipe_line": "r:2:3"}'),
    (Resharded(1000, 3, 5),
     '{"kind": "resharded", "max_shard_size": 1000, "shards_before": 3, "shards_after": 5}'),
    (GgufMetadata("drop", "k", "r:1:1", before=1),
     '{"kind": "gguf_metadata", "op": "drop", "key": "k", "before": 1, "recipe_line": "r:1:1"}'),
    (GgufMetadata("rename", "k", "r:1:1", to="k2"),
     '{"kind": "gguf_metadata", "op": "rename", "key": "k", "to": "k2", "recipe_line": "r:1:1"}'),
    (GgufMetadata("set", "k", "r:1:1", before=None, after="x", type="STRING"),
     '{"kind": "gguf_metadata", "op": "set", "key": "k", "before": null, "after": "x", "type": '
     '"STRING", "recipe_line": "r:1:1"}'),
]

# kinds and fields added after the change log's format was pinned by the hash below
PINNED_LATER = [
    (TensorAdded("k_scale", "s", "split", B, "r:4:4", split_from="kv_scale"),
     '{"kind": "tensor_added", "tensor": "k_scale", "split_from": "kv_scale", "shard": "s", '
     '"reason": "split", "before": null, "after": {"dtype": "F8_E4M3", "shape": [4, 4]}, '
     '"recipe_line": "r:4:4"}'),
    (GgufResharded(1000, ["m.gguf"], ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]),
     '{"kind": "gguf_resharded", "max_shard_size": 1000, "files_before": ["m.gguf"], '
     '"files_after": ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]}'),
    (ContentSource("t.jinja", {"resolved": "hf://o/n@c/t.jinja", "sha256": "ab", "size": 5},
                   "r:6:7", endpoint="http://127.0.0.1:1"),
     '{"kind": "content_source", "target": "t.jinja", "resolved": "hf://o/n@c/t.jinja", '
     '"sha256": "ab", "size": 5, "recipe_line": "r:6:7", "endpoint": "http://127.0.0.1:1"}'),
    (ContentSource("config.json /x", {"resolved": "a local file", "sha256": "cd", "size": 1},
                   "r:8:9"),
     '{"kind": "content_source", "target": "config.json /x", "resolved": "a local file", '
     '"sha256": "cd", "size": 1, "recipe_line": "r:8:9"}'),
]


@pytest.mark.parametrize("record, expected", PINNED + PINNED_LATER,
                         ids=[type(r).__name__ for r, _ in PINNED + PINNED_LATER])
def test_each_kind_writes_its_keys_in_the_order_the_change_log_has(record, expected):
    assert json.dumps(record.to_json()) == expected


def test_the_manifest_bytes_of_a_change_log_are_pinned():
    """canonical JSON (sorted keys) of every kind above: the manifest's changes byproduct."""
    import hashlib

    data = canonical_json(changes_json([r for r, _ in PINNED]))
    assert hashlib.sha256(data).hexdigest() == (
        "dfc5d1322aaead6718b96c8aa6e784d8931a15309cf1e822e5bf91245f414a8a")


def test_a_null_value_is_written_and_an_absent_one_is_not():
    assert GgufMetadata("set", "k", "r", before=None, after=1).to_json()["before"] is None
    assert "before" not in GgufMetadata("rename", "k", "r", to="x").to_json()
    assert repr(ABSENT) == "ABSENT"


def _kimi_scale_log(layers: int = 61, experts: int = 384) -> list[dict]:
    """The per-tensor log of nvfp4-to-bf16 at Kimi-K2.5's scale: every expert projection
    converted, its three scales dropped beside it, across 119 shards (~273k records)."""
    log, shard = [], 0
    for layer in range(layers):
        for expert in range(experts):
            shard = (shard + 1) % 119
            for proj in ("gate_proj", "up_proj", "down_proj"):
                w = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                s = f"model-{shard + 1:05d}-of-00119.safetensors"
                log.append(TensorConverted(w, "dequantize:nvfp4-modelopt", s,
                                           {"dtype": "U8", "shape": [2048, 3584]},
                                           {"dtype": "BF16", "shape": [2048, 7168]},
                                           "nvfp4-to-bf16:12:5", removed=[]).to_json())
                for scale, dtype in (("weight_scale", "F8_E4M3"), ("weight_scale_2", "F32"),
                                     ("input_scale", "F32")):
                    log.append(TensorDropped(w[:-len("weight")] + scale, s, {"dtype": dtype},
                                             "nvfp4-to-bf16:12:5", companion_of=w,
                                             reason="dequantize:nvfp4-modelopt").to_json())
    return log


def test_the_manifest_records_tensor_changes_per_rule_in_under_a_megabyte():
    log = _kimi_scale_log()
    assert len(log) > 270_000
    config_edit = {"kind": "config", "file": "config.json", "op": "remove",
                   "path": "/quantization_config"}
    records = grouped([config_edit, *log])
    assert records[0] == config_edit
    assert [(r["change"], r["count"]) for r in records[1:]] == [
        ("tensor_converted", len(log) // 4), ("tensor_dropped", len(log) // 4),
        ("tensor_dropped", len(log) // 2)]
    assert len(canonical_json(records)) < 10_000   # the per-tensor log was ~100 MB
    # the digest of a group is sha256 over its sorted member names, one per line
    converted = sorted(e["tensor"] for e in log if e["kind"] == "tensor_converted")
    assert records[1]["members_sha256"] == hashlib.sha256(
        "".join(f"{n}\n" for n in converted).encode()).hexdigest()
    assert records[1]["examples"] == converted[:3]


def test_rules_that_differ_in_line_dtype_or_kind_are_separate_groups():
    a = TensorDropped("a", "s", B, "r:1:2").to_json()
    b = TensorDropped("b", "s", A, "r:1:2").to_json()
    c = TensorDropped("c", "s", B, "r:3:2").to_json()
    d = TensorRenamed("d", "e", "s", A, A, "r:1:2").to_json()
    groups = grouped([a, b, c, d, TensorDropped("f", "s", B, "r:1:2").to_json()])
    assert [(g["count"], g["examples"]) for g in groups] == [
        (2, ["a", "f"]), (1, ["b"]), (1, ["c"]), (1, ["d"])]
    # a rename's target is part of what the digest proves
    assert groups[3]["members_sha256"] == hashlib.sha256(b"d\te\n").hexdigest()
