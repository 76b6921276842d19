"""Check sm120-fp16-kv against vLLM's own engine configuration, on a CPU-only machine.

For every example (examples/generate.py) in every FP8-KV spelling it can carry
(examples/kv_spellings.py), this builds the model directory, asks vLLM what it makes of it, applies
the recipe, and asks again. vLLM is asked exactly as a server start asks:

    EngineArgs(model=DIR, kv_cache_dtype="auto", skip_tokenizer_init=True,
               enforce_eager=True).create_engine_config()

with VLLM_TARGET_DEVICE=cpu; the table shows the resolved ``cache_config.cache_dtype``, the
quantization method and the KV-cache algorithm of vLLM's quantization config, or the error vLLM
raised. A row passes when, after the recipe, vLLM accepts the model and resolves no FP8 (or other
quantized) KV cache; a variant declaring no FP8 KV cache must be refused by the recipe's guard.
Exit status 0 when every row passes, 1 otherwise.

Run it through integration/run-vllm.sh (it needs vllm, which this project does not depend on).
``--patcher-src DIR`` imports modelpatch from another source tree (for example the code and
recipes of an older commit, ``git archive``'d), to reproduce what an older recipe did.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")          # local directories only, no hub lookups
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from examples import generate, kv_spellings  # noqa: E402  (the project's own example builders)


def vllm_view(model: Path) -> dict:
    """What vLLM's engine configuration resolves for ``model``."""
    from vllm.engine.arg_utils import EngineArgs

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            cfg = EngineArgs(model=str(model), kv_cache_dtype="auto", skip_tokenizer_init=True,
                             enforce_eager=True).create_engine_config()
    except Exception as exc:  # vLLM refusing the model is a result, not a crash of this script
        return {"error": _reason(exc)}
    quant = cfg.quant_config
    kv = None
    if quant is not None:
        kv = getattr(quant, "kv_cache_quant_algo", None) or getattr(quant, "kv_cache_scheme", None)
    return {"cache_dtype": cfg.cache_config.cache_dtype,
            "quantization": cfg.model_config.quantization, "quant_kv": kv}


def _reason(exc: Exception) -> str:
    """One line: pydantic's ValidationError carries the real reason after "Value error, "."""
    text = str(exc)
    if "Value error, " in text:
        text = text.split("Value error, ", 1)[1]
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}"


def apply_recipe(recipe: str, model: Path, out: Path) -> tuple[str, Path | None]:
    """("applied" | "refused: ..." | "error: ...", the variant or None)."""
    from patcher import api
    from patcher.errors import GuardRefused, PatchError

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        api.apply(recipe, model, out=out)
    except GuardRefused:
        return "refused by its guard", None
    except PatchError as exc:
        return f"error: {exc.one_line()[:90]}", None
    return "applied", out


def _show(view: dict | None) -> str:
    if view is None:
        return "-"
    if "error" in view:
        return view["error"].split(" [type=")[0]    # pydantic's trailer repeats the input
    kv = json.dumps(view["quant_kv"]) if isinstance(view["quant_kv"], dict) else view["quant_kv"]
    return f"{view['cache_dtype']} ({view['quantization'] or 'no quant'}, kv={kv})"


def _declares_kv(view: dict) -> bool:
    return "error" not in view and (view["cache_dtype"] != "auto" or view["quant_kv"] is not None)


def verdict(before: dict, status: str, after: dict | None) -> str:
    if status.startswith("refused"):
        # Refusing is right only for a model on which vLLM sees no KV quantization either.
        return "ok (nothing to do)" if not _declares_kv(before) else "FAIL: refused"
    if after is None:
        return "FAIL: recipe error"
    if "error" in after:
        return "FAIL: vLLM refuses"
    return "FAIL: still quantized KV" if _declares_kv(after) else "ok"


def run(recipe: str, work: Path, only: list[str] | None) -> list[dict]:
    examples = generate.make_all(work / "examples", only)
    rows = []
    for name, example in examples.items():
        for spelling in kv_spellings.applicable(example):
            variant = kv_spellings.make_variant(example, work / "before" / name / spelling,
                                                spelling)
            before = vllm_view(variant)
            status, patched = apply_recipe(recipe, variant, work / "after" / name / spelling)
            after = vllm_view(patched) if patched is not None else None
            row = {"example": name, "spelling": spelling, "before": before, "recipe": status,
                   "after": after, "verdict": verdict(before, status, after)}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ["example", "spelling", "vLLM before", "recipe", "vLLM after", "verdict"]
    body = [[r["example"], r["spelling"], _show(r["before"]), r["recipe"], _show(r["after"]),
             r["verdict"]] for r in rows]
    widths = [max(len(str(line[i])) for line in [head, *body]) for i in range(len(head))]
    fmt = " | ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), "-+-".join("-" * w for w in widths),
                      *(fmt.format(*line) for line in body)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True,
                        help="an empty or new directory for the examples and variants")
    parser.add_argument("--recipe", default="sm120-fp16-kv",
                        help="recipe path or built-in name (default: sm120-fp16-kv)")
    parser.add_argument("--only", nargs="+", choices=list(generate.BUILDERS), metavar="NAME",
                        help="examples to check (default: all)")
    parser.add_argument("--patcher-src", type=Path, default=None,
                        help="import modelpatch (and its built-in recipes) from this tree")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.patcher_src is not None:
        sys.path.insert(0, str(args.patcher_src.resolve()))
    if args.work.exists() and any(args.work.iterdir()):
        parser.error(f"{args.work} is not empty")
    logging.getLogger("modelpatch").setLevel(logging.ERROR)
    import vllm

    import patcher
    print(f"vllm {vllm.__version__}; modelpatch from {Path(patcher.__file__).parent}; "
          f"recipe {args.recipe}", flush=True)
    rows = run(args.recipe, args.work, args.only)
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["verdict"].startswith("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
