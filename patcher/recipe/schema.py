"""The typed form of a recipe: frozen dataclasses produced by ``patcher.recipe.load.load_recipe``.

Every operation and condition carries ``loc``, the ``file:line:col`` of the recipe item it came
from, so that errors and the provenance change log can point at the recipe line.

Values taken from the recipe (``SetOp.value``, ``Check.expected``...) are plain JSON values:
``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``. Treat them as read-only.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from ..config.json_pointer import join_pointer
from .tensor_ops.schema import (  # noqa: F401  (re-exported: the whole typed recipe)
    DEFAULT_BLOCK,
    DEQUANT_SCHEMES,
    FLOAT_TARGETS,
    LAYER_COMPARISONS,
    LAYER_RE,
    QUANT_COMBINATIONS,
    QUANT_LAYOUTS,
    QUANT_SCHEMES,
    SAFETENSORS_DTYPES,
    CastTensors,
    CopyTensors,
    DequantizeTensors,
    DropTensors,
    QuantizeTensors,
    RenameTensors,
    TensorAction,
    TensorOp,
    TensorSelect,
)

RECIPE_FORMAT_VERSIONS = (1,)


# ---------------------------------------------------------------------------------- guards

@dataclass(frozen=True)
class Check:
    """A leaf condition: ``{file, path, <predicate>: expected}``.

    ``predicate`` is ``exists`` (expected: bool), ``equals`` (any JSON value), ``contains`` (an
    array holds an element equal to expected, or a string holds expected as a substring) or
    ``one_of`` (expected: list of values). ``scopes``: the condition holds if it holds with
    ``path`` read inside ANY of these pointers (``("",)``: the document root).
    """

    file: str
    path: str
    predicate: str
    expected: Any
    scopes: tuple[str, ...]
    message: str | None
    loc: str


@dataclass(frozen=True)
class AnyOf:
    conditions: tuple["Condition", ...]
    scopes: tuple[str, ...]
    message: str | None
    loc: str


@dataclass(frozen=True)
class AllOf:
    conditions: tuple["Condition", ...]
    scopes: tuple[str, ...]
    message: str | None
    loc: str


@dataclass(frozen=True)
class Not:
    condition: "Condition"
    scopes: tuple[str, ...]
    message: str | None
    loc: str


Condition = Union[Check, AnyOf, AllOf, Not]


# ---------------------------------------------------------------------------- config ops
# ``scopes`` on every config op: the op applies with its pointers read inside each scope in turn
# (``("",)``: the document root only). Scopes that do not exist in the document are skipped.

@dataclass(frozen=True)
class DropOp:
    """Remove ``path``. A path missing from every scope is a PlanError unless ``missing_ok``."""

    path: str
    scopes: tuple[str, ...]
    missing_ok: bool
    loc: str
    kind = "drop"


@dataclass(frozen=True)
class SetOp:
    """Set ``path`` to ``value``, creating missing parent objects unless ``create_parents`` is
    False (then a missing parent is an error). ``label`` is the friendly key the op was written
    with (``set``, ``architectures`` or ``model_type``)."""

    path: str
    value: Any
    scopes: tuple[str, ...]
    loc: str
    label: str = "set"
    create_parents: bool = True
    # ``from:`` instead of ``value:`` (patcher.recipe.sources): fetched when bound, then
    # ``value`` holds the content and ``source`` where it came from and its sha256
    fetch: Any = None
    sha256: Any = None
    source: dict | None = None
    kind = "set"


@dataclass(frozen=True)
class RenameOp:
    """Move the value at ``path`` to ``to`` (a key renamed in the same object keeps its place).
    The target must not exist and its parent must. A source missing from every scope is a PlanError
    unless ``missing_ok``."""

    path: str
    to: str
    scopes: tuple[str, ...]
    missing_ok: bool
    loc: str
    kind = "rename"


# The RFC 6902 operations and the key each needs besides op and path (None: none).
PATCH_OP_OPERAND = {"add": "value", "remove": None, "replace": "value", "move": "from",
                    "copy": "from", "test": "value"}


@dataclass(frozen=True)
class PatchOp:
    """One RFC 6902 operation, applied through the ``jsonpatch`` library. ``value`` is meaningful
    for add/replace/test, ``from_path`` for move/copy. ``missing_ok`` (remove, replace, move,
    copy): skip the scopes where the path the op reads (``from`` for move/copy) is missing, instead
    of failing as RFC 6902 does."""

    op: str
    path: str
    value: Any
    from_path: str | None
    scopes: tuple[str, ...]
    loc: str
    missing_ok: bool = False
    kind = "patch"
    MISSING_OK_OPS = ("remove", "replace", "move", "copy")

    def read_path(self) -> str:
        """The pointer this op needs to exist (``from`` for move/copy)."""
        return self.from_path if self.op in ("move", "copy") and self.from_path else self.path

    def as_json_patch(self, scope: str = "") -> dict[str, Any]:
        """The RFC 6902 operation object, pointers read inside ``scope``."""
        out: dict[str, Any] = {"op": self.op, "path": join_pointer(scope, self.path)}
        if PATCH_OP_OPERAND[self.op] == "value":
            out["value"] = self.value
        if PATCH_OP_OPERAND[self.op] == "from":
            if self.from_path is None:
                raise ValueError(f"{self.loc}: a {self.op} operation needs 'from'")
            out["from"] = join_pointer(scope, self.from_path)
        return out


@dataclass(frozen=True)
class ArrayOp:
    """An element op on the JSON array at ``path``: ``map`` (``re.sub(regex, to, element)`` on
    each string element the regex matches), ``filter`` (remove the string elements matching a
    glob or regex) or ``append`` (add ``value`` unless an equal element is there). A map or filter
    that matches no element is a PlanError unless ``allow_empty``."""

    action: str                     # map, filter, append
    path: str
    globs: tuple[str, ...]
    regexes: tuple[str, ...]
    to: str | None
    value: Any
    scopes: tuple[str, ...]
    missing_ok: bool
    allow_empty: bool
    loc: str
    kind = "each"

    def matches(self, element: Any) -> bool:
        if not isinstance(element, str):
            return False
        if self.globs:
            return any(fnmatch.fnmatchcase(element, g) for g in self.globs)
        return any(re.search(r, element) for r in self.regexes)


ConfigOp = Union[DropOp, SetOp, RenameOp, PatchOp, ArrayOp]


# ------------------------------------------------------------------------------ file ops

@dataclass(frozen=True)
class DropFile:
    """Leave ``path`` out of the variant. A missing file is fine unless ``missing_ok`` is False."""

    path: str
    missing_ok: bool
    loc: str
    kind = "drop"


@dataclass(frozen=True)
class AddFile:
    """Write ``content`` (UTF-8 text) as ``path``. Replacing an existing file needs
    ``overwrite``."""

    path: str
    content: str | None
    overwrite: bool
    loc: str
    source: dict | None = None      # from: where the content came from, {"from", "sha256"...}
    # from: another model or a local file (patcher.recipe.sources), fetched when bound; until
    # then ``content`` is None. ``sha256``: the pin the fetched bytes must match.
    fetch: Any = None
    sha256: Any = None
    kind = "add"


FileOp = Union[DropFile, AddFile]


# -------------------------------------------------------------------------------- recipe

PARAM_TYPES = ("string", "integer", "number", "boolean", "list", "integers", "token")


@dataclass(frozen=True)
class Param:
    """A declared recipe parameter. ``default`` is ``REQUIRED`` when the caller must give it.
    The range (``minimum``, ``maximum``, ``exclusive_minimum``: numbers, for a number, an
    integer or each of integers; ``enum``: the values allowed) is None where not declared."""

    name: str
    type: str           # one of PARAM_TYPES
    default: Any
    description: str
    loc: str
    minimum: int | float | None = None
    maximum: int | float | None = None
    exclusive_minimum: int | float | None = None
    enum: tuple | None = None


REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "<required>"})()


@dataclass(frozen=True)
class Include:
    """``include:`` item: another recipe, with parameter values (JSON values or templates over
    the including recipe's parameters and the model's config)."""

    recipe: "Recipe"
    params: dict[str, Any]
    loc: str


@dataclass(frozen=True)
class OutputLayout:
    """The recipe's ``output:`` section: how the variant's shards are laid out."""

    max_shard_size: int | None      # bytes; None keeps the base's shards
    loc: str


@dataclass(frozen=True)
class Recipe:
    """A loaded, validated recipe.

    ``config`` maps each JSON file (a relative path in the model directory) to its ops, in recipe
    order. ``text`` is the exact source text and ``sha256`` the hex digest of its UTF-8 bytes
    (of the file's bytes when loaded from a file). ``source`` is the name used in ``loc``
    strings; ``path`` the file it was read from, if any.
    """

    format_version: int
    name: str
    description: str
    requires: tuple[Condition, ...]
    config: dict[str, tuple[ConfigOp, ...]]
    files: tuple[FileOp, ...]
    tensors: tuple[TensorOp, ...]
    text: str
    sha256: str
    source: str
    path: Path | None = None
    output: OutputLayout | None = None
    gguf: Any = None
    """A ``patcher.recipe.gguf_section.GGUFSection``, or None."""
    params: tuple[Param, ...] = ()
    includes: tuple[Include, ...] = ()
    # Set by ``recipe.bind.bind_recipe``: the parameter values used, and the recipes combined
    # (each ``{name, path, sha256, text, params}``) when there is more than one.
    bound: dict[str, Any] | None = None
    components: tuple[dict, ...] = ()

    def identity(self) -> dict:
        """Which recipe this is, for output: name, the absolute file it came from, sha256."""
        out = {"name": self.name, "path": str(self.path.resolve()) if self.path else None,
               "sha256": self.sha256}
        if self.source == "<command line>":     # several recipes given together
            parts = [c for c in self.components] or [i.recipe.identity() for i in self.includes]
            out["components"] = [{k: c[k] for k in ("name", "path", "sha256")} for c in parts]
        return out

    def manifest_record(self) -> dict:
        """The manifest's ``recipe`` entry: name, sha256, text, and when used, the parameter
        values and every recipe combined."""
        out: dict[str, Any] = {"name": self.name, "sha256": self.sha256, "text": self.text}
        if self.bound:
            out["params"] = dict(self.bound)
        if self.components:
            out["components"] = [dict(c) for c in self.components]
        return out

    @property
    def touches_tensors(self) -> bool:
        return bool(self.tensors) or self.max_shard_size is not None

    @property
    def max_shard_size(self) -> int | None:
        return self.output.max_shard_size if self.output else None
