"""The shard index proven by its text (patcher.model.index_text): what it accepts is exactly what
parsing gives (same map, same order, same metadata); anything else is left to the entry-by-entry
path, so every defect is named as before."""

from __future__ import annotations

import json
import os
import random
import struct
from pathlib import Path

import pytest

from patcher.errors import ShardIndexError
from patcher.model import header_cache, index_text, model_dir
from patcher.model.model_dir import INDEX_NAME, ModelDir
from patcher.model.safetensors_io import read_header
from patcher.model.shard_index import index_defects, parse_index


def _shard(path: Path, names: list[str]) -> int:
    header, offset = {}, 0
    for name in names:
        header[name] = {"dtype": "F32", "shape": [2], "data_offsets": [offset, offset + 8]}
        offset += 8
    raw = json.dumps(header, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


def _model(tmp_path: Path, shards: int = 3, per: int = 5, seed: int = 0,
           names=None) -> tuple[Path, dict, int]:
    rng = random.Random(seed)
    model, weight_map, total = tmp_path / "m", {}, 0
    model.mkdir()
    pool = names or [f"model.layers.{i}.mlp.w{j}.weight" for i in range(shards * per)
                     for j in range(1)]
    rng.shuffle(pool)
    for k in range(shards):
        shard = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = pool[k * per:(k + 1) * per]
        total += _shard(model / shard, part)
        weight_map.update(dict.fromkeys(part, shard))
    return model, weight_map, total


def _write(model: Path, doc: dict, **dumps) -> bytes:
    raw = (json.dumps(doc, **dumps) + "\n").encode()
    (model / INDEX_NAME).write_bytes(raw)
    return raw


def _headers(model: Path) -> dict:
    return {p.name: read_header(p) for p in sorted(model.glob("*.safetensors"))}


LAYOUTS = {
    "transformers (sorted, indent 2)": dict(indent=2, sort_keys=True),
    "hub (header order, indent 2)": dict(indent=2),
    "compact": dict(),
    "tight": dict(separators=(",", ":")),
    "indent 4, tab": dict(indent="\t"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("per", [1, 4])
def test_a_proven_index_is_the_parsed_one(tmp_path, layout, per):
    model, weight_map, total = _model(tmp_path, per=per)
    doc = {"metadata": {"total_size": total, "format": "pt"}, "weight_map": weight_map}
    raw = _write(model, doc, **LAYOUTS[layout])
    proven = index_text.index_from_headers(raw, "idx", _headers(model))
    assert proven is not None
    parsed = parse_index(raw, "idx")
    assert list(proven.weight_map.items()) == list(parsed.weight_map.items())
    assert (proven.total_size, proven.metadata) == (parsed.total_size, parsed.metadata)
    assert proven.shards() == parsed.shards()
    assert ModelDir.open(model).index.weight_map == parsed.weight_map


def _refused(model: Path, raw: bytes) -> None:
    """Not proven by its text; opening the model gives what parsing and checking give."""
    assert index_text.index_from_headers(raw, "idx", _headers(model)) is None


def test_another_order_is_parsed(tmp_path):
    model, weight_map, total = _model(tmp_path)
    names = list(weight_map)
    random.Random(1).shuffle(names)
    raw = _write(model, {"metadata": {"total_size": total},
                         "weight_map": {n: weight_map[n] for n in names}}, indent=2)
    _refused(model, raw)
    assert ModelDir.open(model).index.weight_map == weight_map


@pytest.mark.parametrize("defect, message", [
    ("wrong shard", "index places it in"),
    ("missing", "missing from the index"),
    ("extra", "which has no such tensor"),
    ("total_size", "metadata.total_size is"),
    ("duplicate key", "duplicate key"),
    ("metadata not an object", "metadata is not an object"),
    ("decoy in metadata", "metadata.total_size is"),
    ("escape", None),
])
def test_defects_are_named_by_the_exact_path(tmp_path, defect, message):
    model, weight_map, total = _model(tmp_path)
    first, second = sorted(weight_map)[:2]
    wm, meta = dict(weight_map), {"total_size": total}
    if defect == "wrong shard":
        wm[first] = next(s for s in sorted(set(wm.values())) if s != wm[first])
    elif defect == "missing":
        del wm[first]
    elif defect == "extra":
        wm["not.there"] = wm[first]
    elif defect == "total_size":
        meta["total_size"] = total + 8
    elif defect == "metadata not an object":
        meta = [1]
    doc = {"metadata": meta, "weight_map": dict(sorted(wm.items()))}
    if defect == "decoy in metadata":
        doc = {"metadata": {"total_size": total, "weight_map": dict(sorted(wm.items()))},
               "weight_map": {}}
    raw = json.dumps(doc, indent=2)
    if defect == "duplicate key":
        raw = raw.replace(f'"{second}"', f'"{first}"', 1)
    if defect == "escape":
        raw = raw.replace(f'"{first}"', '"' + first.replace("m", "\\u006d", 1) + '"', 1)
    raw = raw.encode()
    (model / INDEX_NAME).write_bytes(raw)
    _refused(model, raw)
    if message is None:
        assert ModelDir.open(model).index.weight_map == weight_map
        return
    with pytest.raises(Exception) as got:
        ModelDir.open(model)
    assert message in str(got.value)
    try:
        index = parse_index(raw, str(model / INDEX_NAME))
    except Exception as exc:       # the parse itself refuses it
        assert str(exc) == str(got.value)
        return
    defects = index_defects(str(model / INDEX_NAME), index, _headers(model))
    assert isinstance(got.value, ShardIndexError) and defects
    assert str(got.value).startswith(str(defects[0]).split(" (and ")[0][:60])


@pytest.mark.parametrize("name", ["a b.weight", "a!.weight", 'a".weight', "a\tb", "a\u00e9"])
def test_names_that_are_not_their_own_text_are_parsed(tmp_path, name):
    names = [f"x.{i}" for i in range(5)] + [name]
    model, weight_map, total = _model(tmp_path, shards=2, per=3, names=names)
    raw = _write(model, {"metadata": {"total_size": total}, "weight_map": weight_map},
                 indent=2, sort_keys=True, ensure_ascii=False)
    if '"' in name or "\t" in name:
        _refused(model, raw)
    assert ModelDir.open(model).index.weight_map == weight_map


def test_open_proves_the_index_without_parsing_its_weight_map(tmp_path, monkeypatch):
    model, weight_map, total = _model(tmp_path, per=4)
    raw = _write(model, {"metadata": {"total_size": total}, "weight_map": weight_map},
                 indent=2, sort_keys=True)
    then = os.stat(model / INDEX_NAME).st_mtime - 3600       # old enough to be cached
    for p in model.iterdir():
        os.utime(p, (then, then))
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(model_dir, "parse_index", None)      # any call would fail
    cold = ModelDir.open(model)
    assert list(cold.index.weight_map.items()) == list(parse_index(raw, "x").weight_map.items())
    assert header_cache.HeaderCache(model).entries["index"][0] == "sorted"
    warm = ModelDir.open(model)                               # from the header cache
    assert list(warm.index.weight_map.items()) == list(cold.index.weight_map.items())


@pytest.mark.parametrize("seed", range(6))
def test_whatever_is_proven_parses_to_the_same_index_and_checks_clean(tmp_path, seed):
    """Mutated index texts: a proof is only ever given for text whose parse is that index and
    passes every check of the entry-by-entry path."""
    rng = random.Random(seed)
    model, weight_map, total = _model(tmp_path, shards=2, per=3, seed=seed)
    headers = _headers(model)
    layout = LAYOUTS[rng.choice(sorted(LAYOUTS))]
    good = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                      **layout).encode()
    alphabet = b' \n\t,:"{}[]0123456789.-abcdefmnotw_\\'
    proofs = 0
    for _ in range(150):
        raw = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw))
            kind = rng.randrange(3)
            if kind == 0:
                raw[at:at + 1] = b""
            elif kind == 1:
                raw[at:at] = bytes([rng.choice(alphabet)])
            else:
                raw[at] = rng.choice(alphabet)
        raw = bytes(raw)
        proven = index_text.index_from_headers(raw, "idx", headers)
        if proven is None:
            continue
        parsed = parse_index(raw, "idx")            # raises if the text is not a valid index
        assert list(proven.weight_map.items()) == list(parsed.weight_map.items())
        assert (proven.total_size, proven.metadata) == (parsed.total_size, parsed.metadata)
        assert index_defects("idx", parsed, headers) == []
        proofs += 1
    assert proofs        # some mutations (whitespace) keep the text a proof


def test_a_name_holding_quotes_cannot_forge_entries(tmp_path):
    """A header name (escaped in its header) that reads as several entries when written without
    escapes: the index text spelling those entries is parsed, never taken as the headers'."""
    model = tmp_path / "m"
    model.mkdir()
    a, b = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    forged = f'x":"{b}","y'
    _shard(model / a, [forged])
    _shard(model / b, ["z"])
    text = '{"metadata":{"total_size":16},"weight_map":{"' + forged + f'":"{a}","z":"{b}"}}}}'
    raw = text.encode()
    (model / INDEX_NAME).write_bytes(raw)
    assert b"\\" not in raw
    _refused(model, raw)
    with pytest.raises(ShardIndexError):
        ModelDir.open(model)
