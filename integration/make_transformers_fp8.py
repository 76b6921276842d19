"""Make a tiny FP8 block checkpoint the way transformers 5.x writes one (needs CUDA).

transformers' ``FineGrainedFP8Config(weight_block_size=[128, 128])`` quantizes a model on load
(its quantizer refuses to quantize without a GPU), and ``save_pretrained`` then writes
``weight`` F8_E4M3 with ``weight_scale_inv`` F32, MoE experts split back into one tensor per
expert. The result is committed as tests/fixtures/transformers_fp8_moe/ so the test suite checks
``fp8-block-to-bf16`` on a layout transformers itself wrote, without a GPU.

Usage (on a CUDA machine with torch, transformers 5.x and accelerate)::

    python3 integration/make_transformers_fp8.py --out tests/fixtures/transformers_fp8_moe

The model is a one-layer Qwen3-MoE with random weights: hidden 128, expert intermediate 256,
so expert ``gate_proj``/``up_proj`` are [256, 128] (block scale grid 2 x 1) and ``down_proj``
is [128, 256] (grid 1 x 2). ``versions.json`` records what made it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, Qwen3MoeConfig


def tiny_config() -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, moe_intermediate_size=256,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        tie_word_embeddings=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("transformers' FP8 quantize-on-load needs a CUDA GPU")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        AutoModelForCausalLM.from_config(tiny_config(), dtype=torch.bfloat16).save_pretrained(tmp)
        model = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch.bfloat16, device_map="cuda",
            quantization_config=FineGrainedFP8Config(weight_block_size=[128, 128]))
        model.save_pretrained(args.out)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(0)}
    (args.out / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    for shard in sorted(args.out.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for name in sorted(f.keys()):
                t = f.get_slice(name)
                print(f"{shard.name} {name} {t.get_dtype()} {t.get_shape()}")
    print(json.dumps(versions))


if __name__ == "__main__":
    main()
