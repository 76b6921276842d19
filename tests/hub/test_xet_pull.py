"""pull's Xet path on its own (``patcher.hub.client.xet_pull``): a variant file rebuilt from a
local base's chunks through the hub's reconstructions, with a hub of xorbs in memory that can
lie. The whole path through the embedded hub is in ``test_xet_publish_pull.py``."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest

from patcher.errors import HubError
from patcher.hub.client.xet_pull import LocalBase, XetPulled, rebuild, xet_file_hash
from patcher.hub.client.xet_terms import MAX_TERMS_ENV, parse_reconstruction
from patcher.hub.xet.chunking import iter_chunks
from patcher.hub.xet.hashing import chunk_hash, hash_to_hex, xorb_hash
from patcher.hub.xet.xorb import iter_xorb, serialize_xorb


def _data(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


class MemoryHub:
    """Xorbs in memory; files stored as runs of their chunks (new chunks into one new xorb)."""

    def __init__(self):
        self.xorbs: dict[str, list[bytes]] = {}
        self.where: dict[bytes, tuple[str, int]] = {}     # chunk hash -> (xorb, index)
        self.served = 0
        self.corrupt: set[str] = set()

    def store(self, data: bytes) -> dict:
        chunks = list(iter_chunks(io.BytesIO(data)))
        new = [c for c in chunks if chunk_hash(c) not in self.where]
        if new:
            name = hash_to_hex(xorb_hash([(chunk_hash(c), len(c)) for c in new]))
            self.xorbs[name] = new
            for i, c in enumerate(new):
                self.where.setdefault(chunk_hash(c), (name, i))
        terms: list[dict] = []
        for c in chunks:
            xorb, i = self.where[chunk_hash(c)]
            last = terms[-1] if terms else None
            if last and last["hash"] == xorb and last["range"]["end"] == i:
                last["range"]["end"] += 1
                last["unpacked_length"] += len(c)
            else:
                terms.append({"hash": xorb, "range": {"start": i, "end": i + 1},
                              "unpacked_length": len(c)})
        fetch = {x: [{"range": {"start": 0, "end": len(self.xorbs[x])}, "url": f"http://h/{x}",
                      "url_range": {"start": 0, "end": len(serialize_xorb(self.xorbs[x])) - 1}}]
                 for x in {t["hash"] for t in terms}}
        return {"offset_into_first_range": 0, "terms": terms, "fetch_info": fetch}

    def chunks(self, fetch, what):
        data = serialize_xorb(self.xorbs[fetch.xorb])[fetch.first:fetch.last + 1]
        self.served += len(data)
        out = [(r.hash, raw) for r, raw in iter_xorb(data, fetch.end - fetch.start)]
        if fetch.xorb in self.corrupt:                   # valid chunks, other bytes
            out = [(chunk_hash(bytes(len(raw))), bytes(len(raw))) for _, raw in out]
        return out


def _variant_of(base: bytes) -> bytes:
    """The base with small pieces cut out and one inserted, as drop-kv-scales and renames do."""
    cut = [len(base) // 5, len(base) // 2, 4 * len(base) // 5]
    out = base[:cut[0]] + base[cut[0] + 4:cut[1]] + b"renamed.tensor" + base[cut[1]:cut[2]] \
        + base[cut[2] + 8:]
    return b"HEADER" + out


def _setup(tmp_path: Path):
    hub = MemoryHub()
    base = _data(3_000_000, 1)
    variant = _variant_of(base)
    base_path = tmp_path / "base.safetensors"
    base_path.write_bytes(base)
    base_recon = parse_reconstruction(hub.store(base), len(base), "the base")
    variant_answer = hub.store(variant)
    return hub, base_path, base_recon, variant, variant_answer


def test_rebuilds_from_local_chunks_and_fetches_only_the_new_ones(tmp_path):
    hub, base_path, base_recon, variant, answer = _setup(tmp_path)
    recon = parse_reconstruction(answer, len(variant), "v.safetensors")
    (tmp_path / "v").write_bytes(variant)
    want = xet_file_hash(tmp_path / "v")
    pulled = XetPulled()
    base = LocalBase(base_path, base_recon, "v.safetensors")
    rebuild(tmp_path / "out", recon, base, hub, want, "v.safetensors", pulled)
    base.close()
    assert (tmp_path / "out").read_bytes() == variant
    assert 0 < hub.served < len(variant) // 5            # only the chunks around the edits
    assert pulled.local_bytes > 0.8 * len(variant)


def test_wrong_chunk_data_is_refused_and_nothing_is_left(tmp_path):
    hub, base_path, base_recon, variant, answer = _setup(tmp_path)
    recon = parse_reconstruction(answer, len(variant), "v.safetensors")
    (tmp_path / "v").write_bytes(variant)
    want = xet_file_hash(tmp_path / "v")
    hub.corrupt = set(hub.xorbs) - {t.xorb for t in base_recon.terms}
    base = LocalBase(base_path, base_recon, "v.safetensors")
    with pytest.raises(HubError, match="do not hash to its Xet hash") as err:
        rebuild(tmp_path / "out", recon, base, hub, want, "v.safetensors", XetPulled())
    base.close()
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_term_naming_the_wrong_chunks_is_refused(tmp_path):
    hub, base_path, base_recon, variant, answer = _setup(tmp_path)
    (tmp_path / "v").write_bytes(variant)
    want = xet_file_hash(tmp_path / "v")
    base_xorb = base_recon.terms[0].xorb
    terms = answer["terms"]
    # the first term that reuses the base now names the chunks after its own: the lengths
    # still add up (the last term gives back what the first lost), the bytes do not
    first = next(t for t in terms if t["hash"] == base_xorb and t["range"]["end"] > 3)
    first["range"] = {"start": first["range"]["start"] + 1, "end": first["range"]["end"] + 1}
    base = LocalBase(base_path, base_recon, "v.safetensors")
    with pytest.raises(HubError) as err:
        recon = parse_reconstruction(answer, len(variant), "v.safetensors")
        rebuild(tmp_path / "out", recon, base, hub, want, "v.safetensors", XetPulled())
    base.close()
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, needle", [
    (lambda a: a["terms"].append(dict(a["terms"][0])), "terms hold"),
    (lambda a: a["terms"][0].update(hash="X" * 64), "64 lowercase hex"),
    (lambda a: a["terms"][0]["range"].update(start=5, end=5), "start < end"),
    (lambda a: a["fetch_info"].clear(), "no fetch_info covers"),
    (lambda a: next(iter(a["fetch_info"].values()))[0].update(url="file:///etc/passwd"),
     r"http\(s\) URL"),
    (lambda a: next(iter(a["fetch_info"].values()))[0]["url_range"].update(end=1 << 40),
     "longer than"),
])
def test_malformed_reconstructions_are_refused_in_one_line(change, needle):
    hub = MemoryHub()
    data = _data(400_000, 2)
    answer = hub.store(data)
    change(answer)
    with pytest.raises(HubError, match=needle) as err:
        parse_reconstruction(answer, len(data), "f.safetensors")
    assert "\n" not in str(err.value) and "f.safetensors" in str(err.value)


def test_the_term_budget(monkeypatch):
    hub = MemoryHub()
    data = _data(400_000, 3)
    answer = hub.store(data)
    answer["terms"] = answer["terms"] * 3
    monkeypatch.setenv(MAX_TERMS_ENV, "2")
    with pytest.raises(HubError, match=f"more than the budget of 2.*{MAX_TERMS_ENV}"):
        parse_reconstruction(answer, 3 * len(data), "f.safetensors")


def test_xet_file_hash_matches_the_chunker(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(300_000))
    from patcher.hub.xet.hashing import file_hash

    with open(path, "rb") as f:
        mine = hash_to_hex(file_hash([(chunk_hash(c), len(c)) for c in iter_chunks(f)]))
    assert xet_file_hash(path) == mine
