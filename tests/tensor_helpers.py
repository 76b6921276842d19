"""Helpers shared by the tensor-transform tests: hand-built model directories, recipes written in
the test, reading outputs back with safetensors, bit-for-bit comparison, snapshots of the base."""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from pathlib import Path

import torch
from exact_reference import round_exact_product
from safetensors import safe_open
from safetensors.torch import save_file

INDEX = "model.safetensors.index.json"
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def write_model(root: Path, shards: dict[str, dict[str, torch.Tensor]],
                config: dict | None = None, *, index: bool = True,
                extra_files: dict[str, str] | None = None) -> Path:
    """A model directory: one safetensors file per entry (``format: pt``), an index, a config."""
    root.mkdir(parents=True)
    weight_map, total = {}, 0
    for shard, tensors in shards.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, root / shard,
                  metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        total += sum(nbytes(t) for t in tensors.values())
    if index:
        (root / INDEX).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
            indent=2))
    (root / "config.json").write_text(json.dumps(config or {"model_type": "test"}, indent=2))
    for name, text in (extra_files or {}).items():
        (root / name).write_text(text)
    return root


def write_recipe(path: Path, tensors: str, *, name: str = "t", extra: str = "") -> Path:
    """A recipe file: ``tensors`` is the YAML list under ``tensors:`` (dedented)."""
    body = textwrap.indent(textwrap.dedent(tensors).strip("\n"), "  ")
    path.write_text(f"modelpatch: 1\nname: {name}\ndescription: test recipe\n"
                    f"{textwrap.dedent(extra)}tensors:\n{body}\n")
    return path


def shard_files(model: Path) -> list[Path]:
    return sorted(model.glob("*.safetensors"))


def read_tensors(model: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every shard (names must be unique across shards)."""
    out: dict[str, torch.Tensor] = {}
    for shard in shard_files(model):
        with safe_open(shard, "pt") as f:
            for name in f.keys():
                assert name not in out, f"{name} in two shards"
                out[name] = f.get_tensor(name)
    return out


def tensor_shards(model: Path) -> dict[str, str]:
    out = {}
    for shard in shard_files(model):
        with safe_open(shard, "pt") as f:
            out.update(dict.fromkeys(f.keys(), shard.name))
    return out


def shard_metadata(shard: Path) -> dict | None:
    with safe_open(shard, "pt") as f:
        return f.metadata()


def transformers_logits(model_dir: Path) -> torch.Tensor:
    """Logits of a fixed prompt from the model at ``model_dir`` loaded by transformers (bf16)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        return model(torch.arange(12).reshape(1, 12)).logits


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (0..15) two per byte, the even element in the low nibble: how ModelOpt and
    compressed-tensors pack e2m1 (the kernels pack inline; this builds test inputs)."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def bits(t: torch.Tensor) -> torch.Tensor:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, a.shape, b.dtype, b.shape)
    same = bits(a) == bits(b)
    if not bool(same.all()):
        i = int((~same).flatten().nonzero()[0])
        raise AssertionError(f"{what}: {int((~same).sum())} of {a.numel()} elements differ; "
                             f"first at {i}: {a.flatten()[i].item()!r} vs "
                             f"{b.flatten()[i].item()!r}")


# --- references straight from docs/architecture.md §1, in float32 -------------------------------

def ref_nvfp4_modelopt(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
    """W = LUT[code] * float(weight_scale[r, c // 16]) * weight_scale_2, even element low.

    Code 8 (sign bit, zero magnitude) is +0.0, as in ModelOpt's ``NVFP4QTensor.e2m1_values``
    (``[0, 0.5, ..., 6, 0, -0.5, ...]``); compressed-tensors decodes it to -0.0."""
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    lut = torch.tensor(E2M1 + (0.0,) + tuple(-v for v in E2M1[1:]), dtype=torch.float64)
    w = lut[codes] * scale.double().repeat_interleave(16, dim=1) * scale_2.double().reshape(())
    return rounded_once(w, dtype)


def ref_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                  block: int = 128) -> torch.Tensor:
    """W = fp8[i, j] * weight_scale_inv[i // 128, j // 128], exact, rounded once."""
    rows, cols = weight.shape
    full = scale_inv.double().repeat_interleave(block, 0).repeat_interleave(block, 1)
    return rounded_once(weight.double() * full[:rows, :cols], dtype)


def ref_fp8_tensor(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W = fp8 * weight_scale (a scalar or one per output row), exact, rounded once."""
    s = scale.double()
    s = s.reshape(()) if s.numel() == 1 else s.reshape(-1, 1)
    return rounded_once(weight.double() * s, dtype)


def rounded_once(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Exact float64 values rounded half to even to ``dtype`` by the independent integer
    reference (tests/exact_reference.py), not by torch's casts (which round float64 to bfloat16
    through float32: twice)."""
    fmt = str(dtype).removeprefix("torch.")
    return torch.from_numpy(round_exact_product(exact.numpy(), fmt)).to(dtype)


def random_fp8(shape, gen) -> torch.Tensor:
    """Every finite float8_e4m3fn bit pattern (NaN codes replaced by 0)."""
    raw = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
    raw[(raw & 0x7F) == 0x7F] = 0
    return raw.view(torch.float8_e4m3fn)


# --- the base must not change --------------------------------------------------------------

def snapshot(root: Path) -> dict[str, tuple]:
    """Bytes, mode, inode and mtime of every entry under ``root``."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_file():
            out[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mode,
                        st.st_ino, st.st_mtime_ns)
        else:
            out[rel] = ("dir", st.st_mode)
    return out


def listing(directory: Path) -> list[str]:
    """Names in ``directory`` (hidden ones too): staging directories must not be left over."""
    return sorted(os.listdir(directory))


def ct_fp8(preset: str, w: torch.Tensor):
    """``w`` compressed by compressed-tensors' FP8 preset ``preset`` (its own scale computation
    and compressor), and compressed-tensors' own decompression of it."""
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme, quant_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = QuantizationScheme(targets=["Linear"], **getattr(quant_scheme, preset))
    args = scheme.weights
    if args.strategy == "tensor":
        lo, hi = w.amin(), w.amax()
    elif args.strategy == "channel":
        lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    else:
        bh, bw = args.block_structure
        padded = torch.nn.functional.pad(w, (0, -w.shape[1] % bw, 0, -w.shape[0] % bh))
        blocks = padded.reshape(padded.shape[0] // bh, bh, padded.shape[1] // bw, bw)
        lo, hi = blocks.amin((1, 3)), blocks.amax((1, 3))
    scale, _ = calculate_qparams(lo, hi, args)
    compressed = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
    theirs = FloatQuantizationCompressor.decompress(dict(compressed), scheme)["weight"]
    return compressed, theirs
