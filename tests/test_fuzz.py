"""Fuzzing the parsers of untrusted input with hypothesis: the safetensors header reader
(``patcher.model.safetensors_io.read_header``), the recipe loader
(``patcher.recipe.load.load_recipe``), the doctor rule-file loader
(``patcher.doctor.rules.load_rule``), the GGUF header parser
(``patcher.gguf.format.parse_header``) and
the provenance manifest reader (``patcher.integrity.manifest.read_manifest``).

Properties, for every generated input:
- the only exceptions are modelpatch's own (``PatchError`` subclasses): no ValueError, KeyError,
  TypeError, RecursionError, UnicodeError, OverflowError, MemoryError...;
- what is accepted is consistent (a header's tensors tile its data section exactly; a manifest's
  paths are normalized relative paths; a recipe's name is a safe name; a rule's fix is a
  built-in recipe, or a file below the rule's directory only when recipe files are allowed,
  and its params never name a local path);
- no allocation proportional to a claimed size: headers claiming 2^40..2^64-byte tensors or
  headers, and manifests claiming huge sizes, are read under a tracemalloc peak bound.

Determinism: every test runs with ``derandomize=True`` and no example database, so CI sees the
same examples on every run. Examples per target (unmarked): 300 for each generation strategy:
- read_header: raw bytes, mutated valid files, generated JSON headers, claimed-size headers
  (4 x 300 = 1200);
- load_recipe: raw text, mutated valid recipes (the built-in ones and a full-featured one),
  generated YAML/JSON documents over the recipe vocabulary (3 x 300 = 900);
- read_manifest: raw bytes, mutated valid statements, generated JSON (3 x 300 = 900);
- load_rule: raw text, mutated built-in rules, generated rules with fixes (recipe names and
  paths, params naming local paths) over the rule vocabulary (3 x 100 = 300, a sample);
- parse_header (GGUF): raw bytes, mutated headers of a file gguf-py's GGUFWriter wrote
  (2 x 100 = 200, a sample).
``@pytest.mark.slow`` reruns each strategy with 1000 examples. Recipes, rules and GGUF headers
are parsed under a hang guard: an input that keeps a parser busy for 20 s fails the test.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import pytest
from hostile_helpers import deadline
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patcher.errors import PatchError
from patcher.integrity.manifest import build_statement, read_manifest
from patcher.integrity.manifest_rules import check_relpath
from patcher.model.safetensors_io import DTYPE_BITS, MAX_HEADER_SIZE, read_header, tensor_nbytes
from patcher.recipe.checks import NAME_RE
from patcher.recipe.load import builtin_recipe_dir, load_recipe

EXAMPLES = 300
SAMPLED_EXAMPLES = 100
SLOW_EXAMPLES = 1000
HANG_SECONDS = 20
MANIFEST = "modelpatch.provenance.json"


def fuzz_settings(n: int = EXAMPLES):
    return settings(max_examples=n, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# --------------------------------------------------------------------------- JSON values

json_scalars = st.one_of(
    st.none(), st.booleans(), st.text(max_size=12),
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=20)


def mutate_tree(value, draw, replacements=json_values):
    """Replace, delete or add one node somewhere in a JSON tree (returns the new tree)."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        action = draw(st.sampled_from(["descend", "replace", "delete", "add"]))
        out = dict(value)
        if action == "descend":
            out[key] = mutate_tree(value[key], draw, replacements)
        elif action == "replace":
            out[key] = draw(replacements)
        elif action == "delete":
            del out[key]
        else:
            out[draw(st.text(max_size=8))] = draw(replacements)
        return out
    if isinstance(value, list) and value and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        out = list(value)
        action = draw(st.sampled_from(["descend", "replace", "delete", "duplicate"]))
        if action == "descend":
            out[i] = mutate_tree(value[i], draw, replacements)
        elif action == "replace":
            out[i] = draw(replacements)
        elif action == "delete":
            del out[i]
        else:
            out.append(out[i])
        return out
    return draw(replacements)


def mutate_bytes(data: bytes, draw) -> bytes:
    """Flip, delete, insert or overwrite a few bytes; or truncate."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "delete", "insert", "truncate", "overwrite"]))
        if not data:
            data += draw(st.binary(min_size=1, max_size=8))
            continue
        i = draw(st.integers(0, len(data) - 1))
        if action == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif action == "delete":
            del data[i:i + draw(st.integers(1, 8))]
        elif action == "insert":
            data[i:i] = draw(st.sampled_from([b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\",
                                              b"\xff", b"\x00", b"-", b"9" * 30, b"1e999",
                                              b"NaN", b'"\\ud800"']))
        elif action == "truncate":
            del data[i:]
        else:
            data[i:i + 8] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


# --------------------------------------------------------------------------- safetensors


def _st(header: dict | bytes, data: int | bytes = 0, length: int | None = None) -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    if isinstance(data, int):
        data = b"\0" * data
    return struct.pack("<Q", len(body) if length is None else length) + body + data


@st.composite
def valid_shards(draw) -> bytes:
    """A valid safetensors file: 0-5 tensors of any dtype, laid out in order, with metadata."""
    header, offset = {}, 0
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=6), st.text(max_size=6),
                                                      max_size=3))
    for i in range(draw(st.integers(0, 5))):
        dtype = draw(st.sampled_from(sorted(DTYPE_BITS)))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        n = tensor_nbytes(dtype, shape)
        header[draw(st.text(min_size=1, max_size=10)) + f"#{i}"] = {
            "dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return _st(header, offset)


def _check_header(path: Path) -> None:
    """read_header raises only PatchError; what it accepts is consistent."""
    try:
        h = read_header(path)
    except PatchError as exc:
        assert "\n" not in exc.one_line()
        return
    assert h.data_offset + h.data_size == h.file_size == path.stat().st_size
    position = 0
    for info in sorted(h.tensors.values(), key=lambda t: t.start):
        assert info.start == position and info.nbytes == tensor_nbytes(info.dtype, info.shape)
        position = info.end
    assert position == h.data_size


def _header_file(scratch: Path, data: bytes) -> Path:
    path = scratch / "fuzz.safetensors"
    path.write_bytes(data)
    return path


def _raw_bytes_header(scratch, data):
    _check_header(_header_file(scratch, data))


def _mutated_header(scratch, data):
    _check_header(_header_file(scratch, data))


@st.composite
def mutated_shards(draw) -> bytes:
    data = draw(valid_shards())
    if draw(st.booleans()):
        return mutate_bytes(data, draw)
    # Mutate the JSON structure and re-encode (the length field stays right or not).
    (length,) = struct.unpack("<Q", data[:8])
    doc = json.loads(data[8:8 + length])
    doc = mutate_tree(doc, draw)
    body = json.dumps(doc).encode()
    claimed = draw(st.sampled_from([len(body), len(body), len(body) + 1, 0, 2**64 - 1]))
    return struct.pack("<Q", claimed) + body + data[8 + length:]


@st.composite
def json_headers(draw) -> bytes:
    """A header of generated JSON values (entries of arbitrary shape) and some data."""
    doc = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=4))
    return _st(doc, draw(st.integers(0, 64)))


@st.composite
def claimed_sizes(draw) -> bytes:
    """Headers that claim huge sizes: the header length, the shape, the offsets."""
    huge = draw(st.sampled_from([2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 10**30]))
    kind = draw(st.sampled_from(["length", "shape", "offsets", "both"]))
    dtype = draw(st.sampled_from(["F32", "U8", "F4", "BF16"]))
    if kind == "length":
        return struct.pack("<Q", min(huge, 2**64 - 1)) + b'{"a": 1}'
    shape = [huge, huge] if kind in ("shape", "both") else [4]
    end = tensor_nbytes(dtype, shape) if kind in ("offsets", "both") else 4 * 4
    if kind == "offsets":
        end = huge
    return _st({"w": {"dtype": dtype, "shape": shape, "data_offsets": [0, end]}},
               draw(st.integers(0, 64)))


@fuzz_settings()
@given(data=st.binary(max_size=256))
def test_header_raw_bytes(scratch, data):
    _raw_bytes_header(scratch, data)


@fuzz_settings()
@given(data=mutated_shards())
def test_header_mutated(scratch, data):
    _mutated_header(scratch, data)


@fuzz_settings()
@given(data=json_headers())
def test_header_generated_json(scratch, data):
    _check_header(_header_file(scratch, data))


@fuzz_settings()
@given(data=claimed_sizes())
def test_header_claimed_sizes_allocate_nothing_of_their_size(scratch, data):
    path = _header_file(scratch, data)
    tracemalloc.start()
    try:
        _check_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20) + 64 * len(data), peak


def test_header_length_at_the_limit_is_bounded_by_the_file(scratch):
    """A length just under MAX_HEADER_SIZE over a 16-byte file reads nothing of that size."""
    path = _header_file(scratch, struct.pack("<Q", MAX_HEADER_SIZE) + b"{}" * 4)
    tracemalloc.start()
    try:
        with pytest.raises(PatchError):
            read_header(path)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------- recipes

FULL_RECIPE = """\
# a recipe using every section
modelpatch: 1
name: fuzz-me
description: >-
  Everything at once.
requires:
  - {file: config.json, path: /architectures, contains: DeepseekV3ForCausalLM}
  - any_of:
      - {file: config.json, path: /a, exists: true, in: [/, /text_config]}
      - not: {file: hf_quant_config.json, path: /q, one_of: [1, "x", null]}
    message: custom
config:
  config.json:
    - drop: /quantization_config/kv_cache_scheme
      in: [/, /text_config]
      missing_ok: false
    - set: /max_position_embeddings
      value: {a: [1, 2.5, true, null, "s"]}
    - rename: /rope_scaling
      to: /rope_parameters
    - {op: test, path: /model_type, value: deepseek_v3}
    - {op: move, from: /a, path: /b}
    - architectures: [X, Y]
    - model_type: x
files:
  - add: chat_template.jinja
    content: "{{ messages }}"
    overwrite: true
  - drop: old.txt
tensors:
  - select: {glob: "*.k_scale", dtype: [F32]}
    drop: true
  - select: {glob: ["*.weight"], dtype: [F8_E4M3]}
    dequantize: {scheme: fp8-block, to: bf16}
  - select: {regex: '^language_model\\.'}
    rename: {pattern: '^language_model\\.', to: ''}
  - select: {regex: ['x$', 'y$']}
    allow_empty: true
    cast: fp16
  - select: {glob: "*.w"}
    quantize: {scheme: fp8-block, layout: deepseek, block: [64, 64]}
"""

SEED_RECIPES = [FULL_RECIPE] + sorted(p.read_text() for p in builtin_recipe_dir().glob("*.yaml"))
YAML_TOKENS = ["&a ", "*a", "!!python/object:os.system ", "!x ", "---\n", "...\n", "|\n", ">\n",
               "{", "}", "[", "]", "'", '"', "\\", "%YAML 1.2\n", "? ", ": ", "- ", "#", "@",
               "`", "\t", "\x00", "\ufeff", "\ud800", "1e999", ".inf", ".nan", "0x1F", "0o17",
               "~", "null", "yes", "no", "<<: *a\n", "(a+)+", "'(a+)+'", "[" * 80, "\u2028",
               "modelpatch: 2\n", "name: ../x\n", "../", "/abs"]
RECIPE_KEYS = ["modelpatch", "name", "description", "requires", "config", "files", "tensors",
               "file", "path", "exists", "equals", "contains", "one_of", "any_of", "all_of",
               "not", "in", "message", "drop", "set", "value", "rename", "to", "op", "from",
               "missing_ok", "architectures", "model_type", "add", "content", "overwrite",
               "select", "glob", "regex", "dtype", "allow_empty", "cast", "dequantize",
               "quantize", "scheme", "layout", "block", "pattern", "config.json",
               "gguf", "metadata", "strip_nextn", "from_model", "from_key", "token", "multiply",
               "layers", "key", "type", "first", "last:1", "array[uint32]", "{arch}",
               "include", "params", "recipe", "fix-eos", "./x.yaml", "../x.yaml", "file:/x",
               "model:/x", "split", "copy", "sha256", "description"]


def _check_recipe(data: bytes) -> None:
    try:
        with deadline(HANG_SECONDS):
            recipe = load_recipe(data)
    except PatchError as exc:
        assert "\n" not in exc.one_line()
        return
    assert NAME_RE.match(recipe.name), recipe.name


@st.composite
def mutated_recipes(draw) -> bytes:
    text = draw(st.sampled_from(SEED_RECIPES))
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["token", "delete", "duplicate", "indent", "bytes"]))
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        if not lines:
            lines = [draw(st.sampled_from(YAML_TOKENS))]
        elif action == "token":
            line = lines[i]
            j = draw(st.integers(0, len(line)))
            lines[i] = line[:j] + draw(st.sampled_from(YAML_TOKENS)) + line[j:]
        elif action == "delete":
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        elif action == "indent":
            lines[i] = draw(st.sampled_from(["", " ", "  ", "    ", "\t"])) + lines[i].lstrip()
        else:
            return mutate_bytes("".join(lines).encode("utf-8", "surrogatepass"), draw)
    return "".join(lines).encode("utf-8", "surrogatepass")


recipe_values = st.recursive(
    st.one_of(json_scalars, st.sampled_from(RECIPE_KEYS + ["/x", "/", "*.w", "F32", "bf16",
                                                            "fp8-block", "deepseek", True])),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(RECIPE_KEYS), children, max_size=4)),
    max_leaves=25)


@st.composite
def generated_recipes(draw) -> bytes:
    """A mapping over the recipe vocabulary, written as JSON (which is YAML) or block YAML."""
    doc = {"modelpatch": 1, "name": "gen", "description": "generated"}
    doc.update(draw(st.dictionaries(st.sampled_from(RECIPE_KEYS), recipe_values, max_size=5)))
    if draw(st.booleans()):
        return json.dumps(doc).encode()
    from io import StringIO

    from ruamel.yaml import YAML

    out = StringIO()
    YAML(typ="safe", pure=True).dump(json.loads(json.dumps(doc)), out)
    return out.getvalue().encode()


@fuzz_settings()
@given(text=st.text(max_size=300))
def test_recipe_raw_text(text):
    _check_recipe(text.encode("utf-8", "surrogatepass"))


@fuzz_settings()
@given(data=mutated_recipes())
def test_recipe_mutated(data):
    _check_recipe(data)


@fuzz_settings()
@given(data=generated_recipes())
def test_recipe_generated(data):
    _check_recipe(data)


def test_seed_recipes_load():
    for text in SEED_RECIPES:
        load_recipe(text.encode())


# --------------------------------------------------------------------------- doctor rules

SEED_RULES = sorted(p.read_text() for p in
                    (Path(__file__).parents[1] / "patcher" / "doctor" / "rules").glob("*.yaml"))
RULE_KEYS = ["doctor", "id", "severity", "summary", "evidence", "fix", "details", "when",
             "source", "versions", "recipe", "params", "params_from", "engine",
             "engine_version", "gpu", "any_of", "all_of", "not", "file", "path", "exists",
             "equals", "in", "message", "blocker", "warning", "info", "@model", "config.json",
             "sm120", "<sm89", "<0.18.0", "vllm", "fix-eos", "./r.yaml", "../r.yaml",
             "file:/etc/hostname", "model:/m", "/eos/fix", "x" * 300]


def _check_rule(scratch: Path, data: bytes, allow_recipe_files: bool = False) -> None:
    from patcher.doctor.rules import load_rule

    path = scratch / "rules" / "r.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    try:
        with deadline(HANG_SECONDS):
            rule = load_rule(path, allow_recipe_files=allow_recipe_files)
    except PatchError as exc:
        assert "\n" not in exc.one_line()
        return
    if rule.fix is None:
        return
    from patcher.recipe.load import builtin_recipe_names

    # a rule is data: its params never name a local path, its fix is a built-in recipe or,
    # only when allowed, a file below the rule's directory
    assert not _local_paths(rule.fix.get("params")), rule.fix
    recipe = rule.fix["recipe"]
    if recipe not in builtin_recipe_names():
        assert allow_recipe_files, rule.fix
        assert Path(recipe).resolve().is_relative_to(path.parent.resolve()), rule.fix


def _local_paths(value) -> list[str]:
    """The strings in ``value`` that name a local path (``model:``, ``file:``)."""
    if isinstance(value, str):
        return [value] if value.startswith(("model:", "file:")) else []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) \
        else ()
    return [s for item in items for s in _local_paths(item)]


@st.composite
def mutated_rules(draw) -> bytes:
    lines = draw(st.sampled_from(SEED_RULES)).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        if not lines:
            lines = [draw(st.sampled_from(YAML_TOKENS + RULE_KEYS))]
            continue
        line = lines[i]
        j = draw(st.integers(0, len(line)))
        token = draw(st.sampled_from(YAML_TOKENS + RULE_KEYS))
        action = draw(st.sampled_from(["token", "delete", "duplicate", "indent"]))
        if action == "token":
            lines[i] = line[:j] + token + line[j:]
        elif action == "delete":
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        else:
            lines[i] = draw(st.sampled_from(["", " ", "  ", "\t"])) + lines[i].lstrip()
    return "".join(lines).encode("utf-8", "surrogatepass")


rule_values = st.recursive(
    st.one_of(json_scalars, st.sampled_from(RULE_KEYS)),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.sampled_from(RULE_KEYS), children, max_size=4)),
    max_leaves=25)


FIX_RECIPES = ["fix-eos", "strip-mtp", "no-such-recipe", "r.yaml", "./r.yaml", "sub/r.yaml",
               "../r.yaml", "/etc/r.yaml", ".hidden/r.yaml", "sub/../../r.yaml", "a\0b", ""]
param_values = st.recursive(
    st.one_of(json_scalars, st.sampled_from(["file:/etc/hostname", "model:/m/config.json",
                                             "file:x", "hf://o/n/config.json", "{x}"])),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=6), children, max_size=3)),
    max_leaves=10)


@st.composite
def generated_rules(draw) -> bytes:
    """A valid rule, most often with a fix (a recipe name or path, params with local paths),
    then a few of its keys replaced by anything of the rule vocabulary."""
    doc = {"doctor": 1, "id": "gen", "severity": "info", "summary": "s",
           "evidence": [{"source": "x", "versions": "any"}],
           "when": {"file": "config.json", "path": "/x", "exists": True}}
    if draw(st.integers(0, 3)):
        fix = {"recipe": draw(st.sampled_from(FIX_RECIPES))}
        if draw(st.booleans()):
            fix["params"] = draw(st.dictionaries(st.text(max_size=6), param_values, max_size=3))
        if draw(st.integers(0, 3)) == 0:
            fix["params_from"] = draw(st.sampled_from(["/eos/fix", "x", ""]))
        doc["fix"] = fix
    if draw(st.booleans()):
        doc.update(draw(st.dictionaries(st.sampled_from(RULE_KEYS), rule_values, max_size=2)))
    return json.dumps(doc).encode()


@fuzz_settings(SAMPLED_EXAMPLES)
@given(text=st.text(max_size=300))
def test_rule_raw_text(scratch, text):
    _check_rule(scratch, text.encode("utf-8", "surrogatepass"))


@fuzz_settings(SAMPLED_EXAMPLES)
@given(data=mutated_rules(), allow=st.booleans())
def test_rule_mutated(scratch, data, allow):
    _check_rule(scratch, data, allow)


@fuzz_settings(SAMPLED_EXAMPLES)
@given(data=generated_rules(), allow=st.booleans())
def test_rule_generated(scratch, data, allow):
    _check_rule(scratch, data, allow)


def test_seed_rules_load(scratch):
    from patcher.doctor.rules import load_rule

    for text in SEED_RULES:
        path = scratch / "seed.yaml"
        path.write_text(text)
        load_rule(path)


# ---------------------------------------------------------------------------- GGUF headers

@pytest.fixture(scope="module")
def gguf_seed(tmp_path_factory) -> tuple[bytes, int]:
    """A real GGUF file (gguf-py's GGUFWriter): its header and a little data, and its size."""
    from gguf_fixtures import gguf, write_tiny

    if gguf is None:
        pytest.skip("gguf-py is not installed")
    from patcher.gguf.format import read_header

    path = write_tiny(tmp_path_factory.mktemp("gguf") / "tiny.gguf", blocks=1)
    header = read_header(path)
    return path.read_bytes()[:header.data_offset + 256], header.file_size


def _check_gguf(data: bytes, file_size: int | None = None) -> None:
    from patcher.errors import GGUFFormatError
    from patcher.gguf.format import parse_header

    try:
        with deadline(HANG_SECONDS):
            header = parse_header(data, len(data) if file_size is None else file_size,
                                  "fuzz.gguf")
    except PatchError as exc:
        assert isinstance(exc, GGUFFormatError) and "\n" not in exc.one_line(), exc
        return
    assert header.data_offset <= header.file_size
    for info in header.tensors.values():
        assert header.data_offset + info.offset + info.nbytes <= header.file_size


@st.composite
def mutated_gguf(draw, seed: tuple[bytes, int]) -> tuple[bytes, int]:
    data = bytearray(seed[0])
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(data) - 1))
        if draw(st.booleans()):
            data[at] = draw(st.integers(0, 255))
        else:        # a count, length or offset field: an extreme little-endian integer
            value = draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
            data[at:at + 8] = value.to_bytes(8, "little")
    cut = draw(st.integers(0, len(data))) if draw(st.booleans()) else len(data)
    return bytes(data[:cut]), draw(st.sampled_from([seed[1], cut, 2**62]))


@fuzz_settings(SAMPLED_EXAMPLES)
@given(data=st.binary(max_size=256))
def test_gguf_raw_bytes(data):
    _check_gguf(b"GGUF" + data)


@fuzz_settings(SAMPLED_EXAMPLES)
@given(data=st.data())
def test_gguf_mutated(gguf_seed, data):
    _check_gguf(*data.draw(mutated_gguf(gguf_seed)))


def test_gguf_seed_parses(gguf_seed):
    from patcher.gguf.format import parse_header

    assert parse_header(*gguf_seed, "seed.gguf").tensors


# --------------------------------------------------------------------------- manifests

H = "ab" * 32


def _statement() -> dict:
    return build_statement(
        subjects={"config.json": (H, 10), "sub/model.safetensors": (H, 2**40)},
        base_files={"config.json": (H, 12)},
        recipe={"name": "r", "sha256": H, "text": "modelpatch: 1\n"},
        options={"jobs": None}, changes=[{"kind": "json_removed", "path": "/a"}],
        started=0, finished=1, versions={"modelpatch": "0"})


def _nested_statement(depth: int) -> dict:
    statement = _statement()
    for _ in range(depth):
        outer = _statement()
        outer["predicate"]["buildDefinition"]["externalParameters"]["base_provenance"] = statement
        statement = outer
    return statement


SEED_STATEMENTS = [_statement(), _nested_statement(2)]
manifest_paths = st.sampled_from(["../x", "/etc/passwd", "a/../b", "./a", "a//b", "a\\b", "",
                                  ".modelpatch/x", MANIFEST, "a\x00b", "ok.json", "a/b/c"])


def _check_manifest(directory: Path, data: bytes) -> None:
    path = directory / MANIFEST
    if path.exists():
        path.chmod(0o644)
    path.write_bytes(data)
    try:
        manifest = read_manifest(directory)
    except PatchError as exc:
        assert "\n" not in exc.one_line()
        return
    for name in list(manifest.subjects) + list(manifest.base_files):
        assert check_relpath(name) is None, name


@st.composite
def mutated_statements(draw) -> bytes:
    doc = draw(st.sampled_from(SEED_STATEMENTS))
    replacements = st.one_of(json_values, manifest_paths,
                             st.sampled_from([H, H.upper(), "0" * 63, -1, 2**64, True]))
    for _ in range(draw(st.integers(1, 3))):
        doc = mutate_tree(doc, draw, replacements)
    data = json.dumps(doc).encode()
    return mutate_bytes(data, draw) if draw(st.integers(0, 4)) == 0 else data


@fuzz_settings()
@given(data=st.binary(max_size=300))
def test_manifest_raw_bytes(scratch, data):
    _check_manifest(scratch, data)


@fuzz_settings()
@given(data=mutated_statements())
def test_manifest_mutated(scratch, data):
    _check_manifest(scratch, data)


@fuzz_settings()
@given(doc=json_values)
def test_manifest_generated_json(scratch, doc):
    _check_manifest(scratch, json.dumps(doc).encode())


def _nested_text(depth: int) -> bytes:
    """``_nested_statement(depth)`` as JSON text, built without recursion."""
    outer = _statement()
    outer["predicate"]["buildDefinition"]["externalParameters"]["base_provenance"] = "@@"
    prefix, suffix = json.dumps(outer).split('"@@"')
    return (prefix * depth + json.dumps(_statement()) + suffix * depth).encode()


@pytest.mark.parametrize("depth", [1, 50, 200, 240, 260, 400, 5000])
def test_manifest_deeply_chained_base_provenance(tmp_path, depth):
    """A chain of embedded base statements (4 JSON levels each), around and beyond Python's
    recursion limit: accepted or refused cleanly."""
    _check_manifest(tmp_path, _nested_text(depth))


def test_manifest_claims_are_not_allocated(tmp_path):
    """Sizes in a manifest are claims: reading one that lists a 2^62-byte file costs nothing."""
    doc = _statement()
    doc["subject"][0]["annotations"]["size"] = 2**62
    (tmp_path / MANIFEST).write_text(json.dumps(doc))
    tracemalloc.start()
    try:
        assert read_manifest(tmp_path).subjects["config.json"].size == 2**62
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------- slow variants


@pytest.mark.slow
@pytest.mark.parametrize("target", ["header-raw", "header-mutated", "header-json",
                                    "recipe-raw", "recipe-mutated", "recipe-generated",
                                    "rule-raw", "rule-mutated", "rule-generated",
                                    "gguf-raw", "gguf-mutated",
                                    "manifest-raw", "manifest-mutated", "manifest-json"])
def test_fuzz_more(scratch, target, request):
    gguf_seed = request.getfixturevalue("gguf_seed") if target.startswith("gguf") else None
    strategy, check = {
        "header-raw": (st.binary(max_size=512), lambda d: _check_header(_header_file(scratch, d))),
        "header-mutated": (mutated_shards(), lambda d: _check_header(_header_file(scratch, d))),
        "header-json": (json_headers(), lambda d: _check_header(_header_file(scratch, d))),
        "recipe-raw": (st.text(max_size=600).map(lambda t: t.encode("utf-8", "surrogatepass")),
                       _check_recipe),
        "recipe-mutated": (mutated_recipes(), _check_recipe),
        "recipe-generated": (generated_recipes(), _check_recipe),
        "rule-raw": (st.text(max_size=600).map(lambda t: t.encode("utf-8", "surrogatepass")),
                     lambda d: _check_rule(scratch, d)),
        "rule-mutated": (mutated_rules(), lambda d: _check_rule(scratch, d, True)),
        "rule-generated": (generated_rules(), lambda d: _check_rule(scratch, d)),
        "gguf-raw": (st.binary(max_size=600), lambda d: _check_gguf(b"GGUF" + d)),
        "gguf-mutated": (mutated_gguf(gguf_seed) if gguf_seed else st.nothing(),
                         lambda d: _check_gguf(*d)),
        "manifest-raw": (st.binary(max_size=600), lambda d: _check_manifest(scratch, d)),
        "manifest-mutated": (mutated_statements(), lambda d: _check_manifest(scratch, d)),
        "manifest-json": (json_values.map(lambda v: json.dumps(v).encode()),
                          lambda d: _check_manifest(scratch, d)),
    }[target]

    @fuzz_settings(SLOW_EXAMPLES)
    @given(data=strategy)
    def run(data):
        check(data)

    run()
