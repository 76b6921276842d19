"""A .gguf file given as MODEL: the model is that file (or its whole split set), nothing else.

What each command does with ``MODEL = DIR/NAME.gguf``:

- ``plan`` / ``apply``: the base is a view of ``DIR`` holding only that model's files, so a
  directory of many quantizations (the usual GGUF repository) is patched one file at a time. The
  variant is a directory, ``-o OUT`` (default ``DIR/NAME-<recipe>/``), holding ``NAME.gguf`` and
  its manifest ``modelpatch.provenance.json``: llama.cpp takes ``-m OUT/NAME.gguf``, an Ollama
  Modelfile ``FROM OUT/NAME.gguf``. ``-o X.gguf`` is refused: the manifest needs a directory.
- ``apply --in-place``: the manifest and the revert data live beside the file, in ``DIR``, so
  ``DIR`` must hold no other GGUF model (an mmproj or adapter beside it is fine).
- ``verify`` / ``revert`` / ``publish``: the directory holding the file (and its manifest).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from ..model.model_dir import ModelDir, cache_link_targets, hf_cache_repo, model_file
from ..model_ref import is_hub
from .files import SPLIT_NAME, gguf_models


def is_gguf_file(model) -> bool:
    """Whether ``model`` (a path or ``hf://...``) names an existing .gguf file."""
    text = os.fspath(model)
    return text.endswith(".gguf") and not is_hub(text) and Path(text).is_file()


def model_directory(model) -> Path:
    """The directory a command works on: ``model`` itself, or the directory of a .gguf file."""
    path = Path(model)
    return path.parent if is_gguf_file(model) else path


def open_gguf_file(path: str | os.PathLike) -> ModelDir:
    """A ``ModelDir`` of the file's directory that holds only the file, or the files of its
    split set (``NAME-00001-of-0000N.gguf``, any member named). The split set's own checks
    (every file present, keys consistent) run when it is planned."""
    path = Path(path)
    root = path.parent
    names = [path.name]
    m = SPLIT_NAME.fullmatch(path.name)
    if m:
        count = int(m["count"])
        names = [f"{m['stem']}-{no:05d}-of-{m['count']}.gguf" for no in range(1, count + 1)]
        names = [n for n in names if os.path.lexists(root / n)]
    cache_repo = hf_cache_repo(root)
    allowed = [os.path.realpath(root)] + cache_link_targets(root)
    files = {name: model_file(root / name, name, allowed) for name in names}
    return ModelDir(root=root, files=files, shards={}, index=None, cache_repo=cache_repo,
                    subset=True)


def default_output(path: str | os.PathLike, recipe_name: str) -> Path:
    """``DIR/NAME-<recipe>/`` for ``DIR/NAME.gguf`` (``NAME`` without the split suffix); in the
    current directory for a file of a Hugging Face cache snapshot (the cache stays the hub's)."""
    path = Path(os.path.abspath(path))
    m = SPLIT_NAME.fullmatch(path.name)
    stem = m["stem"] if m else path.name[:-len(".gguf")]
    where = Path.cwd() if hf_cache_repo(path.parent) else path.parent
    return where / f"{stem}-{recipe_name}"


def check_output(out) -> None:
    """Refuse ``-o X.gguf``: the variant is a directory holding the file and its manifest."""
    if out is not None and os.fspath(out).endswith(".gguf"):
        raise InputError("-o names the output directory, which will hold the .gguf file and its "
                         "manifest (modelpatch.provenance.json)", where=out,
                         hint=f"-o {os.fspath(out)[:-len('.gguf')]}")


def check_in_place(path: str | os.PathLike) -> None:
    """Refuse an in-place patch of a .gguf file whose directory holds another GGUF model: the
    manifest and revert data are kept per directory and would cover (and patch) it too."""
    path = Path(path)
    own = set(open_gguf_file(path).files)
    others = [gm.files[0] for gm in gguf_models(ModelDir.open(path.parent))
              if gm.first.get("general.type") in (None, "model") and not set(gm.files) & own]
    if others:
        raise InputError(f"--in-place keeps the manifest and revert data per directory, and "
                         f"{path.parent} also holds the GGUF model {others[0]}", where=path,
                         hint="apply out of place (-o DIR), or move the file into a directory "
                              "of its own")
