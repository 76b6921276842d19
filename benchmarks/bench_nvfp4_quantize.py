"""NVFP4A16 quantization of a BF16 model: ``modelpatch apply nvfp4a16`` against a plain script
that calls compressed-tensors' own compressor (``NVFP4PackedCompressor.compress``, its
``generate_gparam`` / ``calculate_qparams`` for the scales) on the same tensors, shard by shard.

    python benchmarks/bench_nvfp4_quantize.py --size-gb 1 --workdir /var/tmp/nvfp4-bench

The model is Llama-shaped (hidden 2048, MLP 5632, 4 KV heads of 64), random BF16 weights of a
fixed seed, in shards of about 500 MB; the outputs of both are compared tensor by tensor, bit for
bit, after the timed runs. One run of each (after one untimed read of the model), side by side;
figures: wall seconds, CPU seconds, peak RSS, and GB of BF16 input per wall second.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import PY, Bench, finish, log, preload, rmtree  # noqa: E402

HIDDEN, INNER, KV, VOCAB = 2048, 5632, 256, 32000
# the nvfp4a16 recipe's selection on this model: the attention and MLP projections
LINEAR = re.compile(r"\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")


def _specs(layers: int):
    yield "model.embed_tokens.weight", (VOCAB, HIDDEN)
    for i in range(layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (HIDDEN,)
        for name, shape in (("q_proj", (HIDDEN, HIDDEN)), ("k_proj", (KV, HIDDEN)),
                            ("v_proj", (KV, HIDDEN)), ("o_proj", (HIDDEN, HIDDEN))):
            yield f"{p}self_attn.{name}.weight", shape
        yield p + "post_attention_layernorm.weight", (HIDDEN,)
        for name, shape in (("gate_proj", (INNER, HIDDEN)), ("up_proj", (INNER, HIDDEN)),
                            ("down_proj", (HIDDEN, INNER))):
            yield f"{p}mlp.{name}.weight", shape
    yield "model.norm.weight", (HIDDEN,)
    yield "lm_head.weight", (VOCAB, HIDDEN)


def make_model(root: Path, size_gb: float, shard_mb: int = 500) -> Path:
    """A Llama-shaped BF16 model of about ``size_gb`` GB (random weights, seed 0)."""
    import torch
    from safetensors.torch import save_file

    per_layer = 2 * (2 * HIDDEN * HIDDEN + 2 * KV * HIDDEN + 3 * INNER * HIDDEN)
    layers = max(1, round((size_gb * 1e9 - 4 * VOCAB * HIDDEN) / per_layer))
    root.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    shards, current, size = [], {}, 0
    for name, shape in _specs(layers):
        t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16)
        current[name] = t
        size += t.numel() * 2
        if size >= shard_mb * 1e6:
            shards.append(current)
            current, size = {}, 0
    if current:
        shards.append(current)
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, root / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
        total += sum(t.numel() * 2 for t in tensors.values())
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}))
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INNER, "num_hidden_layers": layers, "num_attention_heads": 32,
        "num_key_value_heads": KV // 64, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096}, indent=2))
    log(f"model: {layers} layers, {len(shards)} shards, {total / 1e9:.2f} GB")
    return root


BASELINE = r"""
import sys, re
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.quantization import QuantizationScheme, quant_scheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir()
linear = re.compile(sys.argv[3])
scheme = QuantizationScheme(targets=["Linear"], **quant_scheme.NVFP4A16)
args = scheme.weights
for shard in sorted(src.glob("*.safetensors")):
    out = {}
    for name, w in load_file(shard).items():
        if not linear.search(name):
            out[name] = w
            continue
        f = w.float()
        gs = generate_gparam(f.amin(), f.amax())
        groups = f.unflatten(-1, (-1, args.group_size))
        scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=gs)
        parts = NVFP4PackedCompressor.compress(
            {"weight": w, "weight_scale": scale.reshape(w.shape[0], -1),
             "weight_global_scale": gs.reshape(1)}, scheme)
        stem = name[: -len("weight")]
        for key, value in parts.items():
            out[stem + key] = value
    save_file(out, dst / shard.name, metadata={"format": "pt"})
"""


def compare(a: Path, b: Path) -> tuple[int, list[str]]:
    """Tensors compared and the names whose bytes differ (or that only one side has)."""
    import torch
    from safetensors.torch import load_file

    ours, theirs = {}, {}
    for d, into in ((a, ours), (b, theirs)):
        for shard in sorted(d.glob("*.safetensors")):
            into.update(load_file(shard))
    differ = sorted(set(ours) ^ set(theirs))
    for name in set(ours) & set(theirs):
        x, y = ours[name], theirs[name]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(
                x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            differ.append(name)
    return len(set(ours) | set(theirs)), differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/nvfp4-bench"))
    ap.add_argument("--jobs", type=int, default=None, help="modelpatch -j (default: its own)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    a = ap.parse_args()
    bench = Bench(a.workdir, Path(__file__).resolve().parent)
    model = a.workdir / f"llama-bf16-{a.size_gb:g}gb"
    if not model.exists():
        make_model(model, a.size_gb)
    gb = sum(p.stat().st_size for p in model.glob("*.safetensors")) / 1e9
    preload(model)
    script = a.workdir / "baseline_nvfp4.py"
    script.write_text(BASELINE)
    ours, theirs = a.workdir / "out-modelpatch", a.workdir / "out-compressed-tensors"
    rmtree(ours)
    rmtree(theirs)
    cmd = [*bench.mp, "apply", "nvfp4a16", str(model), "-o", str(ours), "--device", a.device]
    if a.jobs:
        cmd += ["-j", str(a.jobs)]
    results = {}
    log("modelpatch apply nvfp4a16 ...")
    results["modelpatch"] = finish(bench.measure(cmd, sample=True))
    log("compressed-tensors script ...")
    results["compressed-tensors"] = finish(bench.measure(
        [PY, str(script), str(model), str(theirs), LINEAR.pattern], sample=True))
    count, differ = compare(ours, theirs)
    figures = {"input_gb": round(gb, 3), "tensors": count, "differ": differ[:10],
               "device": a.device, "jobs": a.jobs}
    for name, r in results.items():
        figures[name] = {"wall_s": round(r["wall_s"], 2), "cpu_s": round(r["cpu_s"], 2),
                         "gb_per_s": round(gb / r["wall_s"], 3),
                         "peak_rss_mb": round((r.get("tree_peak") or r["maxrss"]) / 1e6)}
    print(json.dumps(figures, indent=2))
    if a.out:
        a.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
