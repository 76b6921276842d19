"""Check a metadata-only GGUF patch against llama.cpp itself (through llama-cpp-python).

A tiny Llama GGUF (random F32/F16/Q8_0 weights, written by gguf-py's own GGUFWriter) is patched
by ``modelpatch apply`` with a new chat template, a new EOS token and a new context length, the
file given as MODEL. llama.cpp then loads the base and the variant, and the check compares:

- the metadata llama.cpp reports: ``tokenizer.chat_template``, the EOS token id
  (``llama_vocab_eos``), the training context length (``llama_model_n_ctx_train``): each as the
  recipe set it;
- the logits of the same prompt, every position: identical (bit for bit) before and after, since
  no tensor byte changed.

Exit status 0 when every check passes. Run it through integration/run-llama-cpp.sh.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
from llama_cpp import Llama

HIDDEN, FFN, VOCAB, BLOCKS = 64, 128, 64, 2
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
RECIPE = """modelpatch: 1
name: llama-check
description: chat template, EOS and context length (metadata only)
gguf:
  metadata:
    - {set: tokenizer.chat_template, from: new.jinja}
    - {set: tokenizer.ggml.eos_token_id, value: t5, token: true}
    - {set: "{arch}.context_length", value: 4096}
"""


def write_tiny(path: Path) -> None:
    """A tiny Llama llama.cpp can load: SPM-style vocabulary, two blocks, mixed ggml types."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny")
    w.add_block_count(BLOCKS)
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_rope_dimension_count(HIDDEN // 4)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, VOCAB)]
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(VOCAB)])
    w.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))     # unknown, control, control, normal
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{{ messages }}")
    specs = [("token_embd.weight", (VOCAB, HIDDEN), "F16")]
    for i in range(BLOCKS):
        specs += [(f"blk.{i}.attn_norm.weight", (HIDDEN,), "F32"),
                  (f"blk.{i}.attn_q.weight", (HIDDEN, HIDDEN), "Q8_0"),
                  (f"blk.{i}.attn_k.weight", (HIDDEN, HIDDEN), "Q8_0"),
                  (f"blk.{i}.attn_v.weight", (HIDDEN, HIDDEN), "F16"),
                  (f"blk.{i}.attn_output.weight", (HIDDEN, HIDDEN), "Q8_0"),
                  (f"blk.{i}.ffn_norm.weight", (HIDDEN,), "F32"),
                  (f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN), "Q8_0"),
                  (f"blk.{i}.ffn_up.weight", (FFN, HIDDEN), "Q8_0"),
                  (f"blk.{i}.ffn_down.weight", (HIDDEN, FFN), "F16")]
    specs += [("output_norm.weight", (HIDDEN,), "F32"), ("output.weight", (VOCAB, HIDDEN), "Q8_0")]
    for name, shape, qname in specs:
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if qname == "F32" and name.endswith("norm.weight"):
            data = np.ones(shape, np.float32)
        qtype = gguf.GGMLQuantizationType[qname]
        if qname == "F16":
            w.add_tensor(name, data.astype(np.float16))
        elif qname == "F32":
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def observe(path: Path, prompt: list[int]) -> dict:
    """What llama.cpp reports for the model at ``path``, and the logits of ``prompt``."""
    llm = Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, seed=0,
                n_threads=1)
    llm.eval(prompt)
    logits = np.array(llm.scores[:len(prompt)], dtype=np.float32)
    seen = {"chat_template": llm.metadata.get("tokenizer.chat_template"), "eos": llm.token_eos(),
            # llama_model_n_ctx_train: Llama has no public wrapper for it (0.3.36)
            "n_ctx_train": llm._model.n_ctx_train(), "logits": logits}
    llm.close()
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modelpatch", default="modelpatch", help="the modelpatch command")
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="llama-check-"))
    base = work / "models"
    base.mkdir(parents=True, exist_ok=True)
    model = base / "tiny.gguf"
    write_tiny(model)
    (work / "new.jinja").write_text(TEMPLATE)
    recipe = work / "llama-check.yaml"
    recipe.write_text(RECIPE)
    out = work / "variant"
    subprocess.run([*args.modelpatch.split(), "-q", "apply", str(recipe), str(model), "-o",
                    str(out)], check=True)
    subprocess.run([*args.modelpatch.split(), "-q", "verify", str(out / "tiny.gguf")],
                   check=True, stdout=subprocess.DEVNULL)
    prompt = [1, 7, 12, 30, 41, 5, 9, 63, 20]
    before, after = observe(model, prompt), observe(out / "tiny.gguf", prompt)
    checks = {
        "chat template (llama.cpp metadata)": (before["chat_template"], after["chat_template"],
                                               after["chat_template"] == TEMPLATE),
        "EOS id (llama_vocab_eos)": (before["eos"], after["eos"], after["eos"] == 5),
        "training context (n_ctx_train)": (before["n_ctx_train"], after["n_ctx_train"],
                                           after["n_ctx_train"] == 4096),
        f"logits of {len(prompt)} positions x {VOCAB}": (
            f"max |x| {np.abs(before['logits']).max():.4f}",
            "bit-identical" if np.array_equal(before["logits"], after["logits"]) else
            f"max diff {np.abs(before['logits'] - after['logits']).max()}",
            np.array_equal(before["logits"], after["logits"])
            and np.isfinite(before["logits"]).all() and before["logits"].any()),
    }
    rows = []
    for name, (was, now, ok) in checks.items():
        rows.append({"check": name, "before": was, "after": now, "ok": bool(ok)})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {json.dumps(was)} -> {json.dumps(now)}")
    print(f"work directory: {work}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
