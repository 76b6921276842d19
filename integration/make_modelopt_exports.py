"""Make tiny real NVIDIA ModelOpt exports, for tests/fixtures/modelopt/.

Each export is made by ModelOpt's own code, on the CPU: a tiny transformers model with random
weights, ``modelopt.torch.quantization.quantize`` with one of ModelOpt's preset configs
(calibrated on a few random token batches), then ``modelopt.torch.export.export_hf_checkpoint``
with ``dtype=torch.bfloat16`` (a string ``torch_dtype`` in the config crashes the export without
it). The result is what ModelOpt ships in ``nvidia/*`` checkpoints: tensor names, dtypes and
shapes, config.json ``quantization_config`` and hf_quant_config.json.

Exports (name: model, weights preset + KV-cache preset):

    llama-fp8              LlamaForCausalLM, FP8_DEFAULT_CFG + FP8_KV_CFG
    llama-nvfp4            LlamaForCausalLM, NVFP4_DEFAULT_CFG + FP8_KV_CFG
    llama-nvfp4-affine-kv  LlamaForCausalLM, NVFP4_DEFAULT_CFG + FP8_AFFINE_KV_CFG
    deepseek-v3-nvfp4      DeepseekV3ForCausalLM (MLA, MoE), NVFP4_DEFAULT_CFG + FP8_KV_CFG

Run it in a venv that has nvidia-modelopt (see requirements-modelopt.txt next to this script):

    python integration/make_modelopt_exports.py tests/fixtures/modelopt

The tests read the committed exports; they never need ModelOpt installed.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

import torch

SEED = 1234


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def _deepseek_v3():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
        v_head_dim=16, vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False)
    return DeepseekV3ForCausalLM(config)


EXPORTS = {
    "llama-fp8": (_llama, "FP8_DEFAULT_CFG", "FP8_KV_CFG"),
    "llama-nvfp4": (_llama, "NVFP4_DEFAULT_CFG", "FP8_KV_CFG"),
    "llama-nvfp4-affine-kv": (_llama, "NVFP4_DEFAULT_CFG", "FP8_AFFINE_KV_CFG"),
    "deepseek-v3-nvfp4": (_deepseek_v3, "NVFP4_DEFAULT_CFG", "FP8_KV_CFG"),
}


def make_export(name: str, out: Path) -> None:
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    build, weights_cfg, kv_cfg = EXPORTS[name]
    torch.manual_seed(SEED)
    model = build().to(torch.bfloat16).eval()
    model.config.architectures = [type(model).__name__]   # as from_pretrained would have it
    config = copy.deepcopy(getattr(mtq, weights_cfg))
    config["quant_cfg"] = list(config["quant_cfg"]) + list(getattr(mtq, kv_cfg)["quant_cfg"])
    batches = torch.randint(0, model.config.vocab_size, (4, 2, 16),
                            generator=torch.Generator().manual_seed(SEED))

    def calibrate(m):
        with torch.no_grad():
            for ids in batches:
                m(ids)

    mtq.quantize(model, config, forward_loop=calibrate)
    if out.exists():
        shutil.rmtree(out)
    export_hf_checkpoint(model, dtype=torch.bfloat16, export_dir=out)
    _describe(out)


def _describe(out: Path) -> None:
    from safetensors import safe_open

    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out.name}: {size} bytes")
    for shard in sorted(out.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for key in sorted(f.keys()):
                if ".layers.0." in key or ".layers.1.mlp.experts.0." in key:
                    s = f.get_slice(key)
                    print(f"  {key} {s.get_dtype()} {s.get_shape()}")
    hf_quant = out / "hf_quant_config.json"
    if hf_quant.exists():
        print("  hf_quant_config.json:", json.dumps(json.loads(hf_quant.read_text())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to write one folder per export into")
    parser.add_argument("--only", nargs="*", choices=sorted(EXPORTS), help="exports to make")
    args = parser.parse_args(argv)
    for name in args.only or EXPORTS:
        make_export(name, args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
