"""Doctor rules: YAML data files, one rule each, with conditions in the recipe guard language.

A rule file::

    doctor: 1
    id: fp8-kv-mla-triton-sm120         # [a-z0-9][a-z0-9._-]*
    severity: blocker                   # blocker | warning | info
    summary: one line on what is wrong
    evidence:                           # where the engine says so, and the versions it covers
      - {source: "https://github.com/vllm-project/vllm/pull/34597", versions: "vllm < 0.18.0"}
    fix: {recipe: sm120-fp16-kv}        # optional: a built-in recipe, its params, and
                                        # params_from: a pointer into @model giving params
    details: /quantization/disagreements  # optional: a pointer into @model shown with the finding
    when: <condition>

``when`` is a recipe guard (``file``/``path`` leaves, ``any_of``/``all_of``/``not``, ``in``)
with three more leaves, facts about the target: ``engine: vllm`` (or a list), ``engine_version:
"<0.18.0"`` (a PEP 440 specifier set) and ``gpu: "<sm89"`` or ``gpu: [sm120, sm121]``. The file
``@model`` holds facts derived from the whole model (``patcher.doctor.model_facts``). A fact the
user did not give makes its leaf false, and the rule is reported as not checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from ..errors import RecipeError
from ..fsops import NotRegularFile, TooLarge, read_capped
from ..recipe import checks as rc
from ..recipe import load as recipe_module
from ..recipe import sections as recipe_sections
from ..recipe.guards import evaluate as evaluate_guard
from ..recipe.yaml_safe import YamlProblems, compose_recipe
from .target import GPU_NAME, KNOWN_CAPABILITIES, Target

FACT_KEYS = ("engine", "engine_version", "gpu")
SEVERITIES = ("blocker", "warning", "info")
RULE_KEYS = ("doctor", "id", "severity", "summary", "evidence", "fix", "details", "when")
_ID = re.compile(r"[a-z0-9][a-z0-9._-]*")
_GPU_SPEC = re.compile(r"(<=|>=|<|>|==)?\s*(sm_?\d+[a-z]?)")


@dataclass(frozen=True)
class Fact:
    name: str
    spec: Any        # engine: tuple of names; engine_version: SpecifierSet; gpu: (op, int) or set
    loc: str


@dataclass(frozen=True)
class Combo:
    kind: str        # any_of | all_of | not
    children: tuple
    loc: str


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    summary: str
    evidence: tuple[dict, ...]
    fix: dict | None
    details: str | None
    when: Any        # Fact | Combo | a recipe guard Condition
    source: str


def builtin_rules_dir() -> Path:
    return Path(str(resources.files("patcher.doctor") / "rules"))


def load_rules(extra_dirs: tuple[str, ...] = (), *, allow_recipe_files: bool = False
               ) -> list[Rule]:
    """The built-in rules, then each ``*.yaml`` of ``extra_dirs``; ids must be unique. A rule's
    ``fix.recipe`` names a built-in recipe; with ``allow_recipe_files``, one of ``extra_dirs``
    may name a recipe file below its own directory."""
    paths = [(p, False) for p in sorted(builtin_rules_dir().glob("*.yaml"))]
    for d in extra_dirs:
        if not Path(d).is_dir():
            raise RecipeError("--rules needs a directory of rule files", where=d)
        paths += [(p, allow_recipe_files) for p in sorted(Path(d).glob("*.yaml"))]
    rules, seen = [], {}
    for path, files_allowed in paths:
        rule = load_rule(path, allow_recipe_files=files_allowed)
        if rule.id in seen:
            raise RecipeError(f"rule id {rule.id!r} is also used by {seen[rule.id]}",
                              where=str(path))
        seen[rule.id] = str(path)
        rules.append(rule)
    return rules


def load_rule(path: Path, *, allow_recipe_files: bool = False) -> Rule:
    source = str(path)
    try:
        text = read_capped(path, 1 << 20).decode("utf-8")
        root = compose_recipe(text)
    except YamlProblems as exc:
        raise recipe_module.recipe_error(source, exc.problems) from None
    except (OSError, UnicodeDecodeError, NotRegularFile, TooLarge) as exc:
        raise RecipeError(f"cannot read rule file: {exc}", where=source) from None
    v = rc.Validator(source)
    v.recipe_path = path if allow_recipe_files else None     # fix.recipe files: below it
    rule = _rule(v, root, source) if rc.is_map(root) else None
    if root is not None and not rc.is_map(root):
        v.err((1, 1), "a rule file is a mapping (doctor, id, severity, summary, when, ...)")
    if v.problems or rule is None:
        raise recipe_module.recipe_error(source, v.problems or [(1, 1, "empty rule file")])
    return rule


def _rule(v: rc.Validator, root: Any, source: str) -> Rule | None:
    v.check_keys(root, RULE_KEYS, "rule", required=("doctor", "id", "severity", "summary",
                                                     "evidence", "when"))
    if root.get("doctor") != 1:
        v.err(rc.val_pos(root, "doctor") if "doctor" in root else (1, 1),
              "a rule file starts with 'doctor: 1'")
    rule_id, summary = v.string(root, "id"), v.string(root, "summary")
    if rule_id is not None and not _ID.fullmatch(rule_id):
        v.err(rc.val_pos(root, "id"), f"rule id {rule_id!r} must match [a-z0-9][a-z0-9._-]*")
    severity = v.choice(root, "severity", SEVERITIES)
    evidence = tuple(_plain(e) for e, _ in v.items(root, "evidence", nonempty=True))
    if any(not (isinstance(e, dict) and e.get("source") and e.get("versions")) for e in evidence):
        v.err(rc.val_pos(root, "evidence"), "each evidence entry needs 'source' and 'versions'")
    fix = _plain(root.get("fix")) if "fix" in root else None
    if fix is not None and not (
            isinstance(fix, dict) and isinstance(fix.get("recipe"), str)
            and set(fix) <= {"recipe", "params", "params_from"}
            and isinstance(fix.get("params", {}), dict)
            and (isinstance(fix.get("params_from", "/"), str)
                 and fix.get("params_from", "/").startswith("/"))):
        v.err(rc.val_pos(root, "fix"), "fix is {recipe: NAME} (a built-in recipe), with "
                                       "optional params: {...} and params_from: /POINTER "
                                       "(into @model)")
    elif fix is not None:
        fix = _fix_data(v, rc.val_pos(root, "fix"), fix)
    details = v.pointer(root, "details") if "details" in root else None
    when = parse_condition(v, root["when"], rc.val_pos(root, "when")) if "when" in root else None
    if v.problems or when is None:
        return None
    return Rule(rule_id, severity, " ".join(summary.split()), evidence, fix, details, when,
                source)


def _fix_data(v: rc.Validator, pos: tuple[int, int], fix: dict) -> dict:
    """A rule's fix is data, like a recipe: ``recipe`` a built-in name (a recipe file below the
    rule's directory only with ``--allow-recipe-files``), ``params`` no local path
    (``model:``, ``file:``), as for an ``include:`` line's params."""
    from ..errors import InputError
    from ..recipe.params.include import include_path
    from ..recipe.sources import local_source_problem

    name = fix["recipe"]
    if name not in recipe_module.builtin_recipe_names() or not recipe_module.is_builtin_name(name):
        if v.recipe_path is None:
            v.err(pos, f"fix.recipe {name[:80]!r} is not a built-in recipe (a recipe file "
                       "needs doctor --allow-recipe-files)")
            return fix
        try:
            fix = {**fix, "recipe": str(include_path(name, Path(v.recipe_path), "fix.recipe"))}
        except InputError as exc:
            v.err(pos, exc.message)
            return fix
    problem = local_source_problem(fix.get("params") or {}, "fix.params value")
    if problem:
        v.err(pos, problem)
    return fix


def _plain(node: Any) -> Any:
    if rc.is_map(node):
        return {str(k): _plain(val) for k, val in node.items()}
    if rc.is_seq(node):
        return [_plain(x) for x in node]
    return node


def _has_fact(node: Any) -> bool:
    if rc.is_map(node):
        return any(k in FACT_KEYS for k in node) or any(_has_fact(x) for x in node.values())
    return rc.is_seq(node) and any(_has_fact(x) for x in node)


def parse_condition(v: rc.Validator, node: Any, pos: tuple[int, int], top: bool = True):
    """A fact leaf, a combinator over facts, or (with no fact inside) a recipe guard. The
    rule's own ``any_of``/``all_of``/``not`` is always ours: it stops at the first deciding
    condition, so an expensive ``@model`` fact is computed only when the cheap ones hold."""
    plain_combo = rc.is_map(node) and len(node) == 1 and next(iter(node)) in \
        recipe_sections.COMBINATORS
    if not _has_fact(node) and not (top and plain_combo):
        return recipe_sections.parse_condition(v, node, pos)
    loc = v.loc(pos)
    facts = [k for k in node if k in FACT_KEYS]
    if facts:
        v.check_keys(node, (facts[0],), "fact condition")
        return _fact(v, facts[0], node[facts[0]], rc.val_pos(node, facts[0]), loc)
    kinds = [k for k in node if k in recipe_sections.COMBINATORS]
    if len(kinds) != 1 or len(node) != 1:
        v.err(pos, "a condition over engine/gpu facts is one of any_of, all_of, not (no 'in' "
                   "or 'message')")
        return None
    kind = kinds[0]
    if kind == "not":
        child = parse_condition(v, node[kind], rc.val_pos(node, kind), top=False)
        return None if child is None else Combo(kind, (child,), loc)
    children = [parse_condition(v, n, p, top=False) for n, p in v.items(node, kind, nonempty=True)]
    return None if any(c is None for c in children) else Combo(kind, tuple(children), loc)


def _fact(v: rc.Validator, name: str, value: Any, pos, loc: str) -> Fact | None:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    values = [str(x) for x in value] if rc.is_seq(value) else [str(value)]
    try:
        if name == "engine":
            return Fact(name, tuple(x.lower() for x in values), loc)
        if name == "engine_version":
            return Fact(name, SpecifierSet(",".join(values)), loc)
        if rc.is_seq(value):
            return Fact(name, frozenset(_capability(x) for x in values), loc)
        m = _GPU_SPEC.fullmatch(values[0].strip().lower())
        if m:
            return Fact(name, (m[1] or "==", _capability(m[2])), loc)
    except (InvalidSpecifier, ValueError):
        pass
    v.err(pos, f"{name}: cannot read {value!r} (engine: vllm; engine_version: '<0.18.0'; "
               f"gpu: '<sm89' or [sm120, sm121])")
    return None


def _capability(text: str) -> int:
    m = GPU_NAME.fullmatch(text.strip().lower())
    if not m or int(m[1]) * 10 + int(m[2]) not in KNOWN_CAPABILITIES:
        raise ValueError(text)
    return int(m[1]) * 10 + int(m[2])


_COMPARE = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__,
            "==": int.__eq__}


def evaluate(cond: Any, read: Callable[[str], Any], target: Target,
             missing: set[str]) -> bool:
    """Whether ``cond`` holds; names of target facts it needed but lacked go into ``missing``."""
    if isinstance(cond, Fact):
        return _fact_holds(cond, target, missing)
    if isinstance(cond, Combo):
        results = (evaluate(c, read, target, missing) for c in cond.children)
        if cond.kind == "not":
            return not next(results)
        return any(results) if cond.kind == "any_of" else all(results)
    return evaluate_guard(cond, read, "")[0]


def _fact_holds(fact: Fact, target: Target, missing: set[str]) -> bool:
    value = getattr(target, fact.name)
    if value is None:
        missing.add(fact.name)
        return False
    if fact.name == "engine":
        return value in fact.spec
    if fact.name == "engine_version":
        return fact.spec.contains(value, prereleases=True)
    if isinstance(fact.spec, frozenset):
        return value in fact.spec
    op, capability = fact.spec
    return _COMPARE[op](value, capability)
