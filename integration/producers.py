"""Producers of the consumer matrix's rows (integration/builtin_rows.py): each model as its real
producer writes it (transformers ``save_pretrained`` of tiny random models, a tokenizer saved by
transformers, the ModelOpt exports of tests/fixtures/modelopt, compressed-tensors' own
compressor and ModelOpt converter), or as the recipe chain a user would run makes it."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELOPT = REPO / "tests" / "fixtures" / "modelopt"
TRANSFORMERS_FP8 = REPO / "tests" / "fixtures" / "transformers_fp8_moe"
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


# -- producers -------------------------------------------------------------------------------

def _tokenizer(out: Path) -> None:
    """A word-level tokenizer saved by transformers (tokenizer.json, tokenizer_config.json,
    chat_template.jinja), the files a chat model's repository carries."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|eot|>": 3}
    vocab.update({f"t{i}": i for i in range(4, SMALL["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>", chat_template="{{ messages }}"
                            ).save_pretrained(out)


def llama(out: Path, *, tie: bool = False, tokenizer: bool = False,
          head_is_embeddings: bool = False) -> Path:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=tie, bos_token_id=1,
                                         eos_token_id=2, **SMALL))
    if head_is_embeddings:
        with torch.no_grad():
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2)
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="100KB" if tokenizer else "50GB")
    if tokenizer:
        _tokenizer(out)
    return out


def _edit_config(model: Path, **changes) -> None:
    path = model / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.chmod(0o644)
    path.write_text(json.dumps(config, indent=2))


def copy(source: Path, out: Path) -> Path:
    shutil.copytree(source, out)
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out


def remote_code(out: Path) -> Path:
    """save_pretrained's Llama as a custom-code repository declares itself (the code files
    themselves are not needed once the recipe has run)."""
    llama(out, tokenizer=True)
    _edit_config(out, auto_map={"AutoConfig": "configuration_tiny.TinyConfig",
                                "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"},
                 architectures=["TinyForCausalLM"])
    return out


def with_consolidated(out: Path) -> Path:
    """save_pretrained's sharded Llama (index) plus a consolidated.safetensors holding the
    same weights, as Mistral's repositories ship both."""
    from safetensors.torch import load_file, save_file

    llama(out, tokenizer=True)
    tensors = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        tensors.update(load_file(shard))
    save_file(tensors, out / "consolidated.safetensors")
    return out


def tied_with_head(out: Path) -> Path:
    """An untied save_pretrained Llama whose lm_head equals the embeddings, declared tied:
    what exporters that write every tensor leave behind."""
    llama(out, head_is_embeddings=True)
    _edit_config(out, tie_word_embeddings=True)
    return out


def deepseek_mtp(out: Path) -> Path:
    """save_pretrained's DeepSeek-V3 plus one MTP block stored as layer num_hidden_layers
    (DeepSeek's release layout: enorm, hnorm, eh_proj, shared_head, a decoder layer)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                              moe_intermediate_size=32, num_hidden_layers=2,
                              first_k_dense_replace=1, num_attention_heads=4,
                              num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                              qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                              n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                              n_group=1, topk_group=1, max_position_embeddings=64,
                              tie_word_embeddings=False)
    DeepseekV3ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tensors = load_file(out / "model.safetensors")
    mtp = {n.replace("model.layers.1.", "model.layers.2."): t.clone()
           for n, t in tensors.items() if n.startswith("model.layers.1.")}
    h, v = 64, 128
    mtp.update({"model.layers.2.embed_tokens.weight": torch.randn(v, h).bfloat16(),
                "model.layers.2.enorm.weight": torch.ones(h).bfloat16(),
                "model.layers.2.hnorm.weight": torch.ones(h).bfloat16(),
                "model.layers.2.eh_proj.weight": torch.randn(h, 2 * h).bfloat16(),
                "model.layers.2.shared_head.norm.weight": torch.ones(h).bfloat16(),
                "model.layers.2.shared_head.head.weight": torch.randn(v, h).bfloat16()})
    save_file({**tensors, **mtp}, out / "model.safetensors", metadata={"format": "pt"})
    _edit_config(out, num_nextn_predict_layers=1)
    return out


def llava(out: Path) -> Path:
    """save_pretrained's Llava: a CLIP vision tower, a projector, a Llama language model."""
    import torch
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, image_size=28, patch_size=14)
    text = LlamaConfig(tie_word_embeddings=False, **SMALL)
    model = LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text,
                                                      image_token_index=127))
    model.to(torch.bfloat16).save_pretrained(out)
    return out


def modelopt_to_ct(out: Path) -> Path:
    """The compressed-tensors NVFP4 checkpoint modelopt-to-compressed-tensors makes of the
    ModelOpt Llama NVFP4 export."""
    from patcher import api

    base = copy(MODELOPT / "llama-nvfp4", out.parent / "modelopt")
    return api.apply("modelopt-to-compressed-tensors", base, out=out).output


def sm120(out: Path) -> Path:
    """The ModelOpt Llama FP8 export with its KV cache declared unquantized by sm120-fp16-kv."""
    from patcher import api

    base = copy(MODELOPT / "llama-fp8", out.parent / "modelopt")
    return api.apply("sm120-fp16-kv", base, out=out).output


def ct_sm120(out: Path) -> Path:
    """The compressed-tensors checkpoint of ``modelopt_to_ct`` after sm120-fp16-kv."""
    from patcher import api

    base = modelopt_to_ct(out.parent / "ct")
    return api.apply("sm120-fp16-kv", base, out=out).output


def modelopt(name: str):
    """A copy of the ModelOpt export ``name`` of tests/fixtures/modelopt."""
    return lambda d: copy(MODELOPT / name, d)


def to_compressed_tensors(model: Path, out: Path) -> Path:
    """compressed-tensors' own ModelOpt NVFP4 converter (``convert_checkpoint`` with
    ``ModelOptNvfp4Converter``) on ``model``'s files as a hub download holds them: it walks the
    directory recursively and refuses a .safetensors file the index does not name, such as a
    variant's revert data under .modelpatch/."""
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter,
    )
    from compressed_tensors.quantization import QuantizationArgs

    download = out.parent / f"{out.name}-download"
    download.mkdir(parents=True)
    for path in model.iterdir():
        if path.is_file():
            shutil.copyfile(path, download / path.name)
    kv = QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False)
    converter = ModelOptNvfp4Converter(ignore=["lm_head"], targets=["Linear"], kv_cache_scheme=kv)
    # compressed-tensors 0.20 takes the device; 0.17 (vLLM 0.33's pin) has no such argument
    takes_device = "device" in inspect.signature(convert_checkpoint).parameters
    given = {"device": "cpu"} if takes_device else {}
    convert_checkpoint(download, out, converter, max_workers=1, **given)
    return out


def ct_converted(out: Path) -> Path:
    """The ModelOpt Llama NVFP4 export through compressed-tensors' own ModelOpt converter."""
    return to_compressed_tensors(MODELOPT / "llama-nvfp4", out)


def ct_fp8(out: Path) -> Path:
    """save_pretrained's Llama quantized by compressed-tensors' own compressor (FP8_DYNAMIC:
    FP8 weights with per-channel scales, format float-quantized), as llm-compressor drives it,
    the scales set to each channel's absolute maximum over 448 as its min-max observer would."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **SMALL)).to(torch.bfloat16)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])},
        ignore=["lm_head"]))
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            amax = module.weight.detach().float().abs().amax(dim=1, keepdim=True)
            module.weight_scale.data = (amax / 448).to(module.weight_scale.dtype)
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    return out
