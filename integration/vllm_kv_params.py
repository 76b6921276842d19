"""Which KV-scale spellings vLLM loads into a model, from the model class vLLM itself builds.

    integration/.venv-vllm/bin/python integration/vllm_kv_params.py MODEL_DIR

vLLM resolves MODEL_DIR's engine configuration (``EngineArgs(...).create_engine_config()``),
then builds the model class it resolves on the ``meta`` device (no weights, no kernels run) and
lists its attention layers: the modules holding ``_k_scale``, where the KV-cache method puts
the ``k_scale``/``v_scale`` parameters a checkpoint's scales load into. On a CPU the KV-cache
method is not attached (an FP8 KV cache on MLA is refused there), so those two parameter names
are added beside each such module, as the method would. Every spelling a checkpoint may carry
then goes through vLLM's own ``maybe_remap_kv_scale_name`` against those parameters.

A config.json whose ``quantization_config`` this CPU cannot build kernels for (ModelOpt NVFP4)
needs a copy with a compressed-tensors KV-only config: ``--kv-only`` writes one next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

SPELLINGS = ("self_attn.k_scale", "self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale",
             "self_attn.attn.k_scale", "self_attn.kv_scale",
             "self_attn.mla_attn.mla_attn.k_scale")
KV_ONLY = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {},
           "ignore": [], "quantization_status": "compressed",
           "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor",
                               "dynamic": False, "symmetric": True}}


def kv_only_copy(model: Path) -> Path:
    """config.json alone, its quantization_config replaced by an FP8 KV cache only."""
    out = model.with_name(model.name + "-kv-only")
    out.mkdir(exist_ok=True)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = KV_ONLY
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("generation_config.json",):
        if (model / name).exists():
            shutil.copy(model / name, out / name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--kv-only", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name

    model_dir = kv_only_copy(args.model) if args.kv_only else args.model
    engine = EngineArgs(model=str(model_dir), skip_tokenizer_init=True,
                        enforce_eager=True).create_engine_config()
    with set_current_vllm_config(engine):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="tcp://127.0.0.1:29533")
        initialize_model_parallel(1, 1)
        with torch.device("meta"):
            model = initialize_model(vllm_config=engine)
    params = dict.fromkeys(n for n, _ in model.named_parameters())
    layers = [n for n, m in model.named_modules() if hasattr(m, "_k_scale")]
    for layer in layers:
        params.update(dict.fromkeys((f"{layer}.k_scale", f"{layer}.v_scale")))
    report = {"class": type(model).__name__, "use_mla": engine.model_config.use_mla,
              "attention_layers": layers,
              "remap": {s: maybe_remap_kv_scale_name(f"model.layers.0.{s}", params)
                        for s in SPELLINGS}}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
