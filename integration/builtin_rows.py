"""The rows of integration/consumer_matrix.py for every built-in not in its ``ROWS`` or
``GGUF_ROWS``: each applied to a model its real producer writes (``producers.py``), then loaded
by transformers (and compressed-tensors, for a compressed-tensors output).

The ``transformers`` cell is consumer_matrix's (missing / unexpected keys, finite logits) plus
``compared``: one prompt's logits against the reference's (the base; for a base transformers
cannot load as is, the model it stands for or its decompression by compressed-tensors), as the
largest absolute difference and whether the argmax agrees; and ``check``, the recipe's own
reader-side check (the tokenizer's chat template, the generation config as transformers reads
it).
"""

from __future__ import annotations

import json
from pathlib import Path

from producers import (
    TRANSFORMERS_FP8,
    copy,
    ct_converted,
    ct_fp8,
    ct_sm120,
    deepseek_mtp,
    llama,
    llava,
    modelopt,
    modelopt_to_ct,
    remote_code,
    sm120,
    tied_with_head,
    to_compressed_tensors,
    with_consolidated,
)

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


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
    """compressed-tensors' own ModelOpt NVFP4 converter on the output, its checkpoint
    decompressed by transformers: the compressed-tensors cell, with the logits against the
    base's (the compressed-tensors checkpoint the recipe started from)."""
    import transformers

    converted = to_compressed_tensors(out, work / "converted")
    dequantize = transformers.CompressedTensorsConfig(dequantize=True)
    cell = _LOAD["compressed-tensors"](converted)
    if "error" not in cell:     # its scalar global scales ([], ModelOpt's shape) decompress
        cell["compared"] = _compare(logits(converted, quantization_config=dequantize),
                                    logits(base, quantization_config=dequantize), ARGMAX)
    return cell


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
    return logits(modelopt_to_ct(work / "reference"), quantization_config=config)


EQUAL, ARGMAX = "equal", "argmax"

#: (row name, recipe, producer, params (given a work directory), what the output's logits
#: must keep of the reference's (EQUAL, ARGMAX or None: not compared), the reference (given
#: the base and a work directory), a consumer-side check or None)
BUILTIN_ROWS = [
    ("chat-template / transformers Llama + tokenizer", "chat-template",
     lambda d: llama(d, tokenizer=True), _template_params, EQUAL, _the_base, _check_template),
    ("compressed-tensors-to-modelopt / modelopt-to-ct of ModelOpt Llama NVFP4",
     "compressed-tensors-to-modelopt", modelopt_to_ct, _none, EQUAL,
     _made_by(modelopt("llama-nvfp4")), _check_ct_converter),
    ("compressed-tensors-to-modelopt / compressed-tensors' ModelOpt converter of ModelOpt "
     "Llama NVFP4", "compressed-tensors-to-modelopt", ct_converted, _none, EQUAL,
     _made_by(modelopt("llama-nvfp4")), _check_ct_converter),
    ("drop-consolidated / transformers Llama, sharded, + consolidated.safetensors",
     "drop-consolidated", with_consolidated, _none, EQUAL, _the_base, None),
    ("drop-kv-scales / ModelOpt Llama FP8 after sm120-fp16-kv", "drop-kv-scales", sm120, _none,
     EQUAL, _the_base, None),
    ("drop-kv-scales / modelopt-to-ct of ModelOpt Llama NVFP4 after sm120-fp16-kv",
     "drop-kv-scales", ct_sm120, _none, EQUAL, _the_base, None),
    ("fix-eos / transformers Llama + tokenizer", "fix-eos", lambda d: llama(d, tokenizer=True),
     lambda w: {"eos_token_id": "2,3", "eos_token": "</s>"}, EQUAL, _the_base, _check_eos),
    ("fp8-block-to-bf16 / transformers FP8 Qwen3-MoE", "fp8-block-to-bf16",
     lambda d: copy(TRANSFORMERS_FP8, d), _none, None, None, None),
    ("no-remote-code / transformers Llama + auto_map", "no-remote-code", remote_code,
     lambda w: {"model_type": "llama", "architectures": "LlamaForCausalLM"}, EQUAL,
     _made_by(lambda d: llama(d, tokenizer=True)), None),
    ("nvfp4-to-bf16 / ModelOpt Llama NVFP4", "nvfp4-to-bf16", modelopt("llama-nvfp4"), _none,
     EQUAL, _ct_decompressed, None),
    ("sampling-defaults / transformers Llama", "sampling-defaults", llama,
     lambda w: {"temperature": "0.7", "top_p": "0.9", "top_k": "20"}, EQUAL, _the_base,
     _check_sampling),
    ("sm120-fp16-kv / ModelOpt Llama FP8", "sm120-fp16-kv", modelopt("llama-fp8"), _none,
     EQUAL, _the_base, None),
    ("sm120-fp16-kv / modelopt-to-ct of ModelOpt Llama NVFP4 (compressed-tensors)",
     "sm120-fp16-kv", modelopt_to_ct, _none, EQUAL, _the_base, None),
    ("strip-mtp / transformers DeepSeek-V3 + 1 MTP block", "strip-mtp", deepseek_mtp, _none,
     EQUAL, _the_base, None),
    ("text-only / transformers Llava (Llama text)", "text-only", llava,
     lambda w: {"architectures": "LlamaForCausalLM"}, EQUAL, _the_base, None),
    ("tie-embeddings / transformers Llama, lm_head == embeddings, declared tied",
     "tie-embeddings", tied_with_head, _none, EQUAL, _the_base, None),
    ("to-bf16 / ModelOpt Llama FP8", "to-bf16", modelopt("llama-fp8"), _none, None, None, None),
    ("to-bf16 / ModelOpt Llama NVFP4", "to-bf16", modelopt("llama-nvfp4"), _none, EQUAL,
     _ct_decompressed, None),
    ("to-bf16 / transformers FP8 Qwen3-MoE", "to-bf16", lambda d: copy(TRANSFORMERS_FP8, d),
     _none, None, None, None),
    ("to-bf16 / modelopt-to-ct of ModelOpt Llama NVFP4 (compressed-tensors)", "to-bf16",
     modelopt_to_ct, _none, EQUAL, _dequantized_by("CompressedTensorsConfig"), None),
    ("to-bf16 / compressed-tensors' ModelOpt converter of ModelOpt Llama NVFP4", "to-bf16",
     ct_converted, _none, ARGMAX, _dequantized_by("CompressedTensorsConfig"), None),
    ("to-bf16 / compressed-tensors FP8 (its own compressor, float-quantized)", "to-bf16", ct_fp8,
     _none, EQUAL, _dequantized_by("CompressedTensorsConfig"), None),
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
