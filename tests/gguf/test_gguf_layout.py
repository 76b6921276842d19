"""GGUF writes are laid out the way readers read them: the data starts right after the header,
rounded up to the alignment. Header edits that shrink, grow or keep the header's size, across
alignment boundaries, for a new variant and ``--in-place``, checked with gguf-py's GGUFReader and
against gguf-py's own ``gguf-new-metadata``; a wrong layout is refused before commit and found by
``verify``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf_fixtures import gguf, needs_gguf, read_back

from patcher import api
from patcher.cli import main
from patcher.errors import OperationFailed

pytestmark = needs_gguf
BASE_NAME = "n" * 300


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _model(root: Path, alignment: int | None) -> Path:
    """A small model by GGUFWriter: tensors of F32, F16 and Q8_0 with odd sizes (so each one
    is followed by padding), a long general.name to shorten, and ``general.alignment``."""
    root.mkdir()
    path = root / "m.gguf"
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(BASE_NAME)
    w.add_block_count(1)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_tensor("token_embd.weight", rng.standard_normal((7, 33)).astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(33).astype(np.float32))
    q = gguf.quants.quantize(rng.standard_normal((3, 64)).astype(np.float32),
                             gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _header_end(path: Path) -> tuple[int, int]:
    """(where the header's bytes end, where the data starts) as GGUFReader reads them."""
    reader = gguf.GGUFReader(path)
    last = reader.tensors[-1].field
    return last.offset + sum(p.nbytes for p in last.parts), reader.data_offset


def _recipe(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"name-{len(name)}.yaml"
    path.write_text("modelpatch: 1\nname: rename\ndescription: a new general.name\n"
                    "gguf:\n  metadata:\n"
                    f"    - {{set: general.name, value: {name}}}\n")
    return path


def _reference(base: Path, out: Path, name: str) -> dict[str, bytes]:
    """The tensors of gguf-py's own gguf-new-metadata output for the same edit."""
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--general-name",
                    name, "--force", str(base), str(out)], check=True, capture_output=True)
    meta, tensors = read_back(out)
    assert meta["general.name"] == name
    return tensors


# (what the edit does to the header's length, the new name's length given the header's end and
# the data offset of the base, and the alignment)
CASES = {
    "same size": lambda end, data, a: len(BASE_NAME),
    "ends on the boundary": lambda end, data, a: len(BASE_NAME) + data - end,
    "one byte over": lambda end, data, a: len(BASE_NAME) + data - end + 1,
    "grows by 9": lambda end, data, a: len(BASE_NAME) + 9,
    "shrinks by 9": lambda end, data, a: len(BASE_NAME) - 9,
    "shrinks onto the boundary below": lambda end, data, a: len(BASE_NAME) - (end - (data - a)),
    "one byte under the boundary below": lambda end, data, a:
        len(BASE_NAME) - (end - (data - a)) - 1,
    "shrinks by a whole block": lambda end, data, a: len(BASE_NAME) - a - 1,
}
ALIGNMENTS = [None, 64, 256]
FAST = [(None, "shrinks by 9"), (None, "one byte under the boundary below"),
        (64, "ends on the boundary"), (256, "shrinks by a whole block"), (64, "one byte over")]


@pytest.mark.parametrize("in_place", [False, True], ids=["variant", "in-place"])
@pytest.mark.parametrize("alignment,case", FAST)
def test_header_edits_keep_every_tensor_where_readers_read_it(tmp_path, alignment, case,
                                                               in_place):
    _check_edit(tmp_path, alignment, case, in_place)


@pytest.mark.slow
@pytest.mark.parametrize("in_place", [False, True], ids=["variant", "in-place"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_header_edits_every_case(tmp_path, alignment, case, in_place):
    _check_edit(tmp_path, alignment, case, in_place)


def _check_edit(tmp_path: Path, alignment, case: str, in_place: bool) -> None:
    base = _model(tmp_path / "model", alignment)
    meta, tensors = read_back(base)
    end, data = _header_end(base)
    name = "x" * CASES[case](end, data, alignment or 32)
    expected = _reference(base, tmp_path / "reference.gguf", name)
    assert expected == tensors
    recipe = _recipe(tmp_path, name)
    if in_place:
        api.apply_in_place(recipe, base.parent)
        out = base
    else:
        out = api.apply(recipe, base.parent, out=tmp_path / "out").output / "m.gguf"
    new_meta, new_tensors = read_back(out)
    assert new_meta["general.name"] == name
    assert new_tensors == tensors
    new_end, new_data = _header_end(out)
    assert new_data == -(-new_end // (alignment or 32)) * (alignment or 32)
    assert api.verify(out.parent).ok


def test_a_header_padded_past_its_alignment_is_refused_before_commit(tmp_path, monkeypatch):
    """The read-back catches a writer whose data does not start where readers look for it."""
    from patcher.plan import gguf as gguf_plan

    base = _model(tmp_path / "model", None)
    before = base.read_bytes()
    encode = gguf_plan.encode_header
    monkeypatch.setattr(gguf_plan, "encode_header",
                        lambda kv, tensors, a: encode(kv, tensors, a) + b"\0" * a)
    with pytest.raises(OperationFailed, match="GGUF read-back: tensor 'token_embd.weight'"):
        api.apply(_recipe(tmp_path, "short"), base.parent, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(OperationFailed, match="GGUF read-back"):
        api.apply_in_place(_recipe(tmp_path, "short"), base.parent)
    assert base.read_bytes() == before
    assert sorted(os.listdir(base.parent)) == ["m.gguf"]


def test_verify_finds_a_file_readers_read_differently(tmp_path, monkeypatch):
    """Digests of a wrongly laid-out file agree with themselves; verify reads the layout too."""
    from patcher.gguf import task as gguf_task
    from patcher.plan import gguf as gguf_plan

    base = _model(tmp_path / "model", None)
    encode = gguf_plan.encode_header
    monkeypatch.setattr(gguf_plan, "encode_header",
                        lambda kv, tensors, a: encode(kv, tensors, a) + b"\0" * a)
    monkeypatch.setattr(gguf_task, "start_layout_check", lambda *a, **k: lambda: None)
    out = api.apply(_recipe(tmp_path, "short"), base.parent, out=tmp_path / "out").output
    report = api.verify(out)
    assert not report.ok
    assert report.layout_problems[0].startswith("m.gguf: ")
    assert "bytes follow the last tensor" in report.summary()
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1
    assert "  layout    m.gguf: " in result.output
