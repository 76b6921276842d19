"""What each consumer makes of a recipe's output: recipe x producer fixture -> vLLM, transformers,
compressed-tensors (and llama.cpp for GGUF outputs).

Rows (``ROWS``, and ``builtin_rows.BUILTIN_ROWS`` for every other built-in): a recipe applied
to a model made by its real producer (transformers ``save_pretrained``, the ModelOpt exports of
tests/fixtures/modelopt, transformers' FP8 checkpoint of tests/fixtures/transformers_fp8_moe).
Columns:

- ``vllm``: vLLM's own code, imported (run through integration/run-vllm.sh --matrix): the
  quantization method ``EngineArgs(...).create_engine_config()`` resolves; every Linear's
  ``should_ignore_layer`` against the output's ``ignore`` with the model class's
  ``packed_modules_mapping`` (a module kept in BF16 must be ignored, a quantized one not); the
  global scales of each fused layer (one per group, as vLLM keeps one); every KV-scale tensor
  through ``maybe_remap_kv_scale_name`` against the attention's scale parameters (``attn.k_scale``;
  MLA: ``mla_attn.mla_attn.k_scale``, DeepseekV2Attention's wrapper);
- ``transformers``: ``from_pretrained`` of the output: missing / unexpected / mismatched keys and
  whether the logits of one prompt are finite; on ``BUILTIN_ROWS``, also the logits against the
  base's where the recipe must not change them, and the recipe's own reader-side check;
- ``compressed-tensors``: the same with ``CompressedTensorsConfig(dequantize=True)``: decompressed
  by compressed-tensors, logits finite;
- ``gguf-py`` (GGUF rows, ``gguf_rows.py``): base and output read by gguf-py's
  ``GGUFReader``: every kept tensor's bytes as the base's, the recipe's keys as promised, and
  the metadata equal to gguf-py's own ``gguf-new-metadata`` where that tool makes the same edit;
- ``llama.cpp`` (GGUF rows, ``llama_cpp_rows.py``): the row's recipe applied to a tiny Llama
  converted by llama.cpp's ``convert_hf_to_gguf.py``, base and output loaded by llama.cpp's
  ``llama-simple`` (``LLAMA_CPP_BIN``; integration/build-llama-cpp.sh builds it): loads, same
  greedy tokens unless the recipe changes generation, metadata as llama.cpp's load log reports
  it; otherwise the cell says it was skipped.

``transformers_cell``, ``compressed_tensors_cell`` and ``gguf_rows.gguf_cell`` need no vLLM:
tests/test_consumer_matrix.py runs them in the test suite on the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_rows  # noqa: E402
from builtin_rows import BUILTIN_ROWS, builtin_row, show  # noqa: E402
from gguf_rows import GGUF_ROWS, NEW_TEMPLATE, gguf_cell, show_gguf  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "modelopt"


# -- producers -------------------------------------------------------------------------------

def _save_pretrained(kind: str, out: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                 max_position_embeddings=64, tie_word_embeddings=False)
    model = (LlamaForCausalLM(LlamaConfig(**small)) if kind == "llama"
             else Qwen3ForCausalLM(Qwen3Config(head_dim=16, **small)))
    with torch.no_grad():       # k's magnitude above q's and v's: the fused scale matters
        model.model.layers[0].self_attn.k_proj.weight[0, 0] = 0.5
    model.to(torch.bfloat16).save_pretrained(out)
    return out


def _rank_by_default(out: Path) -> Path:
    """The ModelOpt DeepSeek-V3 export with compressed-tensors' KV-scale spelling
    (``self_attn.k_scale``) and a config.json that leaves ``kv_lora_rank`` to the class
    default (512 in transformers' DeepseekV3Config): MLA to vLLM all the same."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(FIXTURES / "deepseek-v3-nvfp4", out)
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    tensors = load_file(out / "model.safetensors")
    renamed = {n.replace(".k_proj.k_scale", ".k_scale").replace(".v_proj.v_scale", ".v_scale"): t
               for n, t in tensors.items()}
    save_file({n: t.contiguous() for n, t in renamed.items()}, out / "model.safetensors",
              metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.pop("kv_lora_rank")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _modelopt(name: str, out: Path, exclude: list[str] | None = None) -> Path:
    shutil.copytree(FIXTURES / name, out)
    if exclude is not None:     # ModelOpt's wildcard excludes, in both places it writes them
        for file, key in (("hf_quant_config.json", ("quantization", "exclude_modules")),
                          ("config.json", ("quantization_config", "ignore"))):
            path = out / file
            doc = json.loads(path.read_text())
            doc[key[0]][key[1]] = exclude
            path.chmod(0o644)
            path.write_text(json.dumps(doc, indent=2))
    return out


#: (row name, recipe, producer)
ROWS = [
    ("nvfp4a16 / transformers Llama", "nvfp4a16", lambda d: _save_pretrained("llama", d)),
    ("nvfp4a16 / transformers Qwen3", "nvfp4a16", lambda d: _save_pretrained("qwen3", d)),
    ("modelopt-to-ct / ModelOpt Llama NVFP4", "modelopt-to-compressed-tensors",
     lambda d: _modelopt("llama-nvfp4", d)),
    ("modelopt-to-ct / ModelOpt Llama NVFP4, lm_head* excluded", "modelopt-to-compressed-tensors",
     lambda d: _modelopt("llama-nvfp4", d, ["lm_head*", "model.embed_tokens"])),
    ("modelopt-to-ct / ModelOpt DeepSeek-V3 NVFP4 (MLA)", "modelopt-to-compressed-tensors",
     lambda d: _modelopt("deepseek-v3-nvfp4", d)),
    ("kv-scale-names / ModelOpt Llama FP8", "kv-scale-names",
     lambda d: _modelopt("llama-fp8", d)),
    ("kv-scale-names / ModelOpt DeepSeek-V3 (MLA)", "kv-scale-names",
     lambda d: _modelopt("deepseek-v3-nvfp4", d)),
    ("kv-scale-names / DeepSeek-V3, self_attn.k_scale, kv_lora_rank left to its default",
     "kv-scale-names", _rank_by_default),
]


def apply_row(recipe: str, producer, work: Path, params: dict | None = None
              ) -> tuple[Path, Path]:
    """(base, output); the output is the base when the recipe has nothing to change."""
    from patcher import api
    from patcher.errors import NothingToChange

    base = producer(work / "base")
    try:
        return base, api.apply(recipe, base, out=work / "out", params=params).output
    except NothingToChange:
        return base, base


def gguf_row(row: tuple, work: Path) -> dict:
    """One GGUF row: applied, then its gguf-py and llama.cpp cells."""
    label, recipe, producer, params, expect, dropped = row
    base, out = apply_row(recipe, producer, work, params(work / "params"))
    return {"row": label, "recipe": "applied" if out != base else "nothing to change",
            "gguf": gguf_cell(base, out, expect, dropped, work / "reference"),
            "llama_cpp": llama_cpp_rows.cell(recipe, params(work / "llama-params"),
                                             NEW_TEMPLATE, work / "llama.cpp")}


# -- transformers and compressed-tensors ------------------------------------------------------

def _tensor_names(model: Path) -> dict[str, str]:
    from safetensors import safe_open

    names = {}
    for shard in sorted(model.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for name in f.keys():
                names[name] = f.get_slice(name).get_dtype()
    return names


def _load(model: Path, **kwargs) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        loaded, info = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16,
                                                            output_loading_info=True, **kwargs)
    except Exception as exc:        # a consumer refusing the model is a result
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        finite = bool(torch.isfinite(loaded.eval()(ids).logits).all())
    return {"missing": len(info["missing_keys"]), "unexpected": len(info["unexpected_keys"]),
            "mismatched": len(info["mismatched_keys"]), "finite_logits": finite,
            "unexpected_kv_scales": sum(k.endswith(("k_scale", "v_scale"))
                                        for k in info["unexpected_keys"])}


def transformers_cell(model: Path) -> dict:
    return _load(model)


def compressed_tensors_cell(model: Path) -> dict | None:
    """None when the output is not a compressed-tensors checkpoint."""
    from transformers import CompressedTensorsConfig

    config = json.loads((model / "config.json").read_text()).get("quantization_config") or {}
    if config.get("quant_method") != "compressed-tensors":
        return None
    return _load(model, quantization_config=CompressedTensorsConfig(dequantize=True))


def _show_load(cell: dict | None) -> str:
    if cell is None:
        return "n/a"
    if "base_error" in cell:
        return f"n/a: the base does not load either ({cell['base_error'][:60]})"
    if "error" in cell:
        return cell["error"]
    kv = f" ({cell['unexpected_kv_scales']} KV scales)" if cell["unexpected_kv_scales"] else ""
    ok = not cell["missing"] and not cell["mismatched"] and cell["finite_logits"]
    return (f"{'ok' if ok else 'FAIL'}: missing {cell['missing']}, unexpected "
            f"{cell['unexpected']}{kv}, logits {'finite' if cell['finite_logits'] else 'NaN/inf'}"
            + show(cell))


# -- vLLM ------------------------------------------------------------------------------------

def _vllm_class(config: dict):
    """The model class vLLM's registry names for the config's architecture."""
    from vllm.model_executor.models import ModelRegistry

    for arch in config["architectures"]:
        cls = ModelRegistry._try_load_model_cls(arch)
        if cls is not None:
            return cls
    raise LookupError(f"vLLM has no class for {config['architectures']}")


def vllm_cell(model: Path) -> dict:
    from safetensors import safe_open
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer
    from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name

    from patcher.model.mla import uses_mla

    out: dict = {}
    config = json.loads((model / "config.json").read_text())
    ours = uses_mla(config)
    try:
        engine = EngineArgs(model=str(model), skip_tokenizer_init=True,
                            enforce_eager=True).create_engine_config()
        out["quantization"] = engine.model_config.quantization
        mla = engine.model_config.use_mla       # vLLM's own decision (is_deepseek_mla)
        out["mla"] = (f"ok: {mla}" if mla == ours else
                      f"FAIL: vLLM {mla}, doctor/recipes (@model /mla) {ours}")
    except Exception as exc:
        out["quantization"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        mla = ours
    cls = _vllm_class(config)
    packed = dict(getattr(cls, "packed_modules_mapping", {}))
    if mla and config.get("q_lora_rank") is not None:       # DeepseekV2ForCausalLM.__init__
        packed["fused_qkv_a_proj"] = ["q_a_proj", "kv_a_proj_with_mqa"]
    names = _tensor_names(model)
    quant = config.get("quantization_config") or {}

    # ignore: each Linear kept in BF16 must be ignored, each quantized one not
    if quant.get("quant_method") == "compressed-tensors":
        wrong = []
        for name, dtype in names.items():
            if name.endswith((".weight", ".weight_packed")) and len(_shape(model, name)) == 2 \
                    and "embed_tokens" not in name:
                module = name.rsplit(".", 1)[0]
                quantized = name.endswith(".weight_packed")
                if should_ignore_layer(module, quant.get("ignore", []), packed) == quantized:
                    wrong.append(module)
        out["ignore"] = "ok" if not wrong else f"FAIL: {len(wrong)} wrong, e.g. {wrong[0]}"

    # fused layers: one global scale per group
    scales = {n: n for n in names if n.endswith(".weight_global_scale")}
    if scales:
        bad = 0
        for fused, members in packed.items():
            parents = {n.rsplit(".", 2)[0] for n in scales if n.rsplit(".", 2)[1] in members}
            for parent in parents:
                values = set()
                for m in members:
                    key = f"{parent}.{m}.weight_global_scale"
                    if key in names:
                        with safe_open(_shard_of(model, key), "pt") as f:
                            values.add(float(f.get_tensor(key).float().reshape(-1)[0]))
                bad += len(values) > 1
        out["fused_scales"] = "ok" if not bad else f"FAIL: {bad} fused layers with several"

    # KV-cache scales through vLLM's own remap
    layers = config.get("num_hidden_layers", 0)
    attn = "mla_attn.mla_attn" if mla else "attn"
    params = {f"model.layers.{i}.self_attn.{attn}.{w}_scale"
              for i in range(layers) for w in ("k", "v")}
    kv = [n for n in names if n.endswith(("k_scale", "v_scale"))]
    if kv:
        loaded = {maybe_remap_kv_scale_name(n, dict.fromkeys(params)) for n in kv}
        missed = params - loaded
        out["kv_scales"] = (f"ok: {len(kv)} loaded into {attn}" if not missed
                            else f"FAIL: {len(missed)} of {len(params)} not loaded")
    return out


def _shape(model: Path, name: str) -> list[int]:
    from safetensors import safe_open

    with safe_open(_shard_of(model, name), "pt") as f:
        return f.get_slice(name).get_shape()


def _shard_of(model: Path, name: str) -> Path:
    from safetensors import safe_open

    for shard in sorted(model.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            if name in f.keys():
                return shard
    raise KeyError(name)


def _show_vllm(cell: dict | None) -> str:
    if cell is None:
        return "skipped (no vllm)"
    return "; ".join(f"{k} {v}" for k, v in cell.items())


# -- the table -------------------------------------------------------------------------------

def run(work: Path, with_vllm: bool) -> list[dict]:
    rows = []
    for index, (label, recipe, producer) in enumerate(ROWS):
        base, out = apply_row(recipe, producer, work / str(index))
        loaded = transformers_cell(out)
        if "error" in loaded and out != base and "error" in transformers_cell(base):
            loaded = {"base_error": loaded["error"]}     # not the recipe's doing
        elif "error" in loaded and out == base:
            loaded = {"base_error": loaded["error"]}
        row = {"row": label, "recipe": "applied" if out != base else "nothing to change",
               "transformers": loaded,
               "compressed_tensors": compressed_tensors_cell(out),
               "vllm": vllm_cell(out) if with_vllm else None,
               "llama_cpp": "n/a (no GGUF output)"}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    for index, spec in enumerate(BUILTIN_ROWS):
        row = builtin_row(spec, work / f"builtin-{index}", transformers_cell,
                          compressed_tensors_cell)
        out = Path(row.pop("output"))
        row.update(vllm=vllm_cell(out) if with_vllm else None, llama_cpp="n/a (no GGUF output)")
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    for index, spec in enumerate(GGUF_ROWS):
        row = gguf_row(spec, work / f"gguf-{index}")
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ["recipe / producer", "vLLM", "transformers", "compressed-tensors", "gguf-py",
            "llama.cpp (recipe on convert_hf_to_gguf.py's Llama; llama-simple)"]
    body = [[r["row"], _show_vllm(r["vllm"]), _show_load(r["transformers"]),
             _show_load(r["compressed_tensors"]), "n/a", r["llama_cpp"]] if "gguf" not in r
            else [r["row"], "n/a", "n/a", "n/a", show_gguf(r["gguf"]),
                  llama_cpp_rows.show(r["llama_cpp"])]
            for r in rows]
    return "\n".join(" | ".join(line) for line in [head, ["---"] * len(head), *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="an empty or new directory")
    parser.add_argument("--no-vllm", action="store_true", help="leave the vLLM column out")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")     # before vLLM is imported
    os.environ.setdefault("HF_HUB_OFFLINE", "1")           # local directories only
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sys.path.insert(0, str(REPO))
    if llama_cpp_rows.tools() is None:
        print("llama.cpp: LLAMA_CPP_BIN names no llama-simple; its column is skipped "
              "(integration/build-llama-cpp.sh builds it)", flush=True)
    rows = run(args.work, with_vllm=not args.no_vllm)
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    bad = [r for r in rows if "FAIL" in table([r]) or '"error"' in json.dumps(r)
           or "error:" in json.dumps(r.get("vllm"))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
