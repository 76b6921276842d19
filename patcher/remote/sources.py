"""Fetching the ``from:`` sources of a recipe (``patcher.recipe.sources``) when it is bound to a
model: a hub file (``hf://ORG/NAME[@REV]/PATH``), a file of a local model directory
(``model:PATH``) or a local file (``file:PATH``).

``SourceFetcher`` fetches each source once per plan and hands back the bytes with where they
really came from (the hub commit a revision resolved to, the absolute local path) and their
sha256; the plan carries those bytes, so the executor never fetches again. Every source is
capped at ``MAX_SOURCE_BYTES`` and treated as untrusted text. Hub access goes through the same
client, endpoint and token handling as ``hf://`` models (``patcher.hub.client.connection``),
with the same strict checks of the hub's answers (``patcher.remote.hub_files``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..recipe.sources import MAX_SOURCE_BYTES, Source

#: What marks the directory of a model (``model:`` sources are files of one).
MODEL_MARKERS = ("config.json", "tokenizer_config.json")


@dataclass(frozen=True)
class Fetched:
    data: bytes
    resolved: str               # hf://org/name@COMMIT/path, or the absolute local path
    sha256: str


class SourceFetcher:
    """``fetch(source)``: the bytes of a ``Source``, each fetched once (``endpoint``: the hub for
    ``hf://`` sources; default ``$HF_ENDPOINT``, then huggingface.co)."""

    def __init__(self, endpoint: str | None = None):
        self.endpoint = endpoint
        self._done: dict[tuple, Fetched] = {}
        self._repos: dict[tuple, object] = {}

    def fetch(self, source: Source) -> Fetched:
        key = (source.kind, source.repo_id, source.revision, source.path)
        if key not in self._done:
            data, resolved = (self._hub(source) if source.kind == "hub" else
                              self._model_file(source) if source.kind == "model" else
                              (_read_local(Path(source.path), source.text),
                               os.path.abspath(source.path)))
            self._done[key] = Fetched(data, resolved, hashlib.sha256(data).hexdigest())
        return self._done[key]

    def _hub(self, source: Source) -> tuple[bytes, str]:
        from .hub_files import HubFiles

        repo_key = (source.repo_id, source.revision)
        if repo_key not in self._repos:
            self._repos[repo_key] = HubFiles(source.repo_id, source.revision, self.endpoint,
                                              what="fetch")
        hub = self._repos[repo_key]
        at = f"{source.repo_id}@{hub.commit}"
        size = hub.sizes.get(source.path)
        if size is None:
            raise InputError(f"from: {source.text!r}: {at} has no file {source.path}")
        if size > MAX_SOURCE_BYTES:
            raise InputError(f"from: {source.text!r} is {size} bytes; the limit is "
                             f"{MAX_SOURCE_BYTES >> 20} MiB")
        return hub.read(source.path), f"hf://{at}/{source.path}"

    def _model_file(self, source: Source) -> tuple[bytes, str]:
        from ..model.model_dir import ModelDir

        path = Path(os.path.abspath(source.path))     # lexically: '..' cannot climb out later
        root = None
        for parent in path.parents:
            if parent.name.startswith("."):
                raise InputError(f"from: {source.text!r}: {path} is inside the dot-directory "
                                 f"{parent}, not a model's file")
            if any((parent / m).is_file() for m in MODEL_MARKERS):
                root = parent
                break
        if root is None:
            raise InputError(f"from: {source.text!r}: no model directory (one with "
                             f"{' or '.join(MODEL_MARKERS)}) holds {path}")
        rel = path.relative_to(root).as_posix()
        model = ModelDir.open(root)
        if rel not in model.files:
            raise InputError(f"from: {source.text!r}: {root} has no model file {rel} (files in "
                             "dot-directories and symlinks out of the model are not its files)")
        return _read_local(model.files[rel].path, source.text), str(path)


def _read_local(path: Path, text: str) -> bytes:
    from ..fsops import NotRegularFile, TooLarge, read_capped

    try:
        return read_capped(path, MAX_SOURCE_BYTES)
    except (FileNotFoundError, IsADirectoryError, NotRegularFile):
        raise InputError(f"from: {text!r}: no such regular file {path}") from None
    except TooLarge as exc:
        raise InputError(f"from: {text!r} is {exc.size} bytes; the limit is "
                         f"{MAX_SOURCE_BYTES >> 20} MiB") from None
    except OSError as exc:
        raise InputError(f"from: {text!r}: cannot read {path}: {exc.strerror or exc}") from None
