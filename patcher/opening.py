"""Models opened for a command, one way for every command of ``patcher.api``: a directory
(an interrupted in-place operation finished or undone first), one ``.gguf`` file (the view of
its directory holding that model), or ``hf://ORG/NAME[@REV]`` (``patcher.model_ref``), read
from the hub without its tensor data or resolved through the Hugging Face cache."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ModelDirError
from .model_ref import ModelRef

if TYPE_CHECKING:       # the header readers load with the first model opened, not with `sign`
    from .model.model_dir import ModelDir

log = logging.getLogger("modelpatch")


def recover(directory: str | os.PathLike) -> str | None:
    """Finish or undo an in-place operation a crash interrupted in ``directory``.

    Every command calls this first; it returns a sentence saying what it did, or None.
    """
    from .execute.journal import pending
    from .execute.journal import recover as recover_journal
    from .execute.locking import lock_directory

    root = Path(directory)
    if not pending(root):       # a journal, or the leftovers of an interrupted one
        return None
    with lock_directory(root, exclusive=True):
        return recover_journal(root)


def recovered(directory: str | os.PathLike) -> None:
    """Finish or undo an interrupted in-place operation, saying which on the log."""
    if Path(directory).is_dir():
        done = recover(directory)
        if done:
            log.warning("%s: %s", directory, done)


def open_local(model: str | os.PathLike) -> ModelDir:
    """The model directory, or for a .gguf file the view holding just that model
    (``patcher.gguf.single_file``, which says what each command does with one)."""
    from .gguf.single_file import model_directory

    recovered(model_directory(model))
    return open_recovered(model)


def open_recovered(model: str | os.PathLike) -> ModelDir:
    """``open_local`` for a caller that has recovered the directory (under its lock)."""
    from .gguf.single_file import is_gguf_file, open_gguf_file
    from .model.model_dir import ModelDir

    if str(model).endswith(".gguf") and not os.path.isdir(model) and not is_gguf_file(model):
        raise ModelDirError("no such file" if not os.path.lexists(model) else
                            "not a regular file", where=model)
    return open_gguf_file(model) if is_gguf_file(model) else ModelDir.open(model)


def output_for(model: str | os.PathLike, base: ModelDir, recipe_name: str,
               out: str | os.PathLike | None) -> Path:
    """Where an apply of ``recipe_name`` to ``model`` writes: ``out``, else the default
    beside the model (for a .gguf file, the directory beside the file)."""
    from .execute.engine import default_output
    from .gguf import single_file

    if base.subset:
        single_file.check_output(out)
    if out is not None:
        return Path(out)
    if base.subset:
        return single_file.default_output(model, recipe_name)
    return default_output(base.root, recipe_name)


def open_model(model: str | os.PathLike, *, endpoint: str | None = None,
               what: str = "inspect") -> ModelDir:
    """A local model directory, or ``hf://org/name[@rev]`` read from the hub (``endpoint``)
    without its tensor data (``patcher.remote.model.RemoteModel``; ``what``: the command its
    hub errors name)."""
    from .remote.model import RemoteModel

    if ModelRef.parse(model).is_hub:
        return RemoteModel.open(str(model), endpoint=endpoint, what=what)
    return open_local(model)


def resolve_model(model: str | os.PathLike, *, endpoint: str | None = None,
                  progress: bool = True, on_progress=None) -> Path:
    """A model directory; ``hf://org/name[@rev]`` is resolved through the huggingface_hub cache
    (downloaded if needed) to its snapshot directory. The endpoint defaults to ``$HF_ENDPOINT``
    (a malformed one is an ``InputError``); ``progress=False``: only huggingface_hub's errors
    are logged; ``on_progress(bytes)`` counts what the download adds to the cache."""
    ref = ModelRef.parse(model)
    if not ref.is_hub:
        return Path(ref.text)
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.file_download import repo_folder_name

    from .hub.client.connection import client, hub_call, hub_output
    from .hub.client.growth import reported_growth
    from .model.model_dir import BASE_RECORD

    hub = client(endpoint)
    cached = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref.repo_id,
                                                            repo_type="model")
    # Without a base's digest record: the hub's, not the model's.
    with hub_output(progress), reported_growth(cached, on_progress):
        return Path(hub_call("download", ref.repo_id, snapshot_download, ref.repo_id,
                             revision=ref.revision, endpoint=hub.endpoint, token=hub.token,
                             ignore_patterns=[BASE_RECORD]))


def local_model(model: str | os.PathLike, out: str | os.PathLike | None, recipe_name: str, *,
                endpoint: str | None = None, in_place: bool = False
                ) -> tuple[str | os.PathLike, str | os.PathLike | None]:
    """``(model, out)`` for an apply, as ``apply`` reads its MODEL: ``hf://ORG/NAME[@REV]``
    downloaded through the Hugging Face cache (``resolve_model``) and, out of place unless
    ``out`` is given, written to ``NAME-<recipe>`` in the current directory (never beside the
    snapshot); in place, the snapshot itself is patched (revertibly, its blobs untouched). A
    local model as given."""
    ref = ModelRef.parse(model)
    if not ref.is_hub:
        return model, out
    snapshot = resolve_model(ref, endpoint=endpoint, progress=False)
    if in_place or out is not None:
        return str(snapshot), out
    return str(snapshot), f"{ref.name}-{recipe_name}"


def require_model(opened: ModelDir) -> bool:
    """Refuse a directory with neither a config.json nor a safetensors file at its top, nor a
    GGUF file (GGUF repositories keep quantizations in subfolders): that is not a model (a
    report of it would find nothing wrong), a folder of models (``examples/out``) included,
    whose hint names them. Returns whether it holds GGUF."""
    has_gguf = any(rel.endswith(".gguf") for rel in opened.files)
    top = [rel for rel in opened.files if "/" not in rel]
    if not (has_gguf or "config.json" in top or any(rel.endswith(".safetensors")
                                                    for rel in top)):
        inside = sorted(rel.rsplit("/", 1)[0] for rel in opened.files
                        if rel.endswith("/config.json"))
        hint = (f"models in subdirectories: {', '.join(inside[:3])}"
                f"{', ...' if len(inside) > 3 else ''}" if inside else None)
        raise ModelDirError("not a model directory (no config.json, no *.safetensors, no "
                            "*.gguf)", where=opened.root, hint=hint)
    return has_gguf
