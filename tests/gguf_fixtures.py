"""Tiny GGUF models written by gguf-py's own GGUFWriter (the tests skip without gguf-py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

try:
    import gguf
except ImportError:
    gguf = None

needs_gguf = pytest.mark.skipif(gguf is None, reason="gguf-py is not installed "
                                "(pip install -e '.[gguf]')")

HIDDEN, FFN, VOCAB = 64, 128, 32
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _weights(rng, name: str, shape: tuple[int, ...], qtype) -> tuple[np.ndarray, object]:
    data = rng.standard_normal(shape).astype(np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16), None
    if qtype == gguf.GGMLQuantizationType.F32:
        return data, None
    return gguf.quants.quantize(data, qtype), qtype


def _block_tensors(i: int, nextn: bool = False) -> list[tuple[str, tuple[int, ...], str]]:
    out = [(f"blk.{i}.attn_norm.weight", (HIDDEN,), "F32"),
           (f"blk.{i}.attn_q.weight", (HIDDEN, HIDDEN), "Q8_0"),
           (f"blk.{i}.attn_k.weight", (HIDDEN, HIDDEN), "Q8_0"),
           (f"blk.{i}.attn_v.weight", (HIDDEN, HIDDEN), "F16"),
           (f"blk.{i}.attn_output.weight", (HIDDEN, HIDDEN), "Q8_0"),
           (f"blk.{i}.ffn_norm.weight", (HIDDEN,), "F32"),
           (f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN), "Q8_0"),
           (f"blk.{i}.ffn_up.weight", (FFN, HIDDEN), "Q8_0"),
           (f"blk.{i}.ffn_down.weight", (HIDDEN, FFN), "F16")]
    if nextn:
        out += [(f"blk.{i}.nextn.eh_proj.weight", (HIDDEN, 2 * HIDDEN), "F16"),
                (f"blk.{i}.nextn.enorm.weight", (HIDDEN,), "F32"),
                (f"blk.{i}.nextn.hnorm.weight", (HIDDEN,), "F32"),
                (f"blk.{i}.nextn.shared_head_norm.weight", (HIDDEN,), "F32")]
    return out


def write_tiny(path: Path, *, arch: str = "llama", blocks: int = 2, nextn: int = 0,
               split_max_tensors: int = 0, split_max_size: int = 0, seed: int = 0,
               extra_kv=None) -> Path:
    """A tiny model: embeddings, ``blocks`` + ``nextn`` blocks of F32/F16/Q8_0 tensors, output.
    With ``nextn`` the last blocks carry nextn tensors and ``{arch}.nextn_predict_layers``."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors,
                        split_max_size=split_max_size)
    total = blocks + nextn
    w.add_name("tiny")
    w.add_block_count(total)
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(4)
    w.add_head_count_kv([4] * total if nextn else 4)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if nextn:
        w.add_nextn_predict_layers(nextn)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_token_scores([float(-i) for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    for key, value in (extra_kv or {}).items():
        w.add_key_value(key, value[1], value[0])
    specs = [("token_embd.weight", (VOCAB, HIDDEN), "F16")]
    for i in range(total):
        specs += _block_tensors(i, nextn=i >= blocks)
    specs += [("output_norm.weight", (HIDDEN,), "F32"), ("output.weight", (VOCAB, HIDDEN), "Q8_0")]
    for name, shape, qname in specs:
        data, raw = _weights(rng, name, shape, gguf.GGMLQuantizationType[qname])
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_dir(tmp_path: Path, name: str = "tiny-gguf", **kw) -> Path:
    root = tmp_path / name
    root.mkdir()
    write_tiny(root / "tiny.gguf", **kw)
    return root


def read_back(path: Path) -> tuple[dict, dict[str, bytes]]:
    """(metadata, tensor bytes) as gguf-py's GGUFReader sees them."""
    reader = gguf.GGUFReader(path)
    meta = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        meta[field.name] = field.contents()
    tensors = {t.name: bytes(np.asarray(t.data).tobytes()) for t in reader.tensors}
    return meta, tensors
