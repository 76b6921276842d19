"""One typed error hierarchy. Every error knows its one-line, user-facing message and exit code.

The CLI turns any ``PatchError`` into ``modelpatch: error: <message>`` on stderr and exits with
``exit_code``; nothing else prints tracebacks (unless ``--debug``).

Exit codes (docs/architecture.md §3): 0 success; 1 verification mismatch or a recipe guard
refused the model; 2 bad usage or bad input; 3 the operation failed for a reason outside the
input (I/O error, full disk, lock held by another process).
"""

from __future__ import annotations

import os


class PatchError(Exception):
    """Root of every error modelpatch raises on purpose.

    ``where`` is the file (optionally ``file:line:col``) the problem is in; ``tensor`` names the
    tensor; ``hint`` suggests the fix. ``str(err)`` is the one-line message.
    """

    exit_code = 2

    def __init__(self, message: str, *, where: str | os.PathLike | None = None,
                 tensor: str | None = None, hint: str | None = None):
        self.message = message
        self.where = os.fspath(where) if where is not None else None
        self.tensor = tensor
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts = []
        if self.where:
            parts.append(f"{self.where}: ")
        if self.tensor:
            parts.append(f"tensor {self.tensor!r}: ")
        parts.append(self.message)
        if self.hint:
            parts.append(f" ({self.hint})")
        return "".join(parts).replace("\n", " ")


class InputError(PatchError):
    """Bad input: a model directory, a file in it, or a command-line argument."""


class SafetensorsFormatError(InputError):
    """A safetensors file whose header or layout breaks the format."""


class GGUFFormatError(InputError):
    """A GGUF file that is not well formed."""


class XetFormatError(InputError):
    """Xet storage bytes (a xorb, a shard, a hash string) that are malformed or inconsistent."""


class XetHashFormatError(XetFormatError):
    """A Xet hash string that is not 64 lowercase hexadecimal digits."""


class ShardIndexError(InputError):
    """The shard index (model.safetensors.index.json) disagrees with the shards."""


class ModelDirError(InputError):
    """A model directory that cannot be read safely (missing files, escaping symlinks, bad JSON)."""


class RecipeError(InputError):
    """A recipe that is malformed. ``where`` is ``recipe.yaml:LINE:COL``."""


class UnsafeName(InputError):
    """A name from outside (a hub's listing, ETag or oid, a revision, a recipe or rule path) that
    is not a plain relative name: absolute, ``..``, NUL, a dot-directory, over-long."""


class PlanError(InputError):
    """A recipe that is well formed but cannot be applied to this model as written
    (an operation on a missing path, an empty tensor selection, a rename collision...)."""


class NumericError(InputError):
    """A tensor's values cannot be computed without damage (overflow to inf, non-finite input)."""


class GuardRefused(PatchError):
    """A recipe guard (``requires``) does not hold for the model."""

    exit_code = 1


class NothingToChange(PatchError):
    """The plan changes nothing: the variant would equal the base (a typo in a recipe path, or a
    model that already has the fix). Refused unless the caller allows a no-op."""

    exit_code = 1


class VerifyMismatch(PatchError):
    """A directory does not match its provenance manifest."""

    exit_code = 1


class OperationFailed(PatchError):
    """The operation failed for a reason outside the input: I/O error, full disk, a lock held."""

    exit_code = 3


class LockHeld(OperationFailed):
    """Another modelpatch process is working on the same directory."""


class HubError(OperationFailed):
    """A hub request failed (network, auth, missing repository)."""


# --- internal: raised and caught inside modelpatch, never shown as they are -----------------


class CompanionError(ValueError):
    """A companion tensor of a quantized weight is missing or has the wrong dtype or shape; the
    planner turns it into a ``PlanError`` naming the tensor."""


class NotThisScheme(CompanionError):
    """The weight itself (its name, dtype or rank) is not stored the way the scheme stores it."""


class YamlProblems(Exception):
    """Problems found in a recipe before composing its YAML: a list of (line, col, message),
    1-based; the recipe loader turns them into a ``RecipeError``."""

    def __init__(self, problems: list[tuple[int, int, str]]):
        super().__init__(problems)
        self.problems = problems


class TemplateError(ValueError):
    """A recipe ``{reference}`` template that cannot be parsed or evaluated; the recipe loader
    turns it into a ``RecipeError`` and the binder into a ``PlanError``, both naming the line."""


class ShardStopped(Exception):
    """Raised in a shard-writing thread told to stop: the apply fails for another reason (the
    one reported), or was interrupted."""
