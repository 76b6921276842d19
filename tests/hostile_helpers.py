"""Hostile model directories and recipes, built for the tests that check modelpatch refuses
them (one ``modelpatch: error:`` line, the documented exit code, nothing written): shared by
tests/execute/test_hostile_inputs.py, test_untrusted_dirs.py and tests/recipe/."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

from click.testing import CliRunner
from fault_helpers import ERROR_PREFIX, error_line, leftovers, run_cli, tree_state
from model_helpers import entry, st_bytes

from patcher.cli import main

MANIFEST = "modelpatch.provenance.json"
INDEX = "model.safetensors.index.json"
S1 = "model-00001-of-00002.safetensors"
S2 = "model-00002-of-00002.safetensors"
KV_CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
             "quantization_config": {"quant_method": "modelopt",
                                     "kv_cache_scheme": {"num_bits": 8, "type": "float"}}}
RECIPE_HEAD = "modelpatch: 1\nname: hostile\ndescription: a recipe for the hostile-input tests\n"


# --------------------------------------------------------------------------- builders


def tensors_bytes(tensors: dict[str, tuple[str, list, int]]) -> bytes:
    """A valid shard: ``{name: (dtype, shape, nbytes)}`` laid out in order, zero data."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = entry(dtype, shape, offset, offset + nbytes)
        offset += nbytes
    return st_bytes(header, offset)


SHARDS = {
    S1: {"model.embed_tokens.weight": ("BF16", [8, 4], 64),
         "model.layers.0.self_attn.k_proj.weight": ("BF16", [4, 4], 32),
         "model.layers.0.self_attn.k_proj.k_scale": ("F32", [], 4)},
    S2: {"model.layers.0.self_attn.v_proj.weight": ("BF16", [4, 4], 32),
         "model.layers.0.self_attn.v_proj.v_scale": ("F32", [], 4),
         "lm_head.weight": ("BF16", [8, 4], 64)},
}


def make_model(root: Path, *, shards: dict | None = None, config: dict | None = None,
               raw_shards: dict[str, bytes] | None = None, weight_map: dict | None = None) -> Path:
    """A valid two-shard model with an FP8 KV-cache declaration (``sm120-fp16-kv`` applies);
    ``raw_shards`` replaces shard bytes after the index is written."""
    root.mkdir(parents=True)
    shards = SHARDS if shards is None else shards
    wm = {}
    for name, tensors in shards.items():
        (root / name).write_bytes(tensors_bytes(tensors))
        wm.update(dict.fromkeys(tensors, name))
    total = sum(n for ts in shards.values() for _, _, n in ts.values())
    (root / INDEX).write_text(json.dumps({"metadata": {"total_size": total},
                                          "weight_map": weight_map or wm}, indent=2))
    (root / "config.json").write_text(json.dumps(config or KV_CONFIG, indent=2))
    for name, data in (raw_shards or {}).items():
        (root / name).write_bytes(data)
    return root


def write_recipe(path: Path, body: str, head: str = RECIPE_HEAD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + body)
    return path


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise TimeoutError in this (main) thread if the block runs longer than ``seconds``."""
    def expired(_signum, _frame):
        raise TimeoutError(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def invoke(*args, code: int, needles=(), seconds: float = 20) -> str:
    """``modelpatch ARGS`` in process: exit ``code``, exactly one error line, no traceback."""
    with deadline(seconds):
        result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exc_info is not None and result.exc_info[0] is SystemExit, result.exc_info
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


class Untouched:
    """Context manager: the trees under ``paths`` are the same after the block, and ``out`` (if
    given) was never created, nothing left beside it."""

    def __init__(self, *paths: Path, out: Path | None = None):
        self.paths, self.out = paths, out

    def __enter__(self):
        self.before = [tree_state(p) for p in self.paths]
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            return False
        for path, before in zip(self.paths, self.before):
            assert tree_state(path) == before, f"{path} changed"
        if self.out is not None:
            assert not os.path.lexists(self.out), "an output appeared"
            assert leftovers(self.out) == [], leftovers(self.out)
        return False


def refuse_apply(model: Path, tmp_path: Path, *needles: str, recipe: str | Path = "sm120-fp16-kv",
                 code: int = 2, subprocess_: bool = False, timeout: float = 20,
                 watch_recipe: bool = True) -> str:
    """``apply RECIPE MODEL -o OUT`` is refused and writes nothing anywhere."""
    out = tmp_path / "out"
    watched = [model] + ([Path(recipe).parent] if isinstance(recipe, Path) and watch_recipe
                         else [])
    with Untouched(*watched, out=out):
        if subprocess_:
            line = error_line(run_cli("apply", recipe, model, "-o", out, timeout=timeout), code,
                              *needles)
        else:
            line = invoke("apply", recipe, model, "-o", out, code=code, needles=needles,
                          seconds=timeout)
    default = Path(f"{model}-hostile")
    assert not default.exists()
    return line
