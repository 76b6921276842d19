"""The llama.cpp column of integration/consumer_matrix.py's GGUF rows: llama.cpp's own converter
and llama.cpp's own loader, no Python binding.

The base of each row is a tiny random Llama saved by transformers (``save_pretrained``) with a
Llama-style tokenizer (BPE with byte fallback, built here by ``tokenizers``: no tokenizer can be
downloaded), converted by llama.cpp's ``convert_hf_to_gguf.py``. The row's recipe is applied to
it by modelpatch; llama.cpp's ``llama-simple`` then loads base and output and generates greedily
from one prompt. The cell compares:

- loads: both load and generate (the output at least);
- tokens: the generated text, same as the base's unless the recipe changes generation
  (``gguf-context``: YaRN rescales the rope; ``gguf-fix-eos``: generation stops at the new EOS);
- metadata: what llama.cpp's load log reports (``n_ctx_train``, rope scaling, ``EOS token``,
  ``tokenizer.chat_template``, ``n_layer``) as the recipe intends.

For ``gguf-strip-mtp`` the base is the converted model with one MTP block appended (as
convert_hf_to_gguf.py writes GLM-4.5-style models); llama.cpp has no MTP for the Llama
architecture, so it refuses that base, and the output must load and generate exactly what the
converted model without the block generates.

``LLAMA_CPP_BIN``: the directory holding ``llama-simple`` (integration/build-llama-cpp.sh prints
it); ``LLAMA_CPP_SRC``: the llama.cpp source tree (``convert_hf_to_gguf.py``, ``gguf-py``),
by default two levels above ``LLAMA_CPP_BIN``; ``LLAMA_CPP_PYDEPS``: extra modules the converter
imports (sentencepiece), by default ``pydeps`` beside ``bin``. Without ``LLAMA_CPP_BIN`` the
column is skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

PROMPT = "hello world"
N_PREDICT = 24
VOCAB = 320
#: the new EOS: a name llama.cpp does not end generation on by itself (it does on <|im_end|>,
#: <|eot_id|>, <|endoftext|>... whatever tokenizer.ggml.eos_token_id says)
NEW_EOS = "<|turn_stop|>"
OLD_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def tools() -> dict[str, Path] | None:
    """Where llama.cpp is, from the environment; None when it is not there."""
    bin_dir = os.environ.get("LLAMA_CPP_BIN")
    if not bin_dir or not (Path(bin_dir) / "llama-simple").is_file():
        return None
    bin_path = Path(bin_dir).resolve()
    src = Path(os.environ.get("LLAMA_CPP_SRC") or bin_path.parents[1])
    pydeps = Path(os.environ.get("LLAMA_CPP_PYDEPS") or bin_path.parent / "pydeps")
    if not (src / "convert_hf_to_gguf.py").is_file():
        return None
    return {"simple": bin_path / "llama-simple", "src": src, "pydeps": pydeps}


def hf_llama(out: Path) -> Path:
    """A tiny random Llama with a Llama-2-style tokenizer.json, the chat template list
    (default and tool_use) in tokenizer_config.json."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>", NEW_EOS] + [f"<0x{i:02X}>" for i in range(256)]
    text = ["hello world, the quick brown fox jumps over the lazy dog. " * 3,
            "a tiny model says hello to the world and the world says hello back."] * 10
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                                      show_progress=False))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        "chat_template": [{"name": "default", "template": OLD_TEMPLATE},
                          {"name": "tool_use", "template": OLD_TEMPLATE + "{{ tools }}"}]}))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=2048, bos_token_id=1,
        eos_token_id=2, tie_word_embeddings=False))
    with torch.no_grad():       # wide weights: a random model that does not repeat one token
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5)
        # NEW_EOS a little above "row", which the model generates from PROMPT: the base
        # prints it mid-text, and a variant whose EOS it is must stop right there
        head = model.lm_head.weight
        head[tok.token_to_id(NEW_EOS)] = head[tok.token_to_id("row")] * 1.05
    model.to(torch.bfloat16).save_pretrained(out)
    return out


def convert(hf: Path, root: Path, where: dict[str, Path]) -> Path:
    """``root``/tiny.gguf, written by llama.cpp's convert_hf_to_gguf.py: Q8_0 weights, F32
    norms (quantized blocks and plain tensors in one file)."""
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(where["src"] / "gguf-py"), str(where["pydeps"])]))
    done = subprocess.run([sys.executable, str(where["src"] / "convert_hf_to_gguf.py"), str(hf),
                           "--outfile", str(root / "tiny.gguf"), "--outtype", "q8_0"],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {done.stderr.strip()[-300:]}")
    return root


def with_mtp(converted: Path, root: Path) -> Path:
    """The converted model with one more block, an MTP block (a copy of the last block plus
    ``nextn.eh_proj``), declared by ``{arch}.nextn_predict_layers`` = 1."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(converted / "tiny.gguf")
    arch = reader.fields["general.architecture"].contents()
    blocks = reader.fields[f"{arch}.block_count"].contents()
    root.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(root / "tiny.gguf", arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture",
                                                             "general.size_label"):
            continue
        value = field.contents()
        if field.name == f"{arch}.block_count":
            value = blocks + 1
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, value, field.types[0], sub_type=sub)
    w.add_nextn_predict_layers(1)
    last = f"blk.{blocks - 1}."
    extra = [(t.name.replace(last, f"blk.{blocks}."), t) for t in reader.tensors
             if t.name.startswith(last)]
    for name, t in [(t.name, t) for t in reader.tensors] + extra:
        # the reader's array shape: elements for F16/F32, bytes per row for quantized types
        w.add_tensor(name, np.asarray(t.data), raw_shape=list(t.data.shape),
                     raw_dtype=t.tensor_type)
    eh = np.zeros((64, 128), np.float16)
    w.add_tensor(f"blk.{blocks}.nextn.eh_proj.weight", eh)
    # counted with the MTP block, as convert_hf_to_gguf.py counts what it writes
    w.add_size_label(gguf.size_label(*w.get_total_parameter_count()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return root


def run_simple(model: Path, where: dict[str, Path]) -> dict:
    """llama-simple on ``model``: whether it loaded, what it generated, what its log reports."""
    done = subprocess.run([str(where["simple"]), "-m", str(model), "-n", str(N_PREDICT),
                           "-ngl", "0", PROMPT], capture_output=True, timeout=300)
    log = done.stderr.decode("utf-8", "replace")
    # the random model emits byte tokens that are not UTF-8 on their own: kept escaped, exact
    text = done.stdout.decode("utf-8", "backslashreplace").strip()
    seen = {"loaded": done.returncode == 0, "text": text if not done.returncode else None,
            **parse_log(log)}
    if not seen["loaded"]:
        errors = [line for line in log.splitlines() if "error" in line.lower()]
        seen["refused"] = (errors[0] if errors else log.strip()[-200:])[:160]
    return seen


def parse_log(log: str) -> dict:
    """What llama.cpp's load log (llama_model_loader's key list, print_info) reports."""
    seen = {}
    for key, pattern in (("n_ctx_train", r"n_ctx_train\s*=\s*(\d+)"),
                         ("n_layer", r"print_info: n_layer\s*=\s*(\d+)"),
                         ("rope_scaling", r"rope scaling\s*=\s*(\S+)"),
                         ("freq_scale_train", r"freq_scale_train\s*=\s*(\S+)"),
                         ("eos", r"EOS token\s*=\s*(\d+)"),
                         ("size_label", r"kv\s+\d+:\s+general\.size_label\s+str\s+=\s(\S+)"),
                         ("chat_template", r"kv\s+\d+:\s+tokenizer\.chat_template\s+str\s+=\s(.*)"),
                         ("tool_use", r"kv\s+\d+:\s+tokenizer\.chat_template\.tool_use\s")):
        found = re.search(pattern, log)
        seen[key] = (found.group(1) if found.groups() else True) if found else None
    return seen


def _apply(recipe: str, base: Path, out: Path, params: dict) -> Path:
    from patcher import api

    return api.apply(recipe, base, out=out, params=params).output


def cell(recipe: str, params: dict, new_template: str, work: Path) -> dict | str:
    """The llama.cpp cell of the row applying ``recipe``: a dict of what was seen and the
    verdicts, or a string saying why it was skipped."""
    where = tools()
    if where is None:
        return "skipped (LLAMA_CPP_BIN: no llama-simple)"
    plain = convert(hf_llama(work / "hf"), work / "converted", where)
    base = with_mtp(plain, work / "base") if recipe == "gguf-strip-mtp" else plain
    if recipe == "gguf-fix-eos":
        (base / "tokenizer_config.json").write_text(json.dumps({"eos_token": NEW_EOS}))
    out = _apply(recipe, base, work / "out", params)
    before, after = run_simple(base / "tiny.gguf", where), run_simple(out / "tiny.gguf", where)
    reference = run_simple(plain / "tiny.gguf", where) if base != plain else before
    want_text = reference["text"]
    if recipe == "gguf-fix-eos" and want_text is not None:
        # generation stops at the new EOS: the base's text up to it
        want_text = want_text.split(NEW_EOS)[0].rstrip()
    metadata = {
        # the load log cuts strings at 40 characters and adds "..."
        "gguf-chat-template": bool(after["chat_template"]) and not after["tool_use"]
        and new_template.startswith(after["chat_template"].removesuffix("..."))
        and after["chat_template"] != before["chat_template"],
        "gguf-fix-eos": after["eos"] == "3",
        "gguf-context": (after["n_ctx_train"], after["rope_scaling"], after["freq_scale_train"])
        == ("8192", "yarn", "0.25"),
        "gguf-strip-mtp": after["n_layer"] == "2" and after["size_label"] is not None
        and after["size_label"] == reference["size_label"] != before["size_label"],
    }[recipe]
    same = after["text"] == want_text
    stops = recipe == "gguf-fix-eos" and want_text != reference["text"]
    return {"stops_at_new_eos": stops, "before": before, "after": after, "loads": after["loaded"],
            "base_loads": before["loaded"], "tokens_same": same,
            # YaRN rescales the rope: a different generation is the recipe's doing
            "tokens_may_differ": recipe == "gguf-context", "metadata_ok": metadata}


def show(cell_: dict | str) -> str:
    if isinstance(cell_, str):
        return cell_
    b, a = cell_["before"], cell_["after"]
    ok = cell_["loads"] and cell_["metadata_ok"] and (cell_["tokens_same"]
                                                      or cell_["tokens_may_differ"])
    parts = ["loads" if cell_["loads"] else f"refused ({a.get('refused')})"]
    if not cell_["base_loads"]:
        parts.append(f"base refused ({b.get('refused')})")
    parts.append(("the base's tokens up to the new EOS, then stops" if cell_["stops_at_new_eos"]
                  else "same tokens") if cell_["tokens_same"] else
                 "tokens differ (expected)" if cell_["tokens_may_differ"] else "tokens DIFFER")
    parts.append(f"n_ctx_train {b['n_ctx_train']}->{a['n_ctx_train']}, "
                 f"rope {b['rope_scaling']}->{a['rope_scaling']}, EOS {b['eos']}->{a['eos']}, "
                 f"n_layer {b['n_layer']}->{a['n_layer']}, "
                 f"size_label {b['size_label']}->{a['size_label']}, "
                 f"tool_use template {'kept' if a['tool_use'] else 'gone'}")
    parts.append("metadata as intended" if cell_["metadata_ok"] else "metadata WRONG")
    return f"{'ok' if ok else 'FAIL'}: " + "; ".join(parts)
