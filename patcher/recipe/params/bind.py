"""Binding a recipe to a model: parameter values, ``{reference}`` templates, ``include:`` and
several recipes applied as one.

``bind_recipe(recipe, model.json, values)`` checks each recipe's guards (included recipes first,
in order), evaluates every template against the parameter values and the model's JSON files,
and returns one concrete ``Recipe``: no params, no includes, no templates; its ops are those of
the included recipes followed by its own, each keeping the ``file:line:col`` it was written at.
Two ops from different recipes that touch the same JSON pointer (or one inside the other) in
different ways, or the same file, are refused naming both recipe lines.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any, Callable

from ...config.json_pointer import join_pointer, json_equal
from ...errors import InputError, PlanError, TemplateError
from ...model.mla import with_model_facts
from ..guards import check_guards
from ..guards import evaluate as evaluate_condition
from ..schema import REQUIRED, AddFile, ArrayOp, DropOp, Include, PatchOp, Recipe, RenameOp, SetOp
from ..sources import Given, resolve_from
from .expr import Template, config_ref, read_config_ref, walk_templates
from .in_turn import read_after
from .parse import bind_tensor_ops, parse_set_value, range_problem, range_text, type_problem
from .scope import split_values
from .tokens import token_problem

ReadJson = Callable[[str], Any]


def combine(recipes: list[Recipe]) -> Recipe:
    """Several recipes as one (``apply R1 R2 MODEL``): a recipe that includes each in order.
    Its name is the names joined by ``+``; its text lists the recipes."""
    if len(recipes) == 1:
        return recipes[0]
    lines = ["modelpatch: 1", "name: " + "+".join(r.name for r in recipes), "include:"]
    lines += [f"  - {{recipe: {r.name}, sha256: {r.sha256}}}" for r in recipes]
    text = "\n".join(lines) + "\n"
    return Recipe(format_version=1, name="+".join(r.name for r in recipes),
                  description="; ".join(r.description for r in recipes), requires=(),
                  config={}, files=(), tensors=(), text=text,
                  sha256=hashlib.sha256(text.encode()).hexdigest(), source="<command line>",
                  includes=tuple(Include(r, {}, r.source) for r in recipes))


def bind_recipe(recipe: Recipe, read_json: ReadJson,
                values: dict[str, Any] | None = None, fetcher: Any = None) -> Recipe:
    """The concrete recipe for this model (see the module docstring).

    ``values``: parameter values, typed, or strings from ``--set NAME=VALUE`` (typed by the
    parameter's declared type); ``RECIPE.NAME`` gives one recipe's parameter
    (``patcher.recipe.params.scope``). ``fetcher``: a ``patcher.remote.sources.SourceFetcher``
    for the ``from:`` sources read at bind time.

    Raises:
        GuardRefused: a guard of any recipe does not hold.
        InputError: a parameter is unknown, missing or of the wrong type.
        PlanError: a template cannot be evaluated on this model, or two recipes conflict.
    """
    if recipe.bound is not None:            # already concrete (an in-place re-plan)
        check_guards(recipe, with_model_facts(read_json))
        return recipe
    composite = recipe.source == "<command line>"
    given = [r.recipe for r in recipe.includes] if composite else [recipe]
    per_recipe = split_values(given, {k: Given(v) if isinstance(v, str) else v
                                      for k, v in (values or {}).items()})
    if not composite:
        return _merge(recipe, _bind(recipe, read_json, per_recipe[0], fetcher))
    return _bind_in_turn(recipe, given, per_recipe, read_json, fetcher)


def _bind_in_turn(top: Recipe, given: list[Recipe], per_recipe: list[dict],
                  read_json: ReadJson, fetcher: Any) -> Recipe:
    """Several recipes given together, each bound (guards, ``{config.KEY}``) against the JSON
    files as the recipes before it leave them. The merged recipe keeps the guards of the first
    one only: the others do not hold on the base, and an in-place re-plan checks it again."""
    parts: list[tuple[Recipe, dict]] = []
    first_requires: tuple = ()
    for index, (recipe, values) in enumerate(zip(given, per_recipe)):
        bound = _bind(recipe, read_json, values, fetcher)
        parts.extend(bound)
        if index == 0:
            first_requires = tuple(c for p, _ in bound for c in p.requires)
        for part, _ in bound:
            read_json = read_after(read_json, part)
    return replace(_merge(top, parts), requires=first_requires)


def _bind(recipe: Recipe, read_json: ReadJson, values: Any,
          fetcher: Any) -> list[tuple[Recipe, dict]]:
    """[(concrete recipe, its parameter values)] for ``recipe`` and everything it includes.
    Conditions read ``@model`` (``patcher.model.mla``) beside the model's JSON files."""
    read_json = with_model_facts(read_json)
    typed = _typed_values(recipe, values)
    lookup = _lookup(typed, read_json)
    parts: list[tuple[Recipe, dict]] = []
    for inc in recipe.includes:
        inc_values = {k: evaluate(v, lookup, inc.loc) for k, v in inc.params.items()}
        parts.extend(_bind(inc.recipe, read_json, inc_values, fetcher))
    check_guards(recipe, read_json)
    _check_tokens(recipe, typed, read_json)
    config = {file: tuple(_bind_op(op, lookup, fetcher) for op in ops)
              for file, ops in recipe.config.items()}
    files = tuple(_bind_file(op, lookup, fetcher) for op in recipe.files)
    tensors = bind_tensor_ops(recipe.tensors, lambda t, loc: evaluate(t, lookup, loc))
    tensors = tuple(op for op in tensors
                    if op.when is None or evaluate_condition(op.when, read_json, "")[0])
    gguf = recipe.gguf and replace(recipe.gguf, metadata=tuple(
        _bind_file(op, lookup, fetcher) for op in recipe.gguf.metadata))
    plain = {k: str(v) if isinstance(v, Given) else v for k, v in typed.items()}
    parts.append((replace(recipe, config=config, files=files, tensors=tensors, includes=(),
                          params=(), bound=plain, gguf=gguf), plain))
    return parts


def _typed_values(recipe: Recipe, values: dict[str, Any]) -> dict[str, Any]:
    declared = {p.name: p for p in recipe.params}
    for name in values:
        if name not in declared:
            raise InputError(f"recipe {recipe.name!r} has no parameter {name!r} (it has: "
                             f"{', '.join(declared) or 'none'})")
    typed = {}
    for name, param in declared.items():
        if name in values:
            value = values[name]
            if isinstance(value, str) and param.type not in ("string", "token"):
                value = parse_set_value(param, value)
            problem = type_problem(param.type, value) or range_problem(param, value)
            if problem:
                raise InputError(f"recipe {recipe.name!r} parameter {name}: {problem}",
                                 where=param.loc, hint=_declared_range(param))
            if param.default is REQUIRED and value in ("", []):
                raise InputError(f"--set {name}=: recipe {recipe.name!r} needs a value for "
                                 f"{name!r} ({param.description}), not an empty one")
            typed[name] = value
        elif param.default is REQUIRED:
            raise InputError(f"recipe {recipe.name!r} needs parameter {name!r} ("
                             f"{param.description})", where=param.loc,
                             hint=f"give it with --set {name}=VALUE")
        else:
            typed[name] = param.default
    return typed


def _declared_range(param) -> str | None:
    text = range_text(param)
    return f"{param.name}: {param.type} {text}" if text else None


def _check_tokens(recipe: Recipe, typed: dict[str, Any], read_json: ReadJson) -> None:
    """``token`` parameters name a token of the model's own vocabulary."""
    for param in recipe.params:
        value = typed.get(param.name)
        if param.type == "token" and isinstance(value, str) and value:
            problem = token_problem(str(value), read_json)
            if problem:
                raise InputError(f"recipe {recipe.name!r} parameter {param.name}: "
                                 f"{value!r} {problem}", where=param.loc)


def _lookup(typed: dict[str, Any], read_json: ReadJson) -> Callable[[str], Any]:
    def lookup(ref: str) -> Any:
        if ref in typed:
            return typed[ref]
        found = config_ref(ref)
        if found is None:
            raise TemplateError(f"{{{ref}}} is not a parameter")
        file, keys = found
        return read_config_ref(read_json(file), file, keys, ref)
    return lookup


def evaluate(value: Any, lookup: Callable[[str], Any], loc: str) -> Any:
    def one(template: Template) -> Any:
        try:
            return template.evaluate(lookup)
        except TemplateError as exc:
            raise PlanError(f"{template.source!r}: {exc}", where=loc) from None
    return walk_templates(value, one)


def _bind_op(op, lookup, fetcher):
    if isinstance(op, SetOp) and op.fetch is not None:
        value, record = resolve_from(op.fetch, op.sha256, lambda t: evaluate(t, lookup, op.loc),
                                     fetcher, op.loc, want_text=False)
        return replace(op, value=value, source=record, fetch=None, sha256=None)
    if isinstance(op, (SetOp, PatchOp, ArrayOp)) and op.value is not None:
        return replace(op, value=evaluate(op.value, lookup, op.loc))
    return op


def _bind_file(op, lookup, fetcher):
    """A ``files: add`` or a ``gguf:`` metadata ``set`` with its ``from:`` read."""
    if getattr(op, "fetch", None) is None:
        return op
    content, record = resolve_from(op.fetch, op.sha256, lambda t: evaluate(t, lookup, op.loc),
                                   fetcher, op.loc, want_text=isinstance(op, AddFile))
    if isinstance(op, AddFile):
        return replace(op, content=content, source=record, fetch=None, sha256=None)
    return replace(op, content=content, content_source=record, fetch=None, sha256=None)


# ------------------------------------------------------------------------------ merging

def _merge(top: Recipe, parts: list[tuple[Recipe, dict]]) -> Recipe:
    if len(parts) == 1 and parts[0][0].name == top.name:
        return parts[0][0]
    _check_conflicts([p for p, _ in parts])
    config: dict[str, tuple] = {}
    for part, _ in parts:
        for file, ops in part.config.items():
            config[file] = config.get(file, ()) + ops
    outputs = [p.output for p, _ in parts if p.output is not None]
    if len({o.max_shard_size for o in outputs}) > 1:
        raise PlanError(f"two recipes set different output.max_shard_size (also at "
                        f"{outputs[0].loc})", where=outputs[1].loc)
    components = tuple({"name": p.name, "path": str(p.path.resolve()) if p.path else None,
                        "sha256": p.sha256, "text": p.text, "params": values}
                       for p, values in parts)
    own = {} if top.source == "<command line>" else parts[-1][1]
    from ..gguf_section import merge_sections

    return replace(top, requires=tuple(c for p, _ in parts for c in p.requires), config=config,
                   gguf=merge_sections([p.gguf for p, _ in parts]),
                   files=tuple(f for p, _ in parts for f in p.files),
                   tensors=tuple(t for p, _ in parts for t in p.tensors),
                   output=outputs[0] if outputs else None, includes=(), params=(),
                   bound=own, components=components)


def _pointers(op) -> list[str]:
    paths = [op.path]
    if isinstance(op, RenameOp):
        paths.append(op.to)
    if isinstance(op, PatchOp) and op.from_path is not None:
        paths.append(op.from_path)
    return [join_pointer(scope, p) for scope in op.scopes for p in paths]


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/") or not a or not b


def _agree(a, b) -> bool:
    """Two ops that do the same thing do not conflict (both drop it, both set it equal, or a
    test)."""
    if isinstance(a, PatchOp) and a.op == "test" or isinstance(b, PatchOp) and b.op == "test":
        return True
    if isinstance(a, DropOp) and isinstance(b, DropOp):
        return a.path == b.path
    if isinstance(a, SetOp) and isinstance(b, SetOp):
        return a.path == b.path and json_equal(a.value, b.value)
    return False


def _check_conflicts(parts: list[Recipe]) -> None:
    seen_ops: dict[str, list[tuple[int, Any]]] = {}
    seen_files: dict[str, tuple[int, Any]] = {}
    for index, part in enumerate(parts):
        for file, ops in part.config.items():
            for op in ops:
                for other_index, other in seen_ops.get(file, []):
                    if other_index != index and not _agree(op, other) and any(
                            _overlap(a, b) for a in _pointers(op) for b in _pointers(other)):
                        raise PlanError(f"recipes {parts[other_index].name!r} and {part.name!r} "
                                        f"conflict on {file} {op.path} (the other operation is "
                                        f"at {other.loc})", where=op.loc,
                                        hint="apply them one after the other, or drop one op")
            seen_ops.setdefault(file, []).extend((index, op) for op in ops)
        for fop in part.files:
            prior = seen_files.get(fop.path)
            if prior is not None and prior[0] != index and replace(fop, loc=prior[1].loc) \
                    != prior[1]:
                raise PlanError(f"recipes {parts[prior[0]].name!r} and {part.name!r} both "
                                f"{fop.kind} {fop.path} (the other at {prior[1].loc})",
                                where=fop.loc)
            seen_files.setdefault(fop.path, (index, fop))
            if fop.path in {f for p in parts for f in p.config}:
                raise PlanError(f"{fop.path} is both a file operation here and patched under "
                                "config: by one of the recipes", where=fop.loc)
