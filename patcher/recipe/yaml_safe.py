"""Safe YAML for recipes: a size cap, an event scan, then ruamel's round-trip loader.

The event scan runs before anything is composed. It refuses anchors and aliases (which is what
makes alias bombs such as "billion laughs" impossible), tags outside YAML's core schema, more than
one document, and nesting deeper than ``MAX_DEPTH``. Only then is the document composed with the
round-trip loader, which builds plain maps, sequences and scalars (never arbitrary objects) and
remembers the line and column of every node.
"""

from __future__ import annotations

import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    MappingStartEvent,
    NodeEvent,
    ScalarEvent,
)

from ..errors import YamlProblems

MAX_RECIPE_BYTES = 1 << 20
MAX_DEPTH = 64
# Longer plain numbers are refused: Python will not convert an integer of more than 4300 digits,
# and no config value needs a hundredth of that.
MAX_NUMBER_DIGITS = 1000
_LONG_NUMBER = re.compile(r"[-+]?[0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?")
_MAX_SCAN_ERRORS = 20
_CORE_TAGS = frozenset(f"tag:yaml.org,2002:{t}"
                       for t in ("str", "int", "float", "bool", "null", "seq", "map"))


def _mark(mark: Any) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def _yaml_error(exc: YAMLError) -> tuple[int, int, str]:
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line, col = _mark(mark)
        parts = [p for p in (exc.context, exc.problem) if p]
        problem = exc.problem or ""
        if problem.startswith("found duplicate key"):
            # ruamel: 'found duplicate key "x" with value "..." (original value: "...")'
            key = problem.split('"')[1] if '"' in problem else "?"
            return line, col, f"duplicate key {key!r}"
        parts = [p for p in (exc.context, problem) if p]
        return line, col, "invalid YAML: " + ("; ".join(parts) if parts else "syntax error")
    return 1, 1, f"invalid YAML: {exc}"


def _show_tag(tag: str) -> str:
    prefix = "tag:yaml.org,2002:"
    return "!!" + tag[len(prefix):] if tag.startswith(prefix) else tag


def scan_events(text: str) -> None:
    """Refuse anchors, aliases, non-core tags, several documents and deep nesting.

    Raises:
        YamlProblems: with every problem found (up to a cap), or the syntax error that stopped
        the scan.
    """
    problems: list[tuple[int, int, str]] = []
    documents = depth = 0
    aliased: set[str] = set()
    keys: list[list[bool]] = []     # per open collection: [is a mapping, next node is a key]
    yaml = YAML(typ="rt", pure=True)
    try:
        for event in yaml.parse(text):
            if isinstance(event, DocumentStartEvent):
                documents += 1
                if documents == 2:
                    problems.append((*_mark(event.start_mark),
                                     "a recipe is a single YAML document; found a second one"))
                    break
            if isinstance(event, AliasEvent):
                if event.anchor in aliased:
                    continue  # one report per anchor name is enough
                aliased.add(event.anchor)
                problems.append((*_mark(event.start_mark),
                                 f"YAML aliases (*{event.anchor}) are not allowed in recipes"))
            elif isinstance(event, NodeEvent) and event.anchor is not None:
                problems.append((*_mark(event.start_mark),
                                 f"YAML anchors (&{event.anchor}) are not allowed in recipes"))
            tag = getattr(event, "tag", None)
            if tag is not None and str(tag) not in _CORE_TAGS:
                problems.append((*_mark(event.start_mark),
                                 f"YAML tag {_show_tag(str(tag))} is not allowed in recipes "
                                 "(only the core tags !!str, !!int, !!float, !!bool, !!null, "
                                 "!!seq, !!map)"))
            if _long_number(event):
                problems.append((*_mark(event.start_mark),
                                 f"a number of {len(event.value)} characters is too long "
                                 f"(at most {MAX_NUMBER_DIGITS}; quote it to make a string)"))
            if _complex_key(event, keys):
                problems.append((*_mark(event.start_mark),
                                 "mapping keys must be plain scalars, not lists or mappings"))
            if isinstance(event, CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    problems.append((*_mark(event.start_mark),
                                     f"nesting deeper than {MAX_DEPTH} levels"))
                    break
            elif isinstance(event, CollectionEndEvent):
                depth -= 1
            if len(problems) >= _MAX_SCAN_ERRORS:
                break
    except YAMLError as exc:
        problems.append(_yaml_error(exc))
    except RecursionError:
        problems.append((1, 1, f"nesting deeper than {MAX_DEPTH} levels"))
    if problems:
        raise YamlProblems(problems)


def _long_number(event: Any) -> bool:
    return (isinstance(event, ScalarEvent) and not event.style
            and len(event.value) > MAX_NUMBER_DIGITS and _LONG_NUMBER.fullmatch(event.value))


def _complex_key(event: Any, keys: list[list[bool]]) -> bool:
    """Track key/value positions in the open collections; True when a list or mapping starts
    where a mapping key belongs (YAML's ``? [a]: b``), which no recipe field can be."""
    if isinstance(event, CollectionEndEvent):
        keys.pop()
        _advance(keys)              # the closed collection was one node of its parent
        return False
    if not isinstance(event, NodeEvent):
        return False
    at_key = bool(keys) and keys[-1][0] and keys[-1][1]
    if isinstance(event, CollectionStartEvent):
        keys.append([isinstance(event, MappingStartEvent), True])
        return at_key
    _advance(keys)                  # a scalar or alias: one node of its parent
    return False


def _advance(keys: list[list[bool]]) -> None:
    if keys and keys[-1][0]:
        keys[-1][1] = not keys[-1][1]


def compose_recipe(text: str) -> Any:
    """Scan ``text`` (see ``scan_events``), then load it with the round-trip loader.

    Returns the document (``CommentedMap``/``CommentedSeq``/scalars, or None when empty).
    """
    scan_events(text)
    yaml = YAML(typ="rt", pure=True)
    try:
        return yaml.load(text)
    except YAMLError as exc:
        raise YamlProblems([_yaml_error(exc)]) from None
    except ValueError as exc:         # a scalar the constructor cannot convert
        raise YamlProblems([(1, 1, f"invalid YAML: {str(exc).splitlines()[0]}")]) from None
