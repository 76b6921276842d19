"""A GGUF rewrite reads its bytes once: the tensor data is copied by the kernel and hashed in the
same pass, and the read-back that checks the layout reads the header only (gguf-py's GGUFReader
maps the file; no tensor byte of the output is read again)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf_fixtures import needs_gguf, read_back, write_tiny

from patcher import api
from patcher.cli import main
from patcher.errors import OperationFailed
from patcher.gguf.readback import check_written, written_layout

pytestmark = needs_gguf

RECIPE = ("modelpatch: 1\nname: ctx\ndescription: context length\ngguf:\n  metadata:\n"
          "    - {set: \"{arch}.context_length\", value: 8192, type: uint32}\n")


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _reads_by_inode(monkeypatch) -> dict[int, int]:
    """Bytes read with ``os.read``/``os.preadv``/``os.pread``, per inode, from now on."""
    reads: dict[int, int] = {}

    def spy(fn):
        def wrapped(fd, *args):
            got = fn(fd, *args)
            n = got if isinstance(got, int) else len(got)
            ino = os.fstat(fd).st_ino
            reads[ino] = reads.get(ino, 0) + n
            return got
        return wrapped

    for name in ("read", "preadv", "pread"):
        monkeypatch.setattr(os, name, spy(getattr(os, name)))
    return reads


def test_the_output_is_never_read_back_in_full(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    base = write_tiny(tmp_path / "model" / "m.gguf")
    recipe = tmp_path / "ctx.yaml"
    recipe.write_text(RECIPE)
    reads = _reads_by_inode(monkeypatch)
    out = api.apply(recipe, base.parent, out=tmp_path / "out").output / "m.gguf"
    monkeypatch.undo()
    meta, tensors = read_back(out)
    assert meta["llama.context_length"] == 8192
    assert tensors == read_back(base)[1]
    # the read-back reads the header (GGUFReader maps it); the data of the output is not read
    assert reads.get(out.stat().st_ino, 0) == 0
    assert api.verify(out.parent).ok


def test_the_base_digest_comes_from_the_copying_pass(tmp_path, monkeypatch):
    """An unknown base digest is taken from the bytes the copy hashes: the base is read once
    (its header by the planner, the rest from the mapped windows the copy hashes)."""
    (tmp_path / "model").mkdir()
    base = write_tiny(tmp_path / "model" / "m.gguf")
    recipe = tmp_path / "ctx.yaml"
    recipe.write_text(RECIPE)
    reads = _reads_by_inode(monkeypatch)
    result = api.apply(recipe, base.parent, out=tmp_path / "out")
    monkeypatch.undo()
    assert reads.get(base.stat().st_ino, 0) < base.stat().st_size
    assert result.output.joinpath("m.gguf").is_file()


def test_the_read_back_refuses_a_layout_readers_read_differently(tmp_path):
    path = write_tiny(tmp_path / "m.gguf")
    from gguf import GGUFReader

    reader = GGUFReader(path)
    header = int(reader.data_offset)
    copies = [(t.name, str(path), header + int(t.data_offset) - header, int(t.n_bytes),
               0) for t in reader.tensors]
    right = [(t.name, int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]
    check_written(path, right)
    assert written_layout(header, copies[:1]) == right[:1]
    moved = [right[0]] + [(n, o + 32, s) for n, o, s in right[1:]]
    with pytest.raises(OperationFailed, match="is read from byte"):
        check_written(path, moved)
    with pytest.raises(OperationFailed, match="a reader finds the tensors"):
        check_written(path, list(reversed(right)))
    shorter = [(right[0][0], right[0][1], right[0][2] - 1)] + right[1:]
    with pytest.raises(OperationFailed, match="bytes, .* were written"):
        check_written(path, shorter)
    assert Path(path).is_file()


def _later(monkeypatch, seconds: float = 10.0) -> None:
    """The clock of ``patcher.gguf.format`` moved on: files written now are at rest."""
    import time

    from patcher.gguf import format as gguf_format

    monkeypatch.setattr(gguf_format, "_now_ns", lambda: time.time_ns() + int(seconds * 1e9))


def test_a_header_is_parsed_once_while_the_file_is_the_same(tmp_path, monkeypatch):
    from patcher.gguf import format as gguf_format

    path = write_tiny(tmp_path / "m.gguf")
    racy = gguf_format.read_header(path)
    assert gguf_format.read_header(path) is not racy      # just written: not remembered
    _later(monkeypatch)
    first = gguf_format.read_header(path)
    assert gguf_format.read_header(path) is first
    data = bytearray(path.read_bytes())
    path.unlink()
    path.write_bytes(bytes(data))                           # a new inode, the same bytes
    assert gguf_format.read_header(path) is not first
    monkeypatch.undo()


def test_an_in_place_header_rewrite_parses_the_base_header_once(tmp_path, monkeypatch):
    from patcher.gguf import format as gguf_format

    (tmp_path / "model").mkdir()
    base = write_tiny(tmp_path / "model" / "m.gguf")
    recipe = tmp_path / "ctx.yaml"
    recipe.write_text(RECIPE)
    _later(monkeypatch)
    sizes = []
    parse = gguf_format.parse_header
    monkeypatch.setattr(gguf_format, "parse_header",
                        lambda data, size, *a, **k: sizes.append(size) or parse(data, size, *a,
                                                                                  **k))
    result = CliRunner().invoke(main, ["-q", "apply", str(recipe), str(base), "--in-place"])
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    # the base's header (for the in-place check and the plan), then the new one (check_header)
    assert len(sizes) == 2
    assert read_back(base)[0]["llama.context_length"] == 8192


def test_a_base_that_changes_while_it_is_copied_is_refused(tmp_path, monkeypatch):
    """The output is not read back to compare with its source, so a source changed during the
    copy (the hashed and the copied bytes may differ) is caught from its status instead."""
    from patcher.integrity.digests import hash_writer

    (tmp_path / "model").mkdir()
    base = write_tiny(tmp_path / "model" / "m.gguf")
    recipe = tmp_path / "ctx.yaml"
    recipe.write_text(RECIPE)
    real = hash_writer.hash_while_copying

    def touching(src_fd, *args, **kwargs):
        done = real(src_fd, *args, **kwargs)
        os.utime(base)                          # the base changes (its mtime and ctime move)
        return done

    monkeypatch.setattr(hash_writer, "hash_while_copying", touching)
    with pytest.raises(OperationFailed, match="changed while it was copied"):
        api.apply(recipe, base.parent, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_reading_a_header_does_not_import_numpy_and_gguf_shares_its_constants(tmp_path):
    """The header parser needs gguf-py's constants only: they are loaded without the package
    (numpy, readers, writers); a later ``import gguf`` uses the same module."""
    import subprocess
    import sys

    path = write_tiny(tmp_path / "m.gguf")
    code = ("import sys\nfrom patcher.gguf.format import read_header\n"
            "from patcher.gguf_py import gguf_constants, require_gguf\n"
            f"header = read_header({str(path)!r})\n"
            "assert 'numpy' not in sys.modules and 'gguf' not in sys.modules, sorted(sys.modules)\n"
            "c = gguf_constants()\ng = require_gguf()\n"
            "assert g.constants is c and g.GGMLQuantizationType is c.GGMLQuantizationType\n"
            "assert {t.type_name for t in header.tensors.values()} <= {'F32', 'F16', 'Q8_0'}\n"
            "print(len(header.tensors))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(read_back(path)[1])


def test_the_write_out_is_started_beside_the_hashing(tmp_path, monkeypatch):
    """sync_file_range may block on a busy disk: it is called from a thread of its own."""
    import threading

    from patcher.tensors.writing import shard_writer

    (tmp_path / "model").mkdir()
    base = write_tiny(tmp_path / "model" / "m.gguf")
    recipe = tmp_path / "ctx.yaml"
    recipe.write_text(RECIPE)
    threads = set()
    real = shard_writer.Writeback.__call__

    def spy(self, position):
        threads.add(threading.current_thread().name)
        return real(self, position)

    monkeypatch.setattr(shard_writer.Writeback, "__call__", spy)
    api.apply(recipe, base.parent, out=tmp_path / "out")
    assert threads and all(name.startswith("write-out") for name in threads)
