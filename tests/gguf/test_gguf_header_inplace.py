"""``apply --in-place`` of a GGUF whose new header fits its header region writes only that region
(``patcher.gguf.header_inplace``): journaled, kill -9 safe, revertible byte for byte; refused for
a hardlinked file or a Hugging Face cache symlink, which are rewritten whole."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from fs_snapshot import blobs, cli, copy_tree, diff, snapshot
from gguf_fixtures import needs_gguf, read_back, tiny_dir

from patcher import api
from patcher.cli import main
from patcher.execute.journal import Journal, undo_switch
from patcher.gguf.format import read_header
from patcher.integrity.patch_record import patch_dirs, read_record

pytestmark = needs_gguf
MANIFEST = "modelpatch.provenance.json"
CONTEXT = """modelpatch: 1
name: ctx
description: the context length, a value of the same size
gguf:
  metadata:
    - {set: "{arch}.context_length", value: 8192, type: uint32}
"""


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def _recipe(tmp_path: Path) -> Path:
    path = tmp_path / "ctx.yaml"
    path.write_text(CONTEXT)
    return path


def _plan_text(recipe: Path, root: Path) -> str:
    result = CliRunner().invoke(main, ["apply", str(recipe), str(root), "--in-place",
                                       "--dry-run"])
    assert result.exit_code == 0, result.output
    return result.output


def test_only_the_header_is_written_and_revert_is_byte_identical(tmp_path):
    root = tiny_dir(tmp_path)
    gguf_file = root / "tiny.gguf"
    before, data = gguf_file.read_bytes(), read_back(gguf_file)[1]
    header = read_header(gguf_file)
    recipe = _recipe(tmp_path)
    assert f"header rewritten in place ({header.data_offset} bytes)" in _plan_text(recipe, root)
    inode = gguf_file.stat().st_ino

    result = api.apply_in_place(recipe, root)
    after = gguf_file.read_bytes()
    assert gguf_file.stat().st_ino == inode and result.bytes_written == header.data_offset
    assert after[header.data_offset:] == before[header.data_offset:]
    meta, tensors = read_back(gguf_file)
    assert meta["llama.context_length"] == 8192 and tensors == data
    assert api.verify(root).ok
    subjects = json.loads((root / MANIFEST).read_text())["subject"]
    assert {"name": "tiny.gguf", "digest": {"sha256": hashlib.sha256(after).hexdigest()}} \
        in [{k: s[k] for k in ("name", "digest")} for s in subjects]
    (patch,) = patch_dirs(root)
    record = read_record(patch)
    assert record.headers == {"tiny.gguf": header.data_offset} and record.replaced == []
    assert (patch / "headers" / "tiny.gguf").read_bytes() == before[:header.data_offset]
    assert not (patch / "originals" / "tiny.gguf").exists()

    api.revert(root, out=tmp_path / "rebuilt")
    assert (tmp_path / "rebuilt" / "tiny.gguf").read_bytes() == before
    assert api.revert(root).reverted == [patch.name]
    assert gguf_file.read_bytes() == before and sorted(os.listdir(root)) == ["tiny.gguf"]


def test_revert_all_over_header_and_whole_file_rewrites(tmp_path):
    root = tiny_dir(tmp_path)
    template = tmp_path / "chat_template.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m }}<|im_end|>{% endfor %}"
                        + " " * 200)
    before = snapshot(root)
    recipe = _recipe(tmp_path)
    api.apply_in_place("gguf-chat-template", root,       # the header grows: the whole file
                       params={"template": f"file:{template}"})
    assert "header rewritten in place" in _plan_text(recipe, root)
    api.apply_in_place(recipe, root)
    assert [bool(read_record(p).headers) for p in patch_dirs(root)] == [False, True]
    assert api.verify(root).ok
    variant = api.apply("gguf-context", root, out=tmp_path / "variant").output

    api.revert(variant, out=tmp_path / "rebuilt", all_patches=True)
    assert diff(before, snapshot(tmp_path / "rebuilt")) == []
    api.revert(root, all_patches=True)
    assert diff(before, snapshot(root)) == []


def test_a_hardlinked_file_is_rewritten_whole(tmp_path):
    root = tiny_dir(tmp_path)
    gguf_file = root / "tiny.gguf"
    variant = api.apply("gguf-context", root, out=tmp_path / "variant").output  # links the base
    assert gguf_file.stat().st_nlink > 1
    shared = snapshot(variant)
    recipe = _recipe(tmp_path)
    text = _plan_text(recipe, root)
    assert "header not rewritten in place: the file has 2 hard links" in text
    assert "header rewritten in place (" not in text
    api.apply_in_place(recipe, root)
    assert read_record(patch_dirs(root)[-1]).headers == {}
    assert diff(shared, snapshot(variant)) == [] and api.verify(variant).ok
    assert read_back(gguf_file)[0]["llama.context_length"] == 8192


def test_a_hugging_face_cache_symlink_is_rewritten_whole(tmp_path):
    from examples.generate import make_hf_cache_snapshot

    root = make_hf_cache_snapshot(tiny_dir(tmp_path), tmp_path / "hub", "org/tiny-GGUF")
    repo = root.parents[1]
    before, blobs_before = snapshot(root), blobs(repo)
    recipe = _recipe(tmp_path)
    assert "header not rewritten in place: the file is a symlink" in _plan_text(recipe, root)
    api.apply_in_place(recipe, root)
    assert not (root / "tiny.gguf").is_symlink() and blobs(repo) == blobs_before
    api.revert(root)
    assert diff(before, snapshot(root)) == [] and blobs(repo) == blobs_before


@pytest.mark.parametrize("point", ["header:tiny.gguf:half", "journal:header:tiny.gguf:taken"])
def test_the_journal_undoes_a_header_write(tmp_path, point):
    """The undo side of the step (a switch that cannot go forward rolls back): the base's bytes
    are written back over a half- or wholly written header."""
    root = tiny_dir(tmp_path)
    before, original = snapshot(root), (root / "tiny.gguf").read_bytes()
    env = {"MODELPATCH_FAULT": f"kill@{point}", "MODELPATCH_CACHE_DIR": str(tmp_path / "dc")}
    assert cli("apply", _recipe(tmp_path), root, "--in-place", env=env).returncode == -9
    if point.endswith(":taken"):
        assert (root / "tiny.gguf").read_bytes() != original
    undo_switch(root, Journal.load(root))
    assert diff(before, snapshot(root)) == []


# -- kill -9 at every instant ------------------------------------------------------------------

SAMPLED = ("inplace:prepared", "journal:header:tiny.gguf", "header:tiny.gguf:half",
           "journal:header:tiny.gguf:taken", "journal:finish")


def _trace(args: list, template: Path, case: Path) -> tuple[list[tuple[str, int]], dict]:
    root = copy_tree(template, case / "t")
    trace = case / "trace.txt"
    r = cli(*[a(root) if callable(a) else a for a in args],
            env={"MODELPATCH_FAULT_TRACE": str(trace), "MODELPATCH_CACHE_DIR": str(case / "dc")})
    assert r.returncode == 0, r.stderr
    counts: dict[str, int] = {}
    points = []
    for name in trace.read_text().splitlines():
        counts[name] = counts.get(name, 0) + 1
        points.append((name, counts[name]))
    return points, snapshot(root, vary=(MANIFEST, "record.json"))


def _kill_everywhere(tmp_path: Path, args: list, template: Path, wanted) -> list[str]:
    points, after = _trace(args, template, tmp_path / "trace")
    before = snapshot(template, vary=(MANIFEST, "record.json"))
    chosen = [(p, n) for p, n in points if wanted(p)]
    assert chosen, points
    problems = []
    for i, (point, nth) in enumerate(chosen):
        case = tmp_path / f"c{i}"
        root = copy_tree(template, case / "t")
        env = {"MODELPATCH_FAULT": f"kill@{point}#{nth}", "MODELPATCH_CACHE_DIR": str(case / "dc")}
        argv = [a(root) if callable(a) else a for a in args]
        if cli(*argv, env=env).returncode != -9:
            problems.append(f"{point}#{nth}: not killed")
            continue
        recovered = cli("verify", root, env={"MODELPATCH_CACHE_DIR": str(case / "dc")})
        state = snapshot(root, vary=(MANIFEST, "record.json"))
        if diff(state, before) and diff(state, after):
            problems.append(f"{point}#{nth}: neither state: {diff(state, after)[:3]}")
            continue
        if state == after and MANIFEST in after and recovered.returncode != 0:
            problems.append(f"{point}#{nth}: verify after recovery: {recovered.stdout}")
        if state == before:
            rerun = cli(*argv, env={"MODELPATCH_CACHE_DIR": str(case / "dc")})
            if rerun.returncode != 0 or snapshot(root, vary=(MANIFEST, "record.json")) != after:
                problems.append(f"{point}#{nth}: rerun: {rerun.stderr}")
    return problems


def _templates(tmp_path: Path) -> tuple[Path, Path, Path]:
    base = tiny_dir(tmp_path, name="base")
    recipe = _recipe(tmp_path)
    patched = copy_tree(base, tmp_path / "patched")
    api.apply_in_place(recipe, patched)
    return base, patched, recipe


def _sampled(point: str) -> bool:
    return point in SAMPLED or point.startswith("revert:")


@pytest.mark.parametrize("what", ["apply", "revert"])
def test_kill_9_at_sampled_points(tmp_path, what):
    base, patched, recipe = _templates(tmp_path)
    if what == "apply":
        args, template = ["apply", recipe, lambda r: r, "--in-place"], base
    else:
        args, template = ["revert", lambda r: r], patched
    assert _kill_everywhere(tmp_path, args, template, _sampled) == []


@pytest.mark.slow
@pytest.mark.parametrize("what", ["apply", "revert"])
def test_kill_9_at_every_point(tmp_path, what):
    base, patched, recipe = _templates(tmp_path)
    if what == "apply":
        args, template = ["apply", recipe, lambda r: r, "--in-place"], base
    else:
        args, template = ["revert", lambda r: r], patched
    assert _kill_everywhere(tmp_path, args, template, lambda p: True) == []


@pytest.mark.parametrize("headers, replaced", [({"tiny.gguf": 0}, []), ({"tiny.gguf": True}, []),
                                               ({"../x": 10}, []), ({"other": 10}, []),
                                               ({"tiny.gguf": 10}, ["tiny.gguf"])])
def test_a_malformed_headers_entry_is_refused(headers, replaced):
    from patcher.errors import InputError
    from patcher.integrity.patch_record import PatchRecord

    data = {"sequence": 1, "recipe": {"name": "ctx", "sha256": "0" * 64}, "mode": "in-place",
            "base_files": {"tiny.gguf": {"sha256": "0" * 64, "size": 100, "mode": 0o644}},
            "replaced": replaced, "added": [], "headers": headers}
    with pytest.raises(InputError, match="malformed patch record"):
        PatchRecord.from_json(data, "record.json")
