"""The GGUF rows of integration/consumer_matrix.py: each built-in GGUF recipe applied to a GGUF
written by gguf-py's own ``GGUFWriter`` (the writer llama.cpp's convert_hf_to_gguf.py uses), read
back as readers read it.

The ``gguf-py`` cell reads base and output with gguf-py's ``GGUFReader`` (tensor data at the
header's end rounded up to the alignment, as llama.cpp reads it): every tensor the recipe keeps
has the base's bytes, the recipe's keys have the values it promises, and where gguf-py's own
``gguf-new-metadata`` can make the same edit, the output's metadata equals that tool's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HIDDEN, FFN, VOCAB, BLOCKS = 64, 128, 64, 2
OLD_TEMPLATE = "{{ messages }}"
NEW_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def tiny_gguf(root: Path, nextn: int = 0) -> Path:
    """A tiny Llama GGUF with a tool-use template and the template list (the keys a chat
    template edit must not leave stale), and ``nextn`` MTP blocks past the real ones."""
    import gguf
    import numpy as np

    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(root / "tiny.gguf", "llama")
    w.add_name("tiny")
    w.add_size_label("2x64")
    w.add_block_count(BLOCKS + nextn)
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_rope_dimension_count(HIDDEN // 4)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if nextn:
        w.add_nextn_predict_layers(nextn)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, VOCAB)])
    w.add_token_scores([float(-i) for i in range(VOCAB)])
    w.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template([{"name": "default", "template": OLD_TEMPLATE},
                         {"name": "tool_use", "template": OLD_TEMPLATE + "{{ tools }}"}])
    specs = [("token_embd.weight", (VOCAB, HIDDEN), "F16")]
    for i in range(BLOCKS + nextn):
        specs += [(f"blk.{i}.attn_norm.weight", (HIDDEN,), "F32"),
                  (f"blk.{i}.attn_q.weight", (HIDDEN, HIDDEN), "Q8_0"),
                  (f"blk.{i}.attn_v.weight", (HIDDEN, HIDDEN), "F16"),
                  (f"blk.{i}.ffn_down.weight", (HIDDEN, FFN), "F16")]
        if i >= BLOCKS:
            specs.append((f"blk.{i}.nextn.eh_proj.weight", (HIDDEN, 2 * HIDDEN), "F16"))
    specs += [("output_norm.weight", (HIDDEN,), "F32"), ("output.weight", (VOCAB, HIDDEN), "Q8_0")]
    for name, shape, qname in specs:
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
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
    return root


def _with_tokenizer_config(root: Path) -> Path:
    tiny_gguf(root)
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t5"}))
    return root


def _template_params(work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    (work / "new.jinja").write_text(NEW_TEMPLATE)
    return {"template": f"file:{work / 'new.jinja'}"}


def read_gguf(path: Path) -> tuple[dict, dict[str, bytes]]:
    """(metadata, tensor bytes) as gguf-py's GGUFReader reads them."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(path)
    meta = {f.name: f.contents() for f in reader.fields.values()
            if not f.name.startswith("GGUF.")}
    return meta, {t.name: np.asarray(t.data).tobytes() for t in reader.tensors}


def _new_metadata(base: Path, out: Path, args: list[str]) -> dict:
    """gguf-py's gguf-new-metadata on ``base`` with ``args``: its output's metadata."""
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(base), str(out),
                    "--force", *args], check=True, capture_output=True)
    return read_gguf(out)[0]


def _expect_template(meta: dict, base: Path, work: Path) -> list[str]:
    bad = [] if meta.get("tokenizer.chat_template") == NEW_TEMPLATE else ["chat_template"]
    bad += [k for k in meta if k.startswith("tokenizer.chat_template.")
            or k == "tokenizer.chat_templates"]
    work.mkdir(parents=True, exist_ok=True)
    (work / "new.jinja").write_text(NEW_TEMPLATE)
    theirs = _new_metadata(base, work / "new-metadata.gguf",
                           ["--chat-template-file", str(work / "new.jinja")])
    return bad + _differs(meta, theirs)


def _expect_eos(meta: dict, base: Path, work: Path) -> list[str]:
    bad = [] if meta.get("tokenizer.ggml.eos_token_id") == 5 else ["eos_token_id"]
    work.mkdir(parents=True, exist_ok=True)
    theirs = _new_metadata(base, work / "new-metadata.gguf", ["--special-token", "eos", "t5"])
    return bad + _differs(meta, theirs)


def _expect_context(meta: dict, base: Path, work: Path) -> list[str]:
    want = {"llama.context_length": 8192, "llama.rope.scaling.type": "yarn",
            "llama.rope.scaling.factor": 4.0, "llama.rope.scaling.original_context_length": 2048}
    return [k for k, v in want.items() if meta.get(k) != v]


def _expect_strip(meta: dict, base: Path, work: Path) -> list[str]:
    bad = [] if meta.get("llama.block_count") == BLOCKS else ["block_count"]
    bad += [] if meta.get("llama.nextn_predict_layers", 0) == 0 else ["nextn_predict_layers"]
    # the base's label counted the MTP block's parameters: recounted or dropped, never kept
    return bad + (["stale general.size_label"] if meta.get("general.size_label") == "2x64"
                  else [])


def _differs(ours: dict, theirs: dict) -> list[str]:
    """Keys whose value differs from gguf-new-metadata's output (its own bookkeeping aside)."""
    keys = (set(ours) | set(theirs)) - {"general.quantization_version"}
    return [f"{k} differs from gguf-new-metadata" for k in sorted(keys)
            if ours.get(k) != theirs.get(k)]


#: (row name, recipe, producer, params (given a work directory), expectations, dropped tensors)
GGUF_ROWS = [
    ("gguf-chat-template / gguf-py GGUFWriter Llama (tool_use template)", "gguf-chat-template",
     tiny_gguf, _template_params, _expect_template, ()),
    ("gguf-fix-eos / gguf-py GGUFWriter Llama", "gguf-fix-eos", _with_tokenizer_config,
     lambda w: {}, _expect_eos, ()),
    ("gguf-context / gguf-py GGUFWriter Llama", "gguf-context", tiny_gguf, lambda w: {},
     _expect_context, ()),
    ("gguf-strip-mtp / gguf-py GGUFWriter Llama + 1 MTP block", "gguf-strip-mtp",
     lambda d: tiny_gguf(d, nextn=1), lambda w: {}, _expect_strip, ("blk.2.",)),
]


def gguf_cell(base: Path, out: Path, expect, dropped: tuple[str, ...], work: Path) -> dict:
    """Tensors of the output against the base's, read by GGUFReader, and the expectations."""
    base_meta, base_tensors = read_gguf(base / "tiny.gguf")
    meta, tensors = read_gguf(out / "tiny.gguf")
    kept = {n for n in base_tensors if not n.startswith(dropped)} if dropped else set(base_tensors)
    wrong = [n for n in kept if tensors.get(n) != base_tensors[n]]
    extra = sorted(set(tensors) - kept)
    return {"tensors": len(tensors), "tensors_wrong": len(wrong) + len(extra),
            "metadata_wrong": expect(meta, base / "tiny.gguf", work)}


def show_gguf(cell: dict) -> str:
    ok = not cell["tensors_wrong"] and not cell["metadata_wrong"]
    text = f"{'ok' if ok else 'FAIL'}: {cell['tensors']} tensors as the base's"
    if cell["tensors_wrong"]:
        text += f", {cell['tensors_wrong']} wrong"
    if cell["metadata_wrong"]:
        text += f"; metadata wrong: {', '.join(cell['metadata_wrong'][:3])}"
    return text

