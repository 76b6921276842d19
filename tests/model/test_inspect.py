"""``modelpatch inspect``: an exact report from headers and JSON only.

The fixture is a small Kimi-K2.5-shaped checkpoint (ModelOpt NVFP4 text model under
``language_model.``, BF16 attention, FP8 KV scales, a BF16 vision tower), written with
``safetensors.torch.save_file``. Every expected number is computed in the test from a hand-labelled
tensor table, not with the code under test.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from patcher.cli import main
from patcher.errors import ModelDirError
from patcher.model.inspect_model import inspect_model
from patcher.model.model_dir import INDEX_NAME, ModelDir
from patcher.model.safetensors_io import read_header

TORCH_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "U8": torch.uint8,
                "F8_E4M3": torch.float8_e4m3fn, "F16": torch.float16}
ITEMSIZE = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1, "F16": 2}


@dataclass(frozen=True)
class Spec:
    """A tensor of the fixture, labelled by hand."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    group: str
    scale: bool = False       # its bytes count as scale_bytes and it has no parameters
    packed_fp4: bool = False  # U8 holding two FP4 codes per byte

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]

    @property
    def params(self) -> int:
        return 0 if self.scale else self.numel * (2 if self.packed_fp4 else 1)

    def tensor(self) -> torch.Tensor:
        if self.dtype == "U8":
            return torch.randint(0, 256, self.shape, dtype=torch.uint8)
        return torch.rand(self.shape).to(TORCH_DTYPES[self.dtype])


def nvfp4_linear(prefix: str, out: int, inp: int, group: str) -> list[Spec]:
    """ModelOpt NVFP4: uint8 [out, in/2], e4m3 [out, in/16], fp32 scalars."""
    return [Spec(f"{prefix}.weight", "U8", (out, inp // 2), group, packed_fp4=True),
            Spec(f"{prefix}.weight_scale", "F8_E4M3", (out, inp // 16), group, scale=True),
            Spec(f"{prefix}.weight_scale_2", "F32", (), group, scale=True),
            Spec(f"{prefix}.input_scale", "F32", (), group, scale=True)]


H, INTER, MOE_INTER, VOCAB, Q_LORA, KV_LORA, HEADS_DIM, EXPERTS = 64, 128, 32, 96, 32, 32, 48, 2
TEXT = "language_model.model"


def attention(layer: int) -> list[Spec]:
    p = f"{TEXT}.layers.{layer}.self_attn"
    return [
        Spec(f"{p}.q_a_proj.weight", "BF16", (Q_LORA, H), "attention"),
        Spec(f"{p}.q_a_layernorm.weight", "BF16", (Q_LORA,), "norms"),
        Spec(f"{p}.q_b_proj.weight", "BF16", (HEADS_DIM, Q_LORA), "attention"),
        Spec(f"{p}.kv_a_proj_with_mqa.weight", "BF16", (KV_LORA + 16, H), "attention"),
        Spec(f"{p}.kv_a_layernorm.weight", "BF16", (KV_LORA,), "norms"),
        Spec(f"{p}.kv_b_proj.weight", "BF16", (HEADS_DIM * 2, KV_LORA), "attention"),
        Spec(f"{p}.o_proj.weight", "BF16", (H, HEADS_DIM), "attention"),
        Spec(f"{p}.k_proj.k_scale", "F32", (), "attention", scale=True),
        Spec(f"{p}.v_proj.v_scale", "F32", (), "attention", scale=True),
    ]


def layer_norms(layer: int) -> list[Spec]:
    p = f"{TEXT}.layers.{layer}"
    return [Spec(f"{p}.input_layernorm.weight", "BF16", (H,), "norms"),
            Spec(f"{p}.post_attention_layernorm.weight", "BF16", (H,), "norms")]


def kimi_specs() -> dict[str, list[Spec]]:
    """Three shards. The scale of one expert sits in a different shard than its weight."""
    shard1 = [Spec(f"{TEXT}.embed_tokens.weight", "BF16", (VOCAB, H), "embeddings")]
    shard1 += layer_norms(0) + attention(0)
    for proj, (o, i) in {"gate_proj": (INTER, H), "up_proj": (INTER, H),
                         "down_proj": (H, INTER)}.items():
        shard1 += nvfp4_linear(f"{TEXT}.layers.0.mlp.{proj}", o, i, "dense_mlp")

    shard2 = layer_norms(1) + attention(1) + [
        Spec(f"{TEXT}.layers.1.mlp.gate.weight", "BF16", (EXPERTS, H), "other"),
        Spec(f"{TEXT}.layers.1.mlp.gate.e_score_correction_bias", "F32", (EXPERTS,), "other"),
    ]
    moved = []
    for e in range(EXPERTS):
        for proj, (o, i) in {"gate_proj": (MOE_INTER, H), "up_proj": (MOE_INTER, H),
                             "down_proj": (H, MOE_INTER)}.items():
            specs = nvfp4_linear(f"{TEXT}.layers.1.mlp.experts.{e}.{proj}", o, i,
                                 "routed_experts")
            if e == 1 and proj == "down_proj":
                moved.append(specs.pop(1))  # weight_scale goes to shard 3
            shard2 += specs
    for proj, (o, i) in {"gate_proj": (MOE_INTER, H), "up_proj": (MOE_INTER, H),
                         "down_proj": (H, MOE_INTER)}.items():
        shard2 += nvfp4_linear(f"{TEXT}.layers.1.mlp.shared_experts.{proj}", o, i,
                               "shared_experts")
    shard2 += [Spec(f"{TEXT}.norm.weight", "BF16", (H,), "norms"),
               Spec("language_model.lm_head.weight", "BF16", (VOCAB, H), "lm_head")]

    v = "vision_tower.encoder.blocks.0"
    shard3 = moved + [
        Spec("vision_tower.patch_embed.proj.weight", "BF16", (32, 3 * 4 * 4), "vision"),
        Spec(f"{v}.norm0.weight", "BF16", (32,), "vision"),
        Spec(f"{v}.attn.wqkv.weight", "BF16", (96, 32), "vision"),
        Spec(f"{v}.attn.wqkv.bias", "BF16", (96,), "vision"),
        Spec(f"{v}.mlp.fc0.weight", "F32", (64, 32), "vision"),
        Spec("mm_projector.pre_norm.weight", "BF16", (32,), "vision"),
        Spec("mm_projector.proj.0.weight", "BF16", (H, 32), "vision"),
        Spec("mm_projector.proj.0.bias", "BF16", (H,), "vision"),
    ]
    return {"model-00001-of-00003.safetensors": shard1,
            "model-00002-of-00003.safetensors": shard2,
            "model-00003-of-00003.safetensors": shard3}


IGNORE = ["language_model.lm_head", "vision_tower*", "mm_projector*",
          "language_model.model.layers.*.self_attn*"]


def kimi_config(kv_cache: bool = True) -> dict:
    qc = {
        "config_groups": {"group_0": {
            "input_activations": {"dynamic": False, "num_bits": 4, "type": "float",
                                  "group_size": 16},
            "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16,
                        "strategy": "tensor_group"},
            "targets": ["Linear"]}},
        "ignore": IGNORE,
        "producer": {"name": "modelopt", "version": "0.39.0"},
        "quant_algo": "NVFP4",
        "quant_method": "modelopt",
    }
    if kv_cache:
        qc["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "dynamic": False}
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                        "hidden_size": H, "n_routed_experts": EXPERTS,
                        "first_k_dense_replace": 1, "num_hidden_layers": 2},
        "vision_config": {"model_type": "moonvit", "hidden_size": 32},
        "quantization_config": qc,
    }


def hf_quant_config(kv_cache: str | None = "FP8", algo: str = "NVFP4", group_size: int = 16,
                    exclude: list[str] | None = None) -> dict:
    quant = {"quant_algo": algo, "group_size": group_size,
             "exclude_modules": IGNORE if exclude is None else exclude}
    if kv_cache:
        quant["kv_cache_quant_algo"] = kv_cache
    return {"producer": {"name": "modelopt", "version": "0.39.0"}, "quantization": quant}


def write_model(root: Path, specs: dict[str, list[Spec]], config: dict | None,
                hf_quant: dict | None = None, index: bool = True) -> Path:
    root.mkdir(parents=True)
    torch.manual_seed(0)
    weight_map = {}
    for shard, items in specs.items():
        save_file({s.name: s.tensor() for s in items}, str(root / shard),
                  metadata={"format": "pt"})
        weight_map.update({s.name: shard for s in items})
    if index:
        total = sum(s.nbytes for items in specs.values() for s in items)
        (root / INDEX_NAME).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    if config is not None:
        (root / "config.json").write_text(json.dumps(config, indent=2))
    if hf_quant is not None:
        (root / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=4))
    (root / "tokenizer_config.json").write_text("{}")
    return root


def counts(specs) -> dict:
    return {"tensors": len(specs), "params": sum(s.params for s in specs),
            "bytes": sum(s.nbytes for s in specs if not s.scale),
            "scale_bytes": sum(s.nbytes for s in specs if s.scale)}


def grouped(specs, key) -> dict:
    out = defaultdict(list)
    for s in specs:
        out[key(s)].append(s)
    return {k: counts(v) for k, v in out.items()}


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("kimi") / "Kimi-K2.5-NVFP4", kimi_specs(),
                       kimi_config(), hf_quant_config())


# --- the report ------------------------------------------------------------------------------


def test_report_is_exact(kimi: Path):
    specs = [s for items in kimi_specs().values() for s in items]
    report = inspect_model(ModelDir.open(kimi))

    assert report["report_version"] == 2
    assert report["path"] == str(kimi)
    assert report["hf_cache_snapshot"] is False

    # Totals: from the table, from the headers on disk, and from the index all agree.
    totals = counts(specs)
    assert report["tensors"]["totals"] == totals
    headers = {shard: read_header(kimi / shard) for shard in kimi_specs()}
    on_disk = sum(h.data_size for h in headers.values())
    index_total = json.loads((kimi / INDEX_NAME).read_text())["metadata"]["total_size"]
    assert totals["bytes"] + totals["scale_bytes"] == on_disk == index_total
    assert report["index"] == {"present": True, "total_size": index_total,
                               "tensors": len(specs), "healthy": True, "warnings": []}

    assert report["tensors"]["per_dtype"] == grouped(specs, lambda s: s.dtype)
    assert list(report["tensors"]["per_dtype"]) == sorted({s.dtype for s in specs})
    assert report["tensors"]["per_group"] == grouped(specs, lambda s: s.group)
    # NVFP4 weights count two parameters per byte.
    assert report["tensors"]["per_dtype"]["U8"]["params"] == \
        2 * report["tensors"]["per_dtype"]["U8"]["bytes"]

    assert report["shards"] == {
        "count": 3,
        "total_file_bytes": sum((kimi / s).stat().st_size for s in kimi_specs()),
        "files": [{"name": s, "size": (kimi / s).stat().st_size, "tensors": len(items)}
                  for s, items in kimi_specs().items()]}

    expected_kv = sorted(s.name for s in specs if s.name.endswith(("k_proj.k_scale",
                                                                   "v_proj.v_scale")))
    assert len(expected_kv) == 4
    assert sorted(k["name"] for k in report["kv_cache_tensors"]) == expected_kv
    assert all(k["dtype"] == "F32" and k["shape"] == [] for k in report["kv_cache_tensors"])

    assert report["architectures"] == [
        {"path": "/", "architectures": ["KimiK25ForConditionalGeneration"],
         "model_type": "kimi_k25"},
        {"path": "/text_config", "architectures": ["DeepseekV3ForCausalLM"],
         "model_type": "deepseek_v3"},
        {"path": "/vision_config", "architectures": None, "model_type": "moonvit"},
    ]
    assert report["quantization"] == {
        "config": {"path": "/quantization_config", "quant_method": "modelopt",
                   "quant_algo": "NVFP4", "format": None,
                   "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                               "group_size": 16},
                   "group_size": 16, "kv_cache": "FP8", "ignore": IGNORE},
        "hf_quant_config": {"producer": "modelopt", "producer_version": "0.39.0",
                            "quant_algo": "NVFP4", "group_size": 16, "kv_cache": "FP8",
                            "exclude_modules": IGNORE},
        "disagreements": [],
    }
    # 3 shards + index, config.json, hf_quant_config.json, tokenizer_config.json
    assert report["files"] == 3 + 4


def test_quantization_disagreements_are_listed(tmp_path: Path):
    """The half-done manual fix: kv_cache_scheme gone from config.json, still in hf_quant."""
    model = write_model(tmp_path / "m", kimi_specs(), kimi_config(kv_cache=False),
                        hf_quant_config(kv_cache="FP8", algo="FP8", group_size=32,
                                        exclude=IGNORE[:2] + ["extra.module"]))
    q = inspect_model(ModelDir.open(model))["quantization"]
    assert q["config"]["kv_cache"] is None and q["hf_quant_config"]["kv_cache"] == "FP8"
    assert q["disagreements"] == [
        "quant_algo: config.json NVFP4 vs hf_quant_config.json FP8",
        "group_size: config.json 16 vs hf_quant_config.json 32",
        "KV cache: config.json none vs hf_quant_config.json FP8",
        "ignore lists differ: 2 only in config.json, 1 only in hf_quant_config.json",
    ]
    result = invoke("inspect", str(model))
    assert result.exit_code == 0, result.output
    disagree = [line for line in result.stdout.splitlines() if line.startswith("DISAGREE")]
    assert len(disagree) == 4 and "KV cache: config.json none vs hf_quant_config.json FP8" in \
        disagree[2]


def test_quantization_config_nested_in_text_config(tmp_path: Path):
    config = kimi_config()
    config["text_config"]["quantization_config"] = config.pop("quantization_config")
    model = write_model(tmp_path / "m", kimi_specs(), config)
    q = inspect_model(ModelDir.open(model))["quantization"]
    assert q["config"]["path"] == "/text_config/quantization_config"
    assert q["config"]["kv_cache"] == "FP8"
    assert q["hf_quant_config"] is None and q["disagreements"] == []


def test_compressed_tensors_nvfp4_model(tmp_path: Path):
    p = "model.layers.0"
    specs = {"model.safetensors": [
        Spec("model.embed_tokens.weight", "BF16", (32, 32), "embeddings"),
        Spec(f"{p}.self_attn.q_proj.weight_packed", "U8", (32, 16), "attention",
             packed_fp4=True),
        Spec(f"{p}.self_attn.q_proj.weight_scale", "F8_E4M3", (32, 2), "attention", scale=True),
        Spec(f"{p}.self_attn.q_proj.weight_global_scale", "F32", (1,), "attention", scale=True),
        Spec(f"{p}.self_attn.q_proj.input_global_scale", "F32", (1,), "attention", scale=True),
        Spec(f"{p}.self_attn.k_scale", "F32", (), "attention", scale=True),
        Spec(f"{p}.self_attn.v_scale", "F32", (), "attention", scale=True),
        Spec(f"{p}.mlp.experts.0.up_proj.weight_packed", "U8", (16, 16), "routed_experts",
             packed_fp4=True),
        Spec(f"{p}.mlp.experts.0.up_proj.weight_scale", "F8_E4M3", (16, 2), "routed_experts",
             scale=True),
        # A uint8 ``.weight`` without a ``weight_scale`` sibling is not packed FP4.
        Spec(f"{p}.mlp.experts.0.down_proj.weight", "U8", (16, 16), "routed_experts"),
        Spec("lm_head.weight", "F16", (32, 32), "lm_head"),
    ]}
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "quantization_config": {
                  "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                      "num_bits": 4, "type": "float", "strategy": "tensor_group",
                      "group_size": 16}}},
                  "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"},
                  "ignore": ["lm_head"]}}
    model = write_model(tmp_path / "m", specs, config, index=False)
    report = inspect_model(ModelDir.open(model))
    flat = specs["model.safetensors"]
    assert report["tensors"]["totals"] == counts(flat)
    assert report["tensors"]["per_group"] == grouped(flat, lambda s: s.group)
    assert report["tensors"]["per_dtype"] == grouped(flat, lambda s: s.dtype)
    assert sorted(k["name"] for k in report["kv_cache_tensors"]) == [f"{p}.self_attn.k_scale",
                                                                    f"{p}.self_attn.v_scale"]
    assert report["index"]["present"] is False and report["index"]["total_size"] is None
    assert report["architectures"] == [{"path": "/", "architectures": ["Qwen3MoeForCausalLM"],
                                        "model_type": "qwen3_moe"}]
    assert report["quantization"]["config"] == {
        "path": "/quantization_config", "quant_method": "compressed-tensors", "quant_algo": None,
        "format": "nvfp4-pack-quantized",
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                    "group_size": 16},
        "group_size": 16, "kv_cache": "FP8", "ignore": ["lm_head"]}


def test_deepseek_fp8_block_config(tmp_path: Path):
    specs = {"model.safetensors": [
        Spec("model.layers.0.mlp.down_proj.weight", "F8_E4M3", (256, 128), "dense_mlp"),
        Spec("model.layers.0.mlp.down_proj.weight_scale_inv", "F32", (2, 1), "dense_mlp",
             scale=True)]}
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
              "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [128, 128]}}
    model = write_model(tmp_path / "m", specs, config, index=False)
    report = inspect_model(ModelDir.open(model))
    assert report["tensors"]["totals"] == counts(specs["model.safetensors"])
    c = report["quantization"]["config"]
    assert c["quant_method"] == "fp8" and c["kv_cache"] is None and c["group_size"] is None
    assert c["weights"] == {"type": "e4m3", "block_size": [128, 128]}
    assert report["kv_cache_tensors"] == []


def test_no_config_at_all(tmp_path: Path):
    specs = {"model.safetensors": [Spec("w", "F32", (3,), "other")]}
    model = write_model(tmp_path / "m", specs, None, index=False)
    report = inspect_model(ModelDir.open(model))
    assert report["architectures"] == [{"path": "/", "architectures": None, "model_type": None}]
    assert report["quantization"] == {"config": None, "hf_quant_config": None,
                                      "disagreements": []}
    result = invoke("inspect", str(model))
    assert result.exit_code == 0 and "quant      none declared" in result.stdout


# --- the CLI ---------------------------------------------------------------------------------

TOP_KEYS = ["report_version", "path", "hf_cache_snapshot", "architectures", "quantization",
            "tensors", "shards", "kv_cache_tensors", "index", "files"]


def test_cli_json_is_the_report_with_stable_keys(kimi: Path):
    first = invoke("inspect", str(kimi), "--json")
    second = invoke("inspect", str(kimi), "--json")
    assert first.exit_code == 0 and first.stderr == ""
    assert first.stdout == second.stdout
    data = json.loads(first.stdout)
    assert list(data) == TOP_KEYS
    assert data == json.loads(json.dumps(inspect_model(ModelDir.open(kimi))))
    assert list(data["tensors"]) == ["totals", "per_dtype", "per_group"]
    for c in [data["tensors"]["totals"], *data["tensors"]["per_dtype"].values(),
              *data["tensors"]["per_group"].values()]:
        assert list(c) == ["tensors", "params", "bytes", "scale_bytes"]
    assert list(data["tensors"]["per_group"]) == [
        "vision", "lm_head", "embeddings", "norms", "shared_experts", "routed_experts",
        "attention", "dense_mlp", "other"]
    assert list(data["quantization"]) == ["config", "hf_quant_config", "disagreements"]
    assert list(data["shards"]) == ["count", "total_file_bytes", "files"]
    assert list(data["index"]) == ["present", "total_size", "tensors", "healthy", "warnings"]


def test_cli_human_report(kimi: Path):
    result = invoke("inspect", str(kimi))
    assert result.exit_code == 0 and result.stderr == ""
    out = result.stdout.splitlines()
    n = sum(len(v) for v in kimi_specs().values())
    assert out[0] == f"model      {kimi}"
    assert any(line.startswith("arch /text_config") and "DeepseekV3ForCausalLM" in line
               for line in out)
    assert any(line.startswith("quant      config.json/quantization_config: modelopt NVFP4")
               and "kv_cache=FP8" in line for line in out)
    assert any(line.startswith("quant      hf_quant_config.json: modelopt 0.39.0 NVFP4")
               for line in out)
    assert not any(line.startswith("DISAGREE") for line in out)
    assert any(line.startswith(f"tensors    {n}  params ") for line in out)
    assert any(line.startswith("kv cache   4 (4 scales; F32), e.g. ") for line in out)
    total = json.loads((kimi / INDEX_NAME).read_text())["metadata"]["total_size"]
    assert f"index      present, {n} tensors, total_size {total}, ok" in out


def test_unindexed_shard_warning_is_reported(tmp_path: Path):
    model = write_model(tmp_path / "m", kimi_specs(), kimi_config(), hf_quant_config())
    save_file({"stray": torch.zeros(2)}, str(model / "consolidated.safetensors"))
    result = invoke("inspect", str(model), "--json")
    data = json.loads(result.stdout)
    assert data["index"]["warnings"] == [
        f"consolidated.safetensors: not referenced by {INDEX_NAME}; left as an opaque file"]
    assert data["tensors"]["totals"]["tensors"] == sum(len(v) for v in kimi_specs().values())
    assert "warning    consolidated.safetensors" in invoke("inspect", str(model)).stdout


# --- bad JSON files --------------------------------------------------------------------------

BAD_JSON = [
    ("not-utf8", b'{"model_type": "caf\xe9"}', "not valid UTF-8 at byte 19"),
    ("utf16", '{"model_type": "x"}'.encode("utf-16"), "not valid UTF-8"),
    ("invalid-json", b'{"architectures": ["X",}', "invalid JSON at line 1"),
    ("empty", b"", "invalid JSON"),
    ("duplicate-key", b'{"model_type": "a", "model_type": "b"}', "duplicate key 'model_type'"),
    ("nested-duplicate-key", b'{"text_config": {"model_type": "a", "model_type": "b"}}',
     "duplicate key 'model_type'"),
]


@pytest.mark.parametrize("filename", ["config.json", "hf_quant_config.json"])
@pytest.mark.parametrize("content, message", [pytest.param(*c[1:], id=c[0]) for c in BAD_JSON])
def test_bad_json_file(tmp_path: Path, filename: str, content: bytes, message: str):
    specs = {"model.safetensors": [Spec("w", "F32", (3,), "other")]}
    model = write_model(tmp_path / "m", specs, {"model_type": "x"}, index=False)
    (model / filename).write_bytes(content)
    md = ModelDir.open(model)  # JSON files are read lazily
    with pytest.raises(ModelDirError) as info:
        inspect_model(md)
    assert info.value.where == str(model / filename)
    assert message in info.value.message
    for args in (["inspect", str(model)], ["inspect", str(model), "--json"]):
        result = invoke(*args)
        assert result.exit_code == 2 and result.exc_info[0] is SystemExit
        if "--json" in args:    # the error as JSON on stdout too
            assert json.loads(result.stdout)["error"]["where"] == str(model / filename)
        else:
            assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("modelpatch: error: ")
        assert str(model / filename) in lines[0] and message in lines[0]
        assert "Traceback" not in result.output


@pytest.mark.parametrize("hf", [
    {"producer": "modelopt", "quantization": {"quant_algo": "NVFP4"}},
    {"quantization": "NVFP4"},
    {"producer": None, "quantization": None},
])  # a non-object hf_quant_config.json is an error: tests/model/test_reader_configs.py
def test_oddly_shaped_hf_quant_config_does_not_crash(tmp_path: Path, hf):
    specs = {"model.safetensors": [Spec("w", "F32", (3,), "other")]}
    model = write_model(tmp_path / "m", specs, kimi_config(), hf_quant=hf, index=False)
    result = invoke("inspect", str(model), "--json")
    assert result.exit_code == 0, result.output


def test_oddly_shaped_config_groups_do_not_crash(tmp_path: Path):
    config = kimi_config()
    config["quantization_config"]["config_groups"] = [{"weights": {}}]
    specs = {"model.safetensors": [Spec("w", "F32", (3,), "other")]}
    model = write_model(tmp_path / "m", specs, config, index=False)
    result = invoke("inspect", str(model), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["quantization"]["config"]["weights"] == {}


def test_unhashable_ignore_entries_do_not_crash(tmp_path: Path):
    config = kimi_config()
    config["quantization_config"]["ignore"] = [["lm_head"]]
    specs = {"model.safetensors": [Spec("w", "F32", (3,), "other")]}
    model = write_model(tmp_path / "m", specs, config, hf_quant_config(), index=False)
    q = inspect_model(ModelDir.open(model))["quantization"]
    assert any(d.startswith("ignore lists differ") for d in q["disagreements"])
    assert invoke("inspect", str(model)).exit_code == 0


# --- headers only: no torch, no tensor data --------------------------------------------------

MEASURE = r"""
import json, sys
from patcher.cli import main
# What ``inspect`` imports lazily, imported up front so that the read() count below is the
# model directory's files and nothing else.
import patcher.model.inspect_model, patcher.model.model_dir, patcher.cli.render
import concurrent.futures.thread

def io():
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f.read().splitlines())}

before, codes = io(), []
for extra in (["--json"], []):
    try:
        main(["inspect", sys.argv[1], *extra], prog_name="modelpatch")
    except SystemExit as exc:
        codes.append(exc.code)
after = io()
result = {"codes": codes, "rchar": after["rchar"] - before["rchar"],
          "heavy": sorted(m for m in ("torch", "numpy", "safetensors") if m in sys.modules)}
sys.stderr.write("MEASURE " + json.dumps(result) + "\n")
"""


def resident_bytes(path: Path, start: int) -> int:
    """Bytes of ``path`` from ``start`` on that sit in the page cache (mmap + mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size, page = path.stat().st_size, mmap.PAGESIZE
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(addr, size)
    flags = bytes(vec)[start // page:]
    return (len(flags) - flags.count(0)) * page  # only bit 0 (resident) is defined


GIB = 1 << 30


def test_inspect_reads_no_tensor_data_and_imports_no_torch(tmp_path: Path):
    """Two sparse 4 GiB shards (valid headers, holes for data): inspect reads only headers."""
    model = tmp_path / "big"
    model.mkdir()
    weight_map, total = {}, 0
    for s in range(2):
        shard = f"model-0000{s + 1}-of-00002.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for e in range(4):  # four 1 GiB expert weights per shard
            name = f"model.layers.{s}.mlp.experts.{e}.down_proj.weight"
            header[name] = {"dtype": "BF16", "shape": [32768, 16384],
                            "data_offsets": [offset, offset + GIB]}
            offset += GIB
            weight_map[name] = shard
        body = json.dumps(header).encode()
        body += b" " * (-len(body) % 8)
        path = model / shard
        with open(path, "wb") as f:
            f.write(len(body).to_bytes(8, "little") + body)
            f.truncate(8 + len(body) + offset)  # sparse: no data blocks allocated
        total += offset
    (model / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total},
                                                "weight_map": weight_map}))
    (model / "config.json").write_text(json.dumps(kimi_config()))
    assert total == 8 * GIB

    for shard in set(weight_map.values()):  # start with nothing of the data cached
        fd = os.open(model / shard, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", MEASURE, str(model)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MODELPATCH_DEBUG": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    measure = json.loads(proc.stderr.split("MEASURE ", 1)[1])
    assert measure["codes"] == [0, 0], proc.stderr[-3000:]
    report = json.JSONDecoder().raw_decode(proc.stdout)[0]
    assert report["tensors"]["totals"]["bytes"] == 8 * GIB
    assert report["index"]["total_size"] == 8 * GIB

    # No torch (nor numpy, nor the safetensors library) is imported, at any point.
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "patcher.cli" in imported  # the importtime output was really parsed
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy", "safetensors")}
    assert measure["heavy"] == []
    # Two inspect runs over 8 GiB of tensor data: read() moved a few KiB of headers and JSON,
    # plus the module files Python reads at start-up (about 280 KiB for both runs) ...
    assert measure["rchar"] < 512 << 10, measure
    # ... and nothing touched the data through mmap either: reading a hole through mmap or
    # read() puts its pages in the page cache; only readahead past a header may be there.
    for shard in set(weight_map.values()):
        data_offset = 8 + read_header(model / shard).header_len
        assert resident_bytes(model / shard, data_offset) < 8 << 20, shard
