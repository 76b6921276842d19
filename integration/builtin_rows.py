"""The rows of integration/consumer_matrix.py for the built-ins that change configs, tokenizer
files or BF16 weights: each applied to a model its real producer writes (transformers
``save_pretrained`` of a tiny random model, with a tokenizer where the recipe needs one; the
ModelOpt exports of tests/fixtures/modelopt; transformers' own FP8 checkpoint of
tests/fixtures/transformers_fp8_moe), then loaded by transformers.

The ``transformers`` cell is consumer_matrix's (missing / unexpected keys, finite logits) plus,
where the recipe must not change what the model computes, ``same``: the output's logits of one
prompt against the reference's (the base, or for a base transformers cannot load as is, the
model it stands for), as the largest absolute difference and whether the argmax agrees.
``check`` is a recipe's own consumer-side check (the tokenizer's chat template, the
generation config as transformers reads it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELOPT = REPO / "tests" / "fixtures" / "modelopt"
TRANSFORMERS_FP8 = REPO / "tests" / "fixtures" / "transformers_fp8_moe"
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
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


def _copy(source: Path, out: Path) -> Path:
    shutil.copytree(source, out)
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out


def _remote_code(out: Path) -> Path:
    """save_pretrained's Llama as a custom-code repository declares itself (the code files
    themselves are not needed once the recipe has run)."""
    llama(out, tokenizer=True)
    _edit_config(out, auto_map={"AutoConfig": "configuration_tiny.TinyConfig",
                                "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"},
                 architectures=["TinyForCausalLM"])
    return out


def _with_consolidated(out: Path) -> Path:
    """save_pretrained's sharded Llama (index) plus a consolidated.safetensors holding the
    same weights, as Mistral's repositories ship both."""
    from safetensors.torch import load_file, save_file

    llama(out, tokenizer=True)
    tensors = {}
    for shard in sorted(out.glob("model-*.safetensors")):
        tensors.update(load_file(shard))
    save_file(tensors, out / "consolidated.safetensors")
    return out


def _tied_with_head(out: Path) -> Path:
    """An untied save_pretrained Llama whose lm_head equals the embeddings, declared tied:
    what exporters that write every tensor leave behind."""
    llama(out, head_is_embeddings=True)
    _edit_config(out, tie_word_embeddings=True)
    return out


def _deepseek_mtp(out: Path) -> Path:
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


def _llava(out: Path) -> Path:
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


def _modelopt_to_ct(out: Path) -> Path:
    """The compressed-tensors NVFP4 checkpoint modelopt-to-compressed-tensors makes of the
    ModelOpt Llama NVFP4 export."""
    from patcher import api

    base = _copy(MODELOPT / "llama-nvfp4", out.parent / "modelopt")
    return api.apply("modelopt-to-compressed-tensors", base, out=out).output


def _sm120(out: Path) -> Path:
    """The ModelOpt Llama FP8 export with its KV cache declared unquantized by sm120-fp16-kv."""
    from patcher import api

    base = _copy(MODELOPT / "llama-fp8", out.parent / "modelopt")
    return api.apply("sm120-fp16-kv", base, out=out).output


def _ct_sm120(out: Path) -> Path:
    """The compressed-tensors checkpoint of ``_modelopt_to_ct`` after sm120-fp16-kv."""
    from patcher import api

    base = _modelopt_to_ct(out.parent / "ct")
    return api.apply("sm120-fp16-kv", base, out=out).output


def _template_params(work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    (work / "new.jinja").write_text(TEMPLATE)
    return {"template": f"file:{work / 'new.jinja'}"}


# -- consumer-side checks --------------------------------------------------------------------

def _check_template(out: Path, base: Path, work: Path) -> str:
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(out).apply_chat_template(
        [{"role": "user", "content": "t5"}], tokenize=False)
    return "ok: tokenizer renders the new template" if text == "<|im_start|>t5<|im_end|>" \
        else f"FAIL: tokenizer renders {text[:40]!r}"


def _check_eos(out: Path, base: Path, work: Path) -> str:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    got = (AutoConfig.from_pretrained(out).eos_token_id,
           GenerationConfig.from_pretrained(out).eos_token_id,
           AutoTokenizer.from_pretrained(out).eos_token)
    return "ok: eos [2, 3] / [2, 3] / '</s>'" if got == ([2, 3], [2, 3], "</s>") \
        else f"FAIL: {got}"


def _check_sampling(out: Path, base: Path, work: Path) -> str:
    from transformers import GenerationConfig

    g = GenerationConfig.from_pretrained(out)     # validates the values it reads
    got = (g.temperature, g.top_p, g.top_k, g.min_p, g.repetition_penalty)
    return "ok: generation config reads back" if got == (0.7, 0.9, 20, 0.0, 1.0) \
        else f"FAIL: {got}"


def _check_yarn(out: Path, base: Path, work: Path) -> str:
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(out)
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    ok = rope.get("rope_type") == "yarn" and c.max_position_embeddings == 256
    return f"{'ok' if ok else 'FAIL'}: rope_type {rope.get('rope_type')}, " \
           f"max_position_embeddings {c.max_position_embeddings}"


def _check_ct_converter(out: Path, base: Path, work: Path) -> dict:
    """compressed-tensors' own ModelOpt NVFP4 converter (``convert_checkpoint`` with
    ``ModelOptNvfp4Converter``) on the output, its checkpoint decompressed by transformers:
    the compressed-tensors cell, with the logits against the base's (the compressed-tensors
    checkpoint the recipe started from). The converter is given the variant's files as a hub
    download holds them: it walks the directory recursively and refuses a .safetensors file
    the index does not name, such as the revert data under .modelpatch/."""
    import transformers
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter,
    )
    from compressed_tensors.quantization import QuantizationArgs

    download = work / "download"
    download.mkdir()
    for path in out.iterdir():
        if path.is_file():
            shutil.copyfile(path, download / path.name)
    kv = QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False)
    convert_checkpoint(download, work / "converted",
                       ModelOptNvfp4Converter(ignore=["lm_head"], targets=["Linear"],
                                              kv_cache_scheme=kv),
                       max_workers=1, device="cpu")
    dequantize = transformers.CompressedTensorsConfig(dequantize=True)
    cell = _LOAD["compressed-tensors"](work / "converted")
    a, b = logits(work / "converted", quantization_config=dequantize), \
        logits(base, quantization_config=dequantize)
    if "error" not in cell:     # its scalar global scales ([], ModelOpt's shape) decompress
        cell["compared"] = _compare(a, b, ARGMAX)   # a hair off the same values shaped [1]
    return cell


def _modelopt(name: str):
    return lambda d: _copy(MODELOPT / name, d)


def _none(work: Path) -> dict:
    return {}


def _the_base(base: Path, work: Path):
    return logits(base)


def _made_by(producer):
    return lambda base, work: logits(producer(work / "reference"))


def _dequantized_by(config: str):
    """The base as transformers itself dequantizes it (``config``: its quantization config
    class, with dequantize=True)."""
    def reference(base: Path, work: Path):
        import transformers

        return logits(base, quantization_config=getattr(transformers, config)(dequantize=True))
    return reference


def _ct_decompressed(base: Path, work: Path):
    """The ModelOpt NVFP4 base as compressed-tensors decompresses it, once
    modelopt-to-compressed-tensors has given it compressed-tensors' names."""
    import transformers

    config = transformers.CompressedTensorsConfig(dequantize=True)
    return logits(_modelopt_to_ct(work / "reference"), quantization_config=config)


EQUAL, ARGMAX = "equal", "argmax"

#: (row name, recipe, producer, params (given a work directory), what the output's logits
#: must keep of the reference's (EQUAL, ARGMAX or None: not compared), the reference (given
#: the base and a work directory), a consumer-side check or None)
BUILTIN_ROWS = [
    ("chat-template / transformers Llama + tokenizer", "chat-template",
     lambda d: llama(d, tokenizer=True), _template_params, EQUAL, _the_base, _check_template),
    ("compressed-tensors-to-modelopt / modelopt-to-ct of ModelOpt Llama NVFP4",
     "compressed-tensors-to-modelopt", _modelopt_to_ct, _none, EQUAL,
     _made_by(_modelopt("llama-nvfp4")), _check_ct_converter),
    ("drop-consolidated / transformers Llama, sharded, + consolidated.safetensors",
     "drop-consolidated", _with_consolidated, _none, EQUAL, _the_base, None),
    ("drop-kv-scales / ModelOpt Llama FP8 after sm120-fp16-kv", "drop-kv-scales", _sm120, _none,
     EQUAL, _the_base, None),
    ("drop-kv-scales / modelopt-to-ct of ModelOpt Llama NVFP4 after sm120-fp16-kv",
     "drop-kv-scales", _ct_sm120, _none, EQUAL, _the_base, None),
    ("fix-eos / transformers Llama + tokenizer", "fix-eos", lambda d: llama(d, tokenizer=True),
     lambda w: {"eos_token_id": "2,3", "eos_token": "</s>"}, EQUAL, _the_base, _check_eos),
    ("fp8-block-to-bf16 / transformers FP8 Qwen3-MoE", "fp8-block-to-bf16",
     lambda d: _copy(TRANSFORMERS_FP8, d), _none, None, None, None),
    ("no-remote-code / transformers Llama + auto_map", "no-remote-code", _remote_code,
     lambda w: {"model_type": "llama", "architectures": "LlamaForCausalLM"}, EQUAL,
     _made_by(lambda d: llama(d, tokenizer=True)), None),
    ("nvfp4-to-bf16 / ModelOpt Llama NVFP4", "nvfp4-to-bf16", _modelopt("llama-nvfp4"), _none,
     EQUAL, _ct_decompressed, None),
    ("sampling-defaults / transformers Llama", "sampling-defaults", llama,
     lambda w: {"temperature": "0.7", "top_p": "0.9", "top_k": "20"}, EQUAL, _the_base,
     _check_sampling),
    ("sm120-fp16-kv / ModelOpt Llama FP8", "sm120-fp16-kv", _modelopt("llama-fp8"), _none,
     EQUAL, _the_base, None),
    ("sm120-fp16-kv / modelopt-to-ct of ModelOpt Llama NVFP4 (compressed-tensors)",
     "sm120-fp16-kv", _modelopt_to_ct, _none, EQUAL, _the_base, None),
    ("strip-mtp / transformers DeepSeek-V3 + 1 MTP block", "strip-mtp", _deepseek_mtp, _none,
     EQUAL, _the_base, None),
    ("text-only / transformers Llava (Llama text)", "text-only", _llava,
     lambda w: {"architectures": "LlamaForCausalLM"}, EQUAL, _the_base, None),
    ("tie-embeddings / transformers Llama, lm_head == embeddings, declared tied",
     "tie-embeddings", _tied_with_head, _none, EQUAL, _the_base, None),
    ("to-bf16 / ModelOpt Llama FP8", "to-bf16", _modelopt("llama-fp8"), _none, None, None, None),
    ("to-bf16 / ModelOpt Llama NVFP4", "to-bf16", _modelopt("llama-nvfp4"), _none, EQUAL,
     _ct_decompressed, None),
    ("to-bf16 / transformers FP8 Qwen3-MoE", "to-bf16", lambda d: _copy(TRANSFORMERS_FP8, d),
     _none, None, None, None),
    ("to-bf16 / modelopt-to-ct of ModelOpt Llama NVFP4 (compressed-tensors)", "to-bf16",
     _modelopt_to_ct, _none, EQUAL, _dequantized_by("CompressedTensorsConfig"), None),
    ("untie-embeddings / transformers Llama, tied", "untie-embeddings",
     lambda d: llama(d, tie=True), _none, EQUAL, _the_base, None),
    ("yarn / transformers Llama (logits within the original context)", "yarn", llama,
     lambda w: {"factor": "4"}, ARGMAX, _the_base, _check_yarn),
]

# -- the cells -------------------------------------------------------------------------------

def logits(model: Path, **kwargs):
    """One prompt's logits (float32), or the consumer's error as a string."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = json.loads((model / "config.json").read_text())
    cls = AutoModelForImageTextToText if "text_config" in config else AutoModelForCausalLM
    try:
        loaded = cls.from_pretrained(model, dtype=torch.bfloat16, **kwargs)
    except Exception as exc:        # a consumer refusing the model is a result
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    ids = torch.randint(4, 127, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return loaded.eval()(input_ids=ids).logits.float()


#: consumer_matrix's cells (transformers, compressed-tensors), set by ``builtin_row``
_LOAD: dict = {}


def _compare(a, b, keep: str) -> str:
    if isinstance(a, str) or isinstance(b, str):
        return f"FAIL: does not load ({(a if isinstance(a, str) else b)[:60]})"
    diff = float((a - b).abs().max())
    argmax = bool((a.argmax(-1) == b.argmax(-1)).all())
    ok = diff == 0 if keep == EQUAL else argmax
    return (f"{'ok' if ok else 'FAIL'}: logits max diff {diff:.3g}, "
            f"argmax {'same' if argmax else 'differs'}")


def builtin_row(row: tuple, work: Path, load, load_ct) -> dict:
    """One row: applied, loaded (``load``, ``load_ct``: consumer_matrix's transformers and
    compressed-tensors cells), compared."""
    from patcher import api

    _LOAD.update({"transformers": load, "compressed-tensors": load_ct})
    label, recipe, producer, params, keep, reference, check = row
    base = producer(work / "base")
    out = api.apply(recipe, base, out=work / "out", params=params(work / "params")).output
    cell, ct = load(out), load_ct(out)
    if keep is not None:
        a, b = logits(out), reference(base, work)
        if isinstance(a, str) and isinstance(b, str):
            cell = {"base_error": b}        # the reference does not load either
        else:
            cell["compared"] = _compare(a, b, keep)
    found = check(out, base, work) if check is not None else None
    if isinstance(found, dict):
        ct = found
    elif found is not None:
        cell["check"] = found
    return {"row": label, "recipe": "applied", "transformers": cell, "compressed_tensors": ct,
            "output": str(out)}


def show(cell: dict) -> str:
    """What these rows add to consumer_matrix's transformers cell."""
    return "".join(f"; {cell[key]}" for key in ("compared", "check") if cell.get(key))
