"""``from:`` content taken from another model or a local file, and the ``sha256:`` that pins it.

A ``files: add`` item and a config ``set`` take their content from one of::

    from: chat_template.jinja                           # a file next to the recipe (read at load)
    from: hf://ORG/NAME[@REV]/PATH                      # a file of a hub repository
    from: model:/models/base/generation_config.json     # a file of a local model directory
    from: file:/home/me/template.jinja                  # any local file
    from: hf://org/base@main/tokenizer_config.json#/chat_template   # a value inside a JSON file
    sha256: 9f2c...                                     # optional: refuse other bytes

``hf://``: ``REV`` ends at the next ``/`` and is percent-decoded (``refs%2Fpr%2F1``). ``model:``:
the model directory is the closest directory above the file holding a ``config.json`` or
``tokenizer_config.json``, and the file must be one of that model's files (not in a
dot-directory, not through a symlink leading out of it). ``#/POINTER`` reads the JSON value at
that RFC 6901 pointer (a string for ``files: add``).

Who may name what: a recipe file names files next to it and hub files; a *local* path outside
the recipe's directory (``model:``, ``file:``) is accepted only when it comes from you, as a
``--set`` value (or ``params=`` in the library) passed straight to the ``from:`` reference.
Written in a recipe, or as a parameter's default, it is refused: a recipe found in an issue
thread cannot copy your files into a variant you might publish.

These sources are read when the recipe is bound to a model (at plan time, once; the executor
writes the plan's bytes). Fetching is done by ``patcher.remote.sources``; this module only
parses, so that the recipe package never imports the hub client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from ..errors import InputError
from ..model_ref import HF_SCHEME, ModelRef

HF_PREFIX, MODEL_PREFIX, FILE_PREFIX = HF_SCHEME, "model:", "file:"
SCHEMES = (HF_PREFIX, MODEL_PREFIX, FILE_PREFIX)
#: The most bytes one source may have (a tokenizer.json is ~10 MB at most).
MAX_SOURCE_BYTES = 16 << 20
SHA256_RE = re.compile(r"[0-9a-f]{64}\Z")


class Given(str):
    """A string the caller gave (``--set``, ``params=``): the only place a local path may come
    from. Evaluating ``"{name}"`` returns this very object, so it survives ``include:`` params."""


@dataclass(frozen=True)
class Source:
    """A parsed ``from:`` other than a file next to the recipe."""

    text: str                   # as written (after {references})
    kind: str                   # "hub", "model" or "file"
    path: str                   # the file in the repository, or the local path
    repo_id: str | None = None
    revision: str | None = None
    pointer: str | None = None  # "#/a/b": the JSON value there


def has_scheme(text: str) -> bool:
    return text.startswith(SCHEMES)


def local_source_problem(value: Any, what: str) -> str | None:
    """Why ``value`` (a parameter value from data, not typed by you: an ``include:`` line, a
    rule's ``fix.params``) may not be used: a string in it names a local path (``model:``,
    ``file:``), which only a ``--set`` of yours may give; else None."""
    if isinstance(value, str) and value.startswith((MODEL_PREFIX, FILE_PREFIX)):
        return (f"{what} {value[:80]!r} names a local path; only your own --set may give "
                f"{MODEL_PREFIX} or {FILE_PREFIX}")
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) \
        else ()
    return next((p for p in (local_source_problem(x, what) for x in items) if p), None)


def parse_source(text: str) -> Source:
    """The ``Source`` ``text`` names; ``InputError`` with the reason if it is malformed or a
    local path that did not come from the caller."""
    body, hash_mark, pointer = text.partition("#")
    if hash_mark and not pointer.startswith("/"):
        raise InputError(f"from: {text!r}: after '#' comes a JSON pointer such as /chat_template")
    pointer = pointer if hash_mark else None
    if body.startswith(HF_PREFIX):
        return _hub(text, body, pointer)
    kind = "model" if body.startswith(MODEL_PREFIX) else "file"
    if not body.startswith((MODEL_PREFIX, FILE_PREFIX)):
        raise InputError(f"from: {text!r} must be a file next to the recipe, hf://ORG/NAME"
                         "[@REV]/PATH, model:PATH or file:PATH")
    if not isinstance(text, Given):
        raise InputError(f"from: {text!r}: a local path outside the recipe's directory must "
                         "come from you, as a --set value for a parameter, never from the "
                         "recipe itself")
    path = body.split(":", 1)[1]
    if not path or "\0" in path:
        raise InputError(f"from: {text!r}: no path after {kind}:")
    return Source(text, kind, path, pointer=pointer)


def _hub(text: str, body: str, pointer: str | None) -> Source:
    from .checks import filename_error

    parts = body[len(HF_PREFIX):].split("/", 2)
    if len(parts) < 3 or not all(parts):
        raise InputError(f"from: {text!r} is not hf://ORG/NAME[@REV]/PATH")
    org, name_rev, path = parts
    name, at, revision = name_rev.partition("@")
    if at and not revision:
        raise InputError(f"from: {text!r}: empty revision after '@'")
    problem = filename_error(path)
    if problem:
        raise InputError(f"from: {text!r}: {problem}")
    try:            # the repository and revision checked as a MODEL's are, before any request
        ref = ModelRef.parse(f"{HF_SCHEME}{org}/{name}" + (f"@{unquote(revision)}" if at else ""))
    except InputError as exc:
        raise InputError(f"from: {text!r}: {exc.message}", hint=exc.hint) from None
    return Source(text, "hub", path, ref.repo_id, ref.revision, pointer)


def check_pin(value: Any) -> str | None:
    """The problem with a ``sha256:`` value, or None (an empty string: not pinned)."""
    if value == "":
        return None
    if not isinstance(value, str):
        return f"sha256: must be a string of 64 lowercase hex digits (quote it); got {value!r}"
    if not SHA256_RE.match(value):
        return f"sha256: must be 64 lowercase hex digits; got {value!r}"
    return None


def content_of(data: bytes, source_text: str, pointer: str | None, *, want_text: bool) -> Any:
    """What a fetched source gives: its UTF-8 text, or with ``#/pointer`` the JSON value there
    (a string when ``want_text``)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"from: {source_text!r} is not UTF-8 text (byte {exc.start})") from None
    if pointer is None:
        return text
    from ..config.json_pointer import MISSING, pointer_error, resolve
    from ..config.jsonfile import parse_json

    problem = pointer_error(pointer)
    if problem:
        raise InputError(f"from: {source_text!r}: {problem}")
    try:
        value = resolve(parse_json(data, source_text, constants=False), pointer)
    except InputError as exc:
        raise InputError(f"from: {source_text!r}: {exc.message}") from None
    if value is MISSING:
        raise InputError(f"from: {source_text!r}: the JSON has nothing at {pointer}")
    if want_text and not isinstance(value, str):
        raise InputError(f"from: {source_text!r}: the value at {pointer} is not a string")
    return value


# ------------------------------------------------------------------------ recipe loading

def parse_from(v, node: Any, pos: tuple[int, int]) -> dict | None:
    """The ``from:`` (and ``sha256:``) of a recipe item as op fields: ``content`` and
    ``source`` for a file next to the recipe (read now), else ``fetch`` (a ``Source``, or a
    ``Template`` that gives one) and ``sha256`` (a pin, maybe a ``Template``), read at bind.
    None when a problem was recorded."""
    from . import checks as rc
    from .params.include import read_beside
    from .params.parse import template_value

    text = v.string(node, "from")
    pin = node.get("sha256", "")
    pin_pos = rc.val_pos(node, "sha256") if "sha256" in node else pos
    if text is None:
        return None
    if not isinstance(pin, str):        # YAML's 0, 1e3, null...: never "not pinned"
        v.err(pin_pos, check_pin(pin))
        return None
    pin = template_value(v, pin, pin_pos, v.param_names)
    if isinstance(pin, str) and check_pin(pin):
        v.err(pin_pos, check_pin(pin))
        return None
    fetch = template_value(v, text, rc.val_pos(node, "from"), v.param_names)
    if not isinstance(fetch, str):                      # a {reference}: resolved at bind
        return {"fetch": fetch, "sha256": pin or None}
    if has_scheme(text):
        try:
            return {"fetch": parse_source(text), "sha256": pin or None}
        except InputError as exc:
            v.err(rc.val_pos(node, "from"), exc.message)
            return None
    found = read_beside(v, text, rc.val_pos(node, "from"))
    if found is None:
        return None
    if isinstance(pin, str) and pin and pin != found[1]["sha256"]:
        v.err(pin_pos, f"from: {text!r} has sha256 {found[1]['sha256']}, not the pinned {pin}")
        return None
    return {"content": found[0], "source": found[1]}


def _given_where(template: Any, value: Any) -> str | None:
    """``--set NAME=VALUE`` when ``value`` is the caller's own (a ``Given`` that ``template``,
    a single ``{NAME}``, passed through): a bad value is theirs, not the recipe line's."""
    refs = getattr(template, "refs", ())
    if isinstance(value, Given) and len(refs) == 1:
        return f"--set {next(iter(refs))}={value}"
    return None


def resolve_from(fetch: Any, pin: Any, evaluate, fetcher, loc: str, *, want_text: bool
                 ) -> tuple[Any, dict]:
    """Fetch a deferred ``from:`` (``evaluate(template)`` gives a template's value): the
    content and the record the plan and manifest keep. ``PlanError`` naming ``loc`` (or the
    ``--set`` that gave the bad source or pin) if it cannot be read, or its sha256 is not the
    pinned one."""
    from ..errors import HubError, PlanError

    source, where = fetch, loc
    try:
        if not isinstance(fetch, Source):
            text = evaluate(fetch)
            if not isinstance(text, str):
                raise InputError(f"from: {fetch.source!r} is {text!r}, not a string")
            where = _given_where(fetch, text) or loc
            source = parse_source(text)
        pin_where = where
        if pin is not None and not isinstance(pin, str):
            value = evaluate(pin)
            pin_where = _given_where(pin, value) or loc
            pin = value
        if pin is not None and check_pin(pin):
            where = pin_where
            raise InputError(check_pin(pin))
        if fetcher is None:
            raise InputError(f"from: {source.text!r}: nothing can fetch it here")
        got = fetcher.fetch(source)
        if pin and got.sha256 != pin:
            where = pin_where
            raise InputError(f"from: {source.text!r} has sha256 {got.sha256}, not the pinned "
                             f"{pin}; refusing it")
        content = content_of(got.data, source.text, source.pointer, want_text=want_text)
    except InputError as exc:
        raise PlanError(exc.message, where=where) from None
    except HubError as exc:
        at = f"{exc.where}: " if exc.where else ""
        raise HubError(f"from: {getattr(source, 'text', source)!r}: {at}{exc.message}",
                       where=where, hint=exc.hint) from None
    record = {"from": str(source.text), "resolved": got.resolved, "sha256": got.sha256,
              "size": len(got.data), **({"pointer": source.pointer} if source.pointer else {})}
    return content, record
