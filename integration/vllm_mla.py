"""MLA as vLLM decides it against ``patcher.model.mla.uses_mla``, on configs written by
transformers' own config classes (``save_pretrained``), some with ``kv_lora_rank`` left out.

    integration/.venv-vllm/bin/python integration/vllm_mla.py WORK_DIR

vLLM's decision: ``get_config`` (its config registry, kimi_k2 read as DeepseekV3Config), the
text config, ``ModelArchConfigConvertorBase.is_deepseek_mla``. Exit status 1 on a disagreement.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
             n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1)


def cases():
    import transformers as t

    yield "deepseek_v3, kv_lora_rank 32", t.DeepseekV3Config(kv_lora_rank=32, **SMALL), None
    yield "deepseek_v3, kv_lora_rank left out", t.DeepseekV3Config(**SMALL), "kv_lora_rank"
    yield "deepseek_v2, kv_lora_rank left out", t.DeepseekV2Config(**SMALL), "kv_lora_rank"
    yield "kimi_k2 (deepseek_v3 layout), kv_lora_rank left out", t.DeepseekV3Config(
        **SMALL), ("kv_lora_rank", "kimi_k2")
    yield "llama", t.LlamaConfig(hidden_size=32, num_attention_heads=4), None
    yield "qwen3", t.Qwen3Config(hidden_size=32, num_attention_heads=4), None


def main() -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm.config  # noqa: F401  (first: the convertor module imports it back)
    from vllm.transformers_utils.config import get_config, get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )

    from patcher.model.mla import uses_mla

    work = Path(sys.argv[1])
    bad = 0
    for index, (label, config, edit) in enumerate(cases()):
        root = work / str(index)
        config.save_pretrained(root)
        doc = json.loads((root / "config.json").read_text())
        edits = (edit,) if isinstance(edit, str) else edit or ()
        if "kv_lora_rank" in edits:
            doc.pop("kv_lora_rank")
        if "kimi_k2" in edits:
            doc["model_type"] = "kimi_k2"
        (root / "config.json").write_text(json.dumps(doc))
        hf = get_config(str(root), trust_remote_code=False)
        vllm = ModelArchConfigConvertorBase(hf, get_hf_text_config(hf)).is_deepseek_mla()
        ours = uses_mla(doc)
        bad += vllm != ours
        print(f"{label:55} vLLM {vllm!s:5} @model /mla {ours!s:5} "
              f"{'ok' if vllm == ours else 'DIFFERS'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
