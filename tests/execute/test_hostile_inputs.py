"""Hostile inputs: models, recipes and manifests built to break modelpatch. Each kind is a test
that builds the input and checks for one clear ``modelpatch: error:`` line with the documented
exit code (2 bad input, 1 verification mismatch), no traceback, no hang (a deadline in process,
a subprocess timeout for the kinds that could block), and nothing written: no output, no
staging directory or lock file beside it, the input tree unchanged (bytes, modes, inodes).

Reader-level defects (every header and index defect, one by one, through ``inspect``) are
covered in tests/model/test_model_dir.py; here a selection goes end to end through ``apply``, which
must refuse them before writing anything.

| #  | kind                                    | command         | expected                     |
|----|-----------------------------------------|-----------------|------------------------------|
| 1  | truncated shard                         | apply           | exit 2, names file + tensor  |
| 2  | header-length bomb (2^64-1)             | apply (subproc) | exit 2 "absurd", no alloc    |
| 3  | header length past EOF (2^40)           | apply           | exit 2                       |
| 4  | overlapping offsets                     | apply           | exit 2 "overlap"             |
| 5  | out-of-range offsets (2^40)             | apply           | exit 2 "run past"            |
| 6  | gapped offsets                          | apply           | exit 2 "gap"                 |
| 7  | negative shape                          | apply           | exit 2                       |
| 8  | overflowing shape [2^62, 2^62]          | apply + peak    | exit 2, small peak memory    |
| 9  | unknown dtype                           | apply           | exit 2                       |
| 10 | header not UTF-8                        | apply           | exit 2                       |
| 11 | header JSON nested 100k deep            | apply           | exit 2                       |
| 12 | duplicate tensor key in a header        | apply           | exit 2                       |
| 13 | bad __metadata__ (not str -> str)       | apply           | exit 2                       |
| 14 | config.json not UTF-8                   | apply           | exit 2                       |
| 15 | config.json duplicate key               | apply           | exit 2                       |
| 16 | index duplicate key                     | apply           | exit 2                       |
| 17 | index names a missing file              | apply           | exit 2                       |
| 18 | index names a missing tensor            | apply           | exit 2                       |
| 19 | a tensor in two shards                  | apply           | exit 2                       |
| 20 | symlink escaping the model directory    | apply           | exit 2                       |
| 21 | shard that is a FIFO                    | apply (subproc) | exit 2, no hang              |
| 22 | directory named *.safetensors           | apply           | exit 2                       |
| 23 | tensor names with '/', '..', absolute   | apply (drop)    | succeeds; names kept, no path|
| 24 | 200k tiny tensors in one header         | inspect(subproc)| finishes in a few seconds    |
| 25 | recipe config: file name with '..'      | apply           | exit 2 at recipe line        |
| 26 | recipe config: absolute file name       | apply           | exit 2                       |
| 27 | recipe files: add '..'                  | apply           | exit 2                       |
| 28 | recipe files: add absolute path         | apply           | exit 2                       |
| 29 | recipe files: drop '../x'               | apply           | exit 2                       |
| 30 | recipe requires: file '../x'            | apply           | exit 2, outside never read   |
| 31 | recipe files: reserved names            | apply           | exit 2                       |
| 32 | YAML alias bomb (billion laughs)        | apply (subproc) | exit 2, fast                 |
| 33 | recipe over 1 MiB                       | apply (subproc) | exit 2, fast, not parsed     |
| 34 | recipe nested 100k deep (< 1 MiB)       | apply (subproc) | exit 2, fast                 |
| 35 | recipe name with path characters       | apply           | exit 2                       |
| 36 | drop of a missing path (missing_ok off) | apply           | exit 2 at recipe line        |
| 37 | JSON Patch remove/test on missing path  | apply           | exit 2                       |
| 38 | config rename of a missing key          | apply           | exit 2                       |
| 39 | config rename onto an existing key      | apply           | exit 2                       |
| 40 | tensor rename collision                 | apply           | exit 2                       |
| 41 | tensor selection matching nothing       | apply           | exit 2                       |
| 42 | catastrophic regex (ReDoS)              | apply (subproc) | exit 2 at load, fast         |
| 43 | add file with huge content (> 1 MiB)    | apply           | exit 2 (size cap)            |
| 44 | add over an existing file               | apply           | exit 2 (overwrite: false)    |
| 45 | manifest with a tampered digest         | verify/publish/revert/revert -o | exit 1 |
| 46 | manifest path '../x'                    | verify (subproc)| exit 2, outside not read     |
| 47 | manifest absolute path                  | verify (subproc)| exit 2, outside not read     |
| 48 | manifest not JSON                       | verify          | exit 2                       |
| 49 | manifest huge (sparse 300 MiB)          | verify          | exit 2, not read into memory |
| 50 | manifest that is a FIFO                 | verify (subproc)| exit 2, no hang              |
| 51 | manifest JSON nested 100k deep          | verify          | exit 2                       |
| 52 | config.json that is a FIFO              | apply (subproc) | exit 2, no hang              |
| 53 | crafted journal.json: '..' or absolute | verify          | exit 2, outside untouched    |
| 54 | crafted journal through a symlinked dir | verify          | refused, outside untouched   |
| 55 | -o inside the base                      | apply           | exit 2                       |
| 56 | -o PARENT --force (contains the base)   | apply           | exit 2, parent untouched     |

ReDoS policy (kind 42): Python's ``re`` has no timeout, so the recipe loader refuses regexes
that can backtrack exponentially: a repeat (``*``, ``+``, ``{m,n}`` with n > 1) around a
pattern that itself holds an unbounded repeat (``(a+)+``, ``(.*a){20}``), or around an
alternation whose branches can start alike (``(a|aa)+``, ``(ab|a)*``). Possessive and atomic
forms are allowed. The error names the recipe line. Polynomial patterns (``.*a.*b``) remain
allowed: they are bounded by the length of tensor names. Shapes the check does not recognize
(``.*.*...Z``, ``^(?:.{0,40}){0,40}Z``, ``(?:\\w?){40}\\w{40}Z``) meet a CPU-time bound per tensor
name at plan time (``patcher.recipe.regex_bound``): exit 2 naming the line and the tensor.
"""

from __future__ import annotations

import json
import os
import struct
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner
from fault_helpers import error_line, leftovers, run_cli, tree_state
from hostile_helpers import (
    INDEX,
    MANIFEST,
    RECIPE_HEAD,
    S1,
    S2,
    SHARDS,
    Untouched,
    invoke,
    make_model,
    refuse_apply,
    tensors_bytes,
    write_recipe,
)
from model_helpers import entry, st_bytes

from patcher import api
from patcher.cli import main
from patcher.errors import RecipeError

# --------------------------------------------------------------------------- model directories


def test_valid_model_applies(tmp_path):
    """The builders make a model that works: the refusals below are the defects' doing."""
    model = make_model(tmp_path / "m")
    r = CliRunner().invoke(main, ["apply", "sm120-fp16-kv", str(model), "-o",
                                  str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert api.verify(tmp_path / "out").ok


def test_truncated_shard(tmp_path):
    data = tensors_bytes(SHARDS[S2])
    model = make_model(tmp_path / "m", raw_shards={S2: data[:-10]})
    refuse_apply(model, tmp_path, S2, "lm_head.weight", "truncated")


def test_header_length_bomb(tmp_path):
    bomb = struct.pack("<Q", 2**64 - 1) + b"{}" * 8
    model = make_model(tmp_path / "m", raw_shards={S1: bomb})
    refuse_apply(model, tmp_path, S1, "absurd", subprocess_=True)


def test_header_length_past_end_of_file(tmp_path):
    model = make_model(tmp_path / "m", raw_shards={S1: struct.pack("<Q", 2**40) + b"{}"})
    refuse_apply(model, tmp_path, S1)


def test_overlapping_offsets(tmp_path):
    data = st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, 12)
    model = make_model(tmp_path / "m", shards={S1: {"a": ("F32", [2], 8), "b": ("F32", [2], 8)}},
                       raw_shards={S1: data})
    refuse_apply(model, tmp_path, "overlap")


def test_out_of_range_offsets(tmp_path):
    data = st_bytes({"w": entry("U8", [8], 1 << 40, (1 << 40) + 8)}, 8)
    model = make_model(tmp_path / "m", shards={S1: {"w": ("U8", [8], 8)}}, raw_shards={S1: data})
    refuse_apply(model, tmp_path, "run past")


def test_gapped_offsets(tmp_path):
    data = st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, 20)
    model = make_model(tmp_path / "m", shards={S1: {"a": ("F32", [2], 8), "b": ("F32", [2], 8)}},
                       raw_shards={S1: data})
    refuse_apply(model, tmp_path, "gap of 4 bytes")


def test_negative_shape(tmp_path):
    data = st_bytes({"w": entry("F32", [-2, 4], 0, 0)})
    model = make_model(tmp_path / "m", shards={S1: {"w": ("F32", [0], 0)}}, raw_shards={S1: data})
    refuse_apply(model, tmp_path, "negative dimension")


def test_overflowing_shape_allocates_nothing_of_its_size(tmp_path):
    """[2^62, 2^62] x F32 claims 2^126 bytes; an int64 product would wrap to 0."""
    huge = 2**62 * 2**62 * 4
    for offsets in ([0, 0], [0, huge]):
        data = st_bytes({"w": entry("F32", [2**62, 2**62], *offsets)})
        model = make_model(tmp_path / f"m{offsets[1] > 0:d}", shards={S1: {"w": ("F32", [0], 0)}},
                           raw_shards={S1: data})
        tracemalloc.start()
        try:
            refuse_apply(model, tmp_path, "w")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20, peak


def test_unknown_dtype(tmp_path):
    data = st_bytes({"w": entry("F128", [2], 0, 32)}, 32)
    model = make_model(tmp_path / "m", shards={S1: {"w": ("U8", [32], 32)}}, raw_shards={S1: data})
    refuse_apply(model, tmp_path, "unknown dtype 'F128'")


def test_header_not_utf8(tmp_path):
    model = make_model(tmp_path / "m", raw_shards={S1: st_bytes(b'{"w\xff": {}}')})
    refuse_apply(model, tmp_path, "not UTF-8")


def test_header_json_nested_deeply(tmp_path):
    nested = b'{"w": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    model = make_model(tmp_path / "m", raw_shards={S1: st_bytes(nested)})
    refuse_apply(model, tmp_path, S1)


def test_duplicate_tensor_key_in_header(tmp_path):
    one = json.dumps(entry("F32", [2], 0, 8)).encode()
    data = st_bytes(b'{"w": %s, "w": %s}' % (one, one), 8)
    model = make_model(tmp_path / "m", shards={S1: {"w": ("F32", [2], 8)}}, raw_shards={S1: data})
    refuse_apply(model, tmp_path, "duplicate key 'w'")


def test_bad_metadata(tmp_path):
    data = st_bytes({"__metadata__": {"format": ["pt"]}, "w": entry("F32", [2], 0, 8)}, 8)
    model = make_model(tmp_path / "m", shards={S1: {"w": ("F32", [2], 8)}}, raw_shards={S1: data})
    refuse_apply(model, tmp_path, "__metadata__")


def test_config_not_utf8(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "config.json").write_bytes(b'{"model_type": "caf\xe9"}')
    refuse_apply(model, tmp_path, "config.json", "UTF-8")


def test_config_duplicate_key(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "config.json").write_text('{"quantization_config": {}, "quantization_config": {}}')
    refuse_apply(model, tmp_path, "config.json", "duplicate key 'quantization_config'")


def test_index_duplicate_key(tmp_path):
    model = make_model(tmp_path / "m")
    (model / INDEX).write_text('{"weight_map": {"lm_head.weight": "%s", "lm_head.weight": "%s"}}'
                               % (S2, S2))
    refuse_apply(model, tmp_path, INDEX, "duplicate key")


def test_index_names_a_missing_file(tmp_path):
    wm = {n: s for s, ts in SHARDS.items() for n in ts} | {"extra": "model-00003.safetensors"}
    model = make_model(tmp_path / "m", weight_map=wm)
    refuse_apply(model, tmp_path, "model-00003.safetensors", "does not exist")


def test_index_names_a_missing_tensor(tmp_path):
    wm = {n: s for s, ts in SHARDS.items() for n in ts} | {"model.norm.weight": S1}
    model = make_model(tmp_path / "m", weight_map=wm)
    refuse_apply(model, tmp_path, "model.norm.weight", "no such tensor")


def test_tensor_in_two_shards(tmp_path):
    shards = {S1: dict(SHARDS[S1]), S2: dict(SHARDS[S2])}
    shards[S2]["model.embed_tokens.weight"] = ("BF16", [8, 4], 64)
    wm = {n: s for s, ts in SHARDS.items() for n in ts}
    model = make_model(tmp_path / "m", shards=shards, weight_map=wm)
    refuse_apply(model, tmp_path, "model.embed_tokens.weight", "present in both")


def test_symlink_escaping_the_model(tmp_path):
    model = make_model(tmp_path / "m")
    (tmp_path / "outside.json").write_text("{}")
    os.symlink("../outside.json", model / "generation_config.json")
    refuse_apply(model, tmp_path, "escapes the model directory")


def test_shard_that_is_a_fifo(tmp_path):
    model = make_model(tmp_path / "m")
    (model / S2).unlink()
    os.mkfifo(model / S2)
    refuse_apply(model, tmp_path, S2, "not a regular file", subprocess_=True, timeout=30)


def test_config_that_is_a_fifo(tmp_path):
    model = make_model(tmp_path / "m")
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    refuse_apply(model, tmp_path, "config.json", subprocess_=True, timeout=30)


def test_directory_named_like_a_shard(tmp_path):
    model = make_model(tmp_path / "m")
    (model / S2).unlink()
    (model / S2).mkdir()
    (model / S2 / "x").write_text("x")
    refuse_apply(model, tmp_path, S2)


def test_tensor_names_are_not_paths(tmp_path):
    """Names with '/', '..' and a leading '/' are plain names: dropping, renaming and copying
    them writes nothing outside the output and keeps the names byte for byte."""
    odd = {"../../escape.k_scale": ("F32", [], 4), "/etc/passwd.k_scale": ("F32", [], 4),
           "a/b/../c.weight": ("BF16", [2], 4), "..": ("F32", [1], 4),
           "model/../../x.weight": ("BF16", [2], 4)}
    model = make_model(tmp_path / "deep" / "m", shards={S1: dict(SHARDS[S1]), S2: odd},
                       config={"model_type": "test"})
    recipe = write_recipe(tmp_path / "r.yaml", """tensors:
  - select: {glob: "*.k_scale"}
    drop: true
  - select: {regex: '^model/'}
    rename: {pattern: '^model/\\.\\./', to: '../../../../'}
""")
    before_outside = sorted(p.name for p in (tmp_path / "deep").iterdir())
    out = tmp_path / "deep" / "out"
    with Untouched(model):
        r = CliRunner().invoke(main, ["apply", str(recipe), str(model), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == sorted(before_outside
                                                                           + ["out"])
    assert not (tmp_path / "escape.k_scale").exists() and not (tmp_path / "x.weight").exists()
    from patcher.model.safetensors_io import read_header

    names = set(read_header(out / S2).tensors)
    assert names == {"a/b/../c.weight", "..", "../../../../../x.weight"}
    assert api.verify(out).ok


def test_many_tiny_tensors_are_inspected(tmp_path):
    """200k zero-sized tensors in one header (about 12 MB of JSON): inspect reads them (the
    timeout only guards against a hang; speed is benchmarks/' business)."""
    header = {f"model.layers.{i // 1000}.experts.{i % 1000}.w": entry("F32", [0], 0, 0)
              for i in range(200_000)}
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(st_bytes(header))
    (model / "config.json").write_text("{}")
    r = run_cli("inspect", model, "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tensors"]["totals"]["tensors"] == 200_000


# --------------------------------------------------------------------------- recipes


@pytest.mark.parametrize("body, needle", [
    ("config:\n  ../config.json:\n    - drop: /x\n", "'..'"),
    ("config:\n  /etc/config.json:\n    - drop: /x\n", "absolute"),
    ("files:\n  - add: ../evil.txt\n    content: x\n", "'..'"),
    ("files:\n  - add: /tmp/evil.txt\n    content: x\n", "absolute"),
    ("files:\n  - drop: ../config.json\n", "'..'"),
    ("requires:\n  - {file: ../outside.json, path: /a, exists: true}\n", "'..'"),
    ("files:\n  - add: modelpatch.provenance.json\n    content: x\n", "reserved"),
    ("files:\n  - add: .modelpatch/x\n    content: x\n", "reserved"),
], ids=["config-dotdot", "config-absolute", "add-dotdot", "add-absolute", "drop-dotdot",
        "requires-dotdot", "add-manifest", "add-state-dir"])
def test_recipe_file_names_outside_the_model(tmp_path, body, needle):
    model = make_model(tmp_path / "m")
    (tmp_path / "outside.json").write_text('{"a": 1}')
    recipe = write_recipe(tmp_path / "r" / "r.yaml", body)
    line = refuse_apply(model, tmp_path, needle, recipe=recipe)
    assert "r.yaml:" in line            # names the recipe line


def test_yaml_alias_bomb(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    recipe = write_recipe(tmp_path / "r" / "bomb.yaml", "\n".join(lines) + "\n")
    refuse_apply(make_model(tmp_path / "m"), tmp_path, "bomb.yaml:", "not allowed",
                 recipe=recipe, subprocess_=True, timeout=60)     # a hang guard, not a speed test


def test_huge_recipe_is_refused_unread(tmp_path):
    recipe = tmp_path / "r" / "huge.yaml"
    recipe.parent.mkdir()
    with open(recipe, "wb") as f:         # sparse: 4 GiB claimed, nothing to read in time
        f.truncate(4 << 30)
    refuse_apply(make_model(tmp_path / "m"), tmp_path, "limit", recipe=recipe, subprocess_=True,
                 watch_recipe=False, timeout=60)   # (hashing 4 GiB of holes proves nothing)


def test_deeply_nested_recipe(tmp_path):
    recipe = write_recipe(tmp_path / "r" / "deep.yaml", "x: " + "[" * 200_000 + "]" * 200_000
                          + "\n")
    assert recipe.stat().st_size < 1 << 20
    refuse_apply(make_model(tmp_path / "m"), tmp_path, "deep.yaml:", recipe=recipe,
                 subprocess_=True, timeout=30)


def test_recipe_name_with_path_characters(tmp_path):
    recipe = write_recipe(tmp_path / "r" / "r.yaml", "", head="modelpatch: 1\nname: ../../evil\n"
                          "description: x\n")
    with Untouched(tmp_path / "r"):
        invoke("apply", recipe, make_model(tmp_path / "m"), code=2, needles=("recipe name",))
    assert not (tmp_path / "evil").exists() and not (tmp_path / "m-..").exists()


@pytest.mark.parametrize("body, needles", [
    ("config:\n  config.json:\n    - drop: /quantization_config/nope\n      missing_ok: false\n",
     ["r.yaml:", "/quantization_config/nope"]),
    ("config:\n  config.json:\n    - {op: remove, path: /nope}\n", ["r.yaml:", "/nope"]),
    ("config:\n  config.json:\n    - {op: test, path: /model_type, value: llama}\n",
     ["r.yaml:", "/model_type"]),
    ("config:\n  config.json:\n    - {op: replace, path: /a/b/c, value: 1}\n", ["r.yaml:"]),
    ("config:\n  config.json:\n    - rename: /nope\n      to: /other\n", ["r.yaml:", "/nope"]),
    ("config:\n  missing.json:\n    - drop: /x\n      missing_ok: false\n", ["missing.json"]),
    ("config:\n  config.json:\n    - rename: /model_type\n      to: /architectures\n",
     ["r.yaml:", "/architectures"]),
    ("tensors:\n  - select: {glob: '*.weight'}\n    rename: {pattern: '.*', to: 'same'}\n",
     ["r.yaml:", "same"]),
    ("tensors:\n  - select: {regex: 'k_proj\\.weight$'}\n"
     "    rename: {pattern: 'k_proj', to: 'v_proj'}\n", ["r.yaml:", "v_proj"]),
    ("tensors:\n  - select: {glob: '*.no_such_tensor'}\n    drop: true\n",
     ["r.yaml:", "matches no"]),
    ("files:\n  - add: config.json\n    content: '{}'\n", ["r.yaml:", "config.json"]),
], ids=["drop-missing", "patch-remove-missing", "patch-test-fails", "patch-replace-missing",
        "rename-missing", "missing-config-file", "config-rename-collision",
        "tensor-rename-many-to-one", "tensor-rename-onto-existing", "select-matches-nothing",
        "add-over-existing"])
def test_recipe_ops_that_cannot_apply(tmp_path, body, needles):
    recipe = write_recipe(tmp_path / "r" / "r.yaml", body)
    refuse_apply(make_model(tmp_path / "m"), tmp_path, *needles, recipe=recipe)


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"^(\w+\s?)*$", r"(.*a){20}", r"(a|ab)+c",
                                     r"(a|aa)+b", r"((ab)*)+b", r"(a*)*b", r"(x+x+)+y"])
def test_catastrophic_regex_is_refused_at_load(tmp_path, pattern):
    recipe = write_recipe(tmp_path / "r" / "r.yaml", "tensors:\n  - select: {regex: '%s'}\n"
                          "    drop: true\n" % pattern)
    # A model whose names make those patterns backtrack for ages.
    names = {"a" * 60 + "!": ("F32", [], 4), "ab" * 30 + "!": ("F32", [], 4),
             ("word " * 20) + "!": ("F32", [], 4), "1" * 60: ("F32", [], 4),
             "x" * 60: ("F32", [], 4)}
    model = make_model(tmp_path / "m", shards={S1: names}, config={"model_type": "t"})
    refuse_apply(model, tmp_path, "r.yaml:", "backtrack", recipe=recipe, timeout=60,
                 subprocess_=pattern == r"(a+)+$")       # one through a real process


LONG_NAME = "model." + "x" * 90 + ".weight"


@pytest.mark.parametrize("select, op", [
    ("{regex: '%s'}" % (".*" * 20 + "Z"), "drop: true"),
    (r"{regex: '^(?:.{0,40}){0,40}Z'}", "drop: true"),
    (r"{regex: '(?:\w?){40}\w{40}Z'}", "drop: true"),
    ("{glob: '*'}", r"rename: {pattern: '(?:\w?){40}\w{40}Z', to: y}"),
], ids=["dot-star-chain", "bounded-nest", "optional-chain", "rename"])
def test_regexes_the_load_check_misses_are_stopped_by_a_time_bound(tmp_path, monkeypatch,
                                                                    select, op):
    """Backtracking shapes the loader does not recognize run under a CPU-time bound per tensor
    name: exit 2 naming the pattern's line and the tensor, instead of a plan that never ends."""
    from patcher.recipe import regex_bound

    monkeypatch.setattr(regex_bound, "MATCH_CPU_SECONDS", 0.2)
    shards = {"model.safetensors": {LONG_NAME: ("BF16", [4], 8),
                                    "lm_head.weight": ("BF16", [4], 8)}}
    model = make_model(tmp_path / "m", shards=shards, config={"architectures": ["X"]})
    recipe = write_recipe(tmp_path / "r" / "r.yaml",
                          "tensors:\n  - select: %s\n    %s\n" % (select, op))
    line = refuse_apply(model, tmp_path, "r.yaml:5:5", "backtracks", LONG_NAME, recipe=recipe,
                        timeout=30)
    assert "Traceback" not in line


@pytest.mark.parametrize("pattern", [r"(^|\.)(k_proj\.k_scale|v_proj\.v_scale)$",
                                     r"^model\.layers\.\d+\.mlp\.experts\.\d+\.",
                                     r"(?:\w+\.)?weight$", r"^(a|b)c+$", r"(ab|cd)+",
                                     r"(a++)+", r"(?>a+)+b", r"[a-z]+_proj\.weight",
                                     r".*\.k_scale$", r"(k|v)_proj"])
def test_ordinary_regexes_still_load(pattern):
    from patcher.recipe.load import load_recipe

    load_recipe((RECIPE_HEAD + "tensors:\n  - select: {regex: '%s'}\n    drop: true\n"
                 % pattern).encode())


def test_regex_refusal_names_the_line():
    from patcher.recipe.load import load_recipe

    with pytest.raises(RecipeError) as info:
        load_recipe((RECIPE_HEAD + "tensors:\n  - select: {regex: '(a+)+'}\n    drop: true\n")
                    .encode(), source_name="r.yaml")
    assert info.value.where == "r.yaml:5:21", info.value.where


def test_add_with_huge_content(tmp_path):
    recipe = write_recipe(tmp_path / "r" / "r.yaml", "files:\n  - add: big.txt\n    content: '"
                          + "x" * (1 << 20) + "'\n")
    refuse_apply(make_model(tmp_path / "m"), tmp_path, "limit", recipe=recipe)


# --------------------------------------------------------------------------- manifests


@pytest.fixture
def variant(tmp_path) -> Path:
    model = make_model(tmp_path / "base")
    return api.apply("sm120-fp16-kv", model, out=tmp_path / "variant").output


def _edit_manifest(variant: Path, edit) -> None:
    path = variant / MANIFEST
    doc = json.loads(path.read_text())
    edit(doc)
    path.chmod(0o644)
    path.write_text(json.dumps(doc, indent=2))


def test_tampered_digest_fails_verify_publish_and_revert(variant, tmp_path):
    def tamper(doc):
        for s in doc["subject"]:
            if s["name"] == "config.json":
                s["digest"]["sha256"] = "0" * 64
    _edit_manifest(variant, tamper)
    with Untouched(variant):
        r = CliRunner().invoke(main, ["verify", str(variant)])
        assert r.exit_code == 1 and "config.json" in r.output and "Traceback" not in r.output
        invoke("publish", variant, "alice/x", "--endpoint", "http://127.0.0.1:9", code=1,
               needles=("does not verify",))
        invoke("revert", variant, "-o", tmp_path / "base-again", code=1,
               needles=("changed since the patch",))
    assert not (tmp_path / "base-again").exists() and leftovers(tmp_path / "base-again") == []


def test_tampered_digest_refuses_in_place_revert(tmp_path):
    model = make_model(tmp_path / "m")
    api.apply_in_place("sm120-fp16-kv", model)
    _edit_manifest(model, lambda doc: doc["subject"][0]["digest"].update(sha256="f" * 64))
    with Untouched(model):
        invoke("revert", model, code=1, needles=("changed since the patch",))


@pytest.mark.parametrize("name", ["../outside.bin", "/tmp/outside.bin", "a/../../outside.bin",
                                  "./config.json", "config.json/", "a\\..\\b"])
def test_manifest_paths_outside_the_directory(variant, tmp_path, name):
    """verify refuses the manifest without opening the named file: the outside path is a FIFO,
    which would block any reader."""
    fifo = tmp_path / "outside.bin"
    if not fifo.exists():
        os.mkfifo(fifo)
    target = str(fifo) if name.startswith("/") else name
    _edit_manifest(variant, lambda doc: doc["subject"].append(
        {"name": target, "digest": {"sha256": "0" * 64}, "annotations": {"size": 0}}))
    with Untouched(variant):
        if name in ("../outside.bin", "/tmp/outside.bin"):
            error_line(run_cli("verify", variant, timeout=30), 2, MANIFEST)
        else:
            invoke("verify", variant, code=2, needles=(MANIFEST,), seconds=30)


def test_manifest_not_json(variant):
    (variant / MANIFEST).chmod(0o644)
    (variant / MANIFEST).write_text('{"_type": ')
    with Untouched(variant):
        invoke("verify", variant, code=2, needles=(MANIFEST, "invalid JSON"))


def test_manifest_nested_deeply(variant):
    (variant / MANIFEST).chmod(0o644)
    (variant / MANIFEST).write_text("[" * 200_000 + "]" * 200_000)
    with Untouched(variant):
        invoke("verify", variant, code=2, needles=(MANIFEST,))


def test_huge_manifest_is_not_read_into_memory(variant):
    path = variant / MANIFEST
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.truncate(300 << 20)                   # sparse: 300 MiB of NULs
    with Untouched(variant):
        tracemalloc.start()
        try:
            invoke("verify", variant, code=2, needles=(MANIFEST, "larger than"))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 32 << 20, peak


def test_manifest_that_is_a_fifo(variant):
    (variant / MANIFEST).unlink()
    os.mkfifo(variant / MANIFEST)
    with Untouched(variant):
        error_line(run_cli("verify", variant, timeout=30), 2, MANIFEST)


# --------------------------------------------------------------------------- crafted state


def _journal(model: Path, *, bound: bool = True, **fields) -> None:
    """A crafted journal; ``bound``: bound to ``model`` as this machine's own (the path checks
    must hold even then), else as shipped with a downloaded directory."""
    from patcher.execute.journal import Journal

    Journal(op="apply", phase="switching", patch_dir=".modelpatch/patches/0001-x",
            staging=".modelpatch/staging-0001", trash=".modelpatch/trash-0001").create(model)
    path = model / ".modelpatch" / "journal.json"
    doc = json.loads(path.read_text())
    doc.update(fields)
    if not bound:
        doc["owner"]["ino"] += 1
    path.write_text(json.dumps(doc))


def test_foreign_journal_is_refused_not_replayed(tmp_path):
    """A directory that arrives with .modelpatch/journal.json (pulled, copied, unpacked) whose
    steps would swap config.json for a file of the attacker's: refused, nothing moved. Here the
    journal even carries the owner token file; only the device/inode binding differs."""
    model = make_model(tmp_path / "m")
    (model / ".modelpatch" / "staging-0001").mkdir(parents=True)
    (model / ".modelpatch" / "staging-0001" / "config.json").write_text('{"evil": true}')
    _journal(model, bound=False, steps=[["discard", "config.json"], ["install", "config.json"]])
    with Untouched(model):
        invoke("verify", model, code=2, needles=("not written in this directory",))


def test_journal_moved_to_another_directory_is_refused(tmp_path):
    model = make_model(tmp_path / "m")
    _journal(model, steps=[["discard", "config.json"]])
    copy = tmp_path / "copy"
    import shutil
    shutil.copytree(model, copy, symlinks=True)
    with Untouched(copy):
        invoke("verify", copy, code=2, needles=("not written in this directory",))


@pytest.mark.parametrize("fields", [
    {"steps": [["discard", "../victim.txt"]]},
    {"steps": [["discard", "/VICTIM"]]},
    {"phase": "preparing", "staging": "../victims"},
    {"phase": "preparing", "trash": "/VICTIMS"},
    {"patch_dir": "../victims", "remove_patch_dir": True},
], ids=["step-dotdot", "step-absolute", "staging-dotdot", "trash-absolute", "patch-dir-dotdot"])
def test_crafted_journal_cannot_touch_files_outside(tmp_path, fields):
    """A model directory shipped with a hostile .modelpatch/journal.json: the recovery every
    command runs first must not move or delete anything outside the directory."""
    model = make_model(tmp_path / "m")
    (tmp_path / "victim.txt").write_text("precious")
    (tmp_path / "victims").mkdir()
    (tmp_path / "victims" / "v.txt").write_text("precious")
    text = json.dumps(fields).replace("/VICTIMS", str(tmp_path / "victims")) \
        .replace("/VICTIM", str(tmp_path / "victim.txt"))
    _journal(model, **json.loads(text))
    before = {p: tree_state(p) for p in (tmp_path / "victims",)}
    invoke("verify", model, code=2, needles=("journal",))
    assert (tmp_path / "victim.txt").read_text() == "precious"
    assert {p: tree_state(p) for p in before} == before


def test_crafted_journal_through_a_symlinked_directory(tmp_path):
    """The step's path is inside the directory by name, but a symlinked directory component
    leads outside: the recovery must refuse it rather than move (and then delete) the file."""
    model = make_model(tmp_path / "m")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim.txt").write_text("precious")
    os.symlink("../outside", model / "evil")
    _journal(model, steps=[["discard", "evil/victim.txt"]])
    result = CliRunner().invoke(main, ["verify", str(model)])
    assert result.exit_code == 2 and "leads outside the directory" in result.stderr
    assert (tmp_path / "outside" / "victim.txt").read_text() == "precious"


# --------------------------------------------------------------------------- output placement


def test_output_inside_the_base(tmp_path):
    model = make_model(tmp_path / "m")
    with Untouched(model):
        invoke("apply", "sm120-fp16-kv", model, "-o", model / "sub" / "out", code=2,
               needles=("contain one another",))


def test_forced_output_containing_the_base(tmp_path):
    """``-o PARENT --force`` would replace the directory holding the base, base included."""
    parent = tmp_path / "parent"
    model = make_model(parent / "m")
    (parent / "other.txt").write_text("precious")
    with Untouched(parent):
        invoke("apply", "sm120-fp16-kv", model, "-o", parent, "--force", code=2,
               needles=("contain one another",))
