"""What a MODEL argument names, parsed in one place: a model directory, one ``.gguf`` file, or a
repository on a hub (``hf://ORG/NAME[@REVISION]``).

Every command, the library's API and ``doctor --fix`` read a MODEL through ``ModelRef.parse``:
the scheme, the repository id and revision, and the name a default output takes from it are
decided here only.

Example:
    >>> ref = ModelRef.parse("hf://org/base@main")
    >>> (ref.kind.value, ref.repo_id, ref.revision, ref.name)
    ('hub', 'org/base', 'main', 'base')
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from .errors import InputError

HF_SCHEME = "hf://"

REPO_ID_HINT = ("expected NAMESPACE/NAME: letters, digits, '-', '_' and '.', at most 96, "
                "no '--' or '..'")


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if huggingface_hub accepts it (``NAME`` or ``NAMESPACE/NAME``); otherwise an
    ``InputError`` (exit code 2) naming it, before any request."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise InputError(f"invalid repo id {repo_id!r}", hint=REPO_ID_HINT) from None
    return repo_id


class ModelKind(str, enum.Enum):
    DIRECTORY = "directory"
    GGUF_FILE = "gguf-file"
    HUB = "hub"


@dataclass(frozen=True)
class ModelRef:
    """A parsed MODEL: ``text`` as given, its ``kind``, and for a hub repository its
    ``repo_id`` and ``revision`` (None: the default branch)."""

    text: str
    kind: ModelKind
    repo_id: str | None = None
    revision: str | None = None

    @classmethod
    def parse(cls, model: str | os.PathLike | ModelRef) -> ModelRef:
        """``hf://ORG/NAME[@REVISION]`` (refused in one line unless exactly that, with a repo id
        huggingface_hub accepts), a path ending in ``.gguf`` that is not a directory, or a
        directory. Whether a path exists is for the command that opens it to say."""
        if isinstance(model, ModelRef):
            return model
        text = os.fspath(model)
        if not text.startswith(HF_SCHEME):
            kind = ModelKind.GGUF_FILE if text.endswith(".gguf") and not os.path.isdir(text) \
                else ModelKind.DIRECTORY
            return cls(text, kind)
        repo_id, at, revision = text[len(HF_SCHEME):].partition("@")
        if repo_id.count("/") != 1 or (at and not revision):
            raise InputError(f"{text!r} is not hf://ORG/NAME[@REVISION]")
        from .names import checked_revision

        return cls(text, ModelKind.HUB, check_repo_id(repo_id),
                   checked_revision(revision, what=f"the revision of {text!r}") if revision
                   else None)

    @property
    def is_hub(self) -> bool:
        return self.kind is ModelKind.HUB

    @property
    def name(self) -> str:
        """The model's own name, for a default output (``<name>-<recipe>``): a hub
        repository's NAME, else the file or directory name."""
        if self.is_hub:
            return self.repo_id.split("/")[-1]          # type: ignore[union-attr]
        return os.path.basename(os.path.normpath(self.text))

    def __str__(self) -> str:
        return self.text


def is_hub(model: object) -> bool:
    """Whether ``model`` is an ``hf://`` reference (without parsing the rest)."""
    return isinstance(model, (str, ModelRef)) and str(model).startswith(HF_SCHEME)
