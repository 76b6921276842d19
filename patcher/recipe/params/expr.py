"""Recipe value templates: ``{name}`` references to parameters and config values, and a small
arithmetic language over them. Nothing is ever passed to Python's ``eval``.

A string value in a recipe is a *template* when it holds at least one reference ``{ref}`` (a
name, or a dotted path ``config.rope_scaling.factor``, not next to another brace, so Jinja's
``{{ x }}`` and ``{% x %}`` stay plain text). A template is one of:

- a single reference, alone: ``"{factor}"`` -> the referenced value with its JSON type (number,
  list, object...), never a string unless the value is one;
- an arithmetic expression: numbers, references, ``+ - * / //``, unary ``-`` and parentheses,
  ``"{factor} * {config.max_position_embeddings} // 1"`` -> a number. ``/`` is true division;
  ``//`` is floor division and always gives an integer. Operands must be numbers;
- otherwise text with references inside: ``"model-{name}"`` -> a string; each reference must
  be a string or a number.

References: a declared parameter name, or ``config.PATH`` / ``generation_config.PATH`` /
``tokenizer_config.PATH`` / ``hf_quant_config.PATH`` for a value of that JSON file of the model
(``PATH`` is dot-separated keys; a number indexes an array). ``compressed_tensors_ignore.PATH``
reads a ModelOpt ``exclude_modules`` list at PATH of hf_quant_config.json and gives it as
compressed-tensors ``ignore`` entries (``config.module_patterns``): patterns are translated,
never copied.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from ...config.module_patterns import ignore_from_modelopt
from ...errors import TemplateError

REF_RE = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)\}(?!\})")
CONFIG_FILES = {"config": "config.json", "generation_config": "generation_config.json",
                "tokenizer_config": "tokenizer_config.json",
                "hf_quant_config": "hf_quant_config.json",
                "compressed_tensors_ignore": "hf_quant_config.json"}
#: references whose JSON value is translated before use
_TRANSLATED = {"compressed_tensors_ignore": ignore_from_modelopt}
_ARITH_CHARS = re.compile(r"[\s0-9.eE+\-*/%()_a-z]*\Z")
_PLACEHOLDER = "__ref{}__"


@dataclass(frozen=True)
class Template:
    """A parsed template string (see the module docstring). ``refs``: the references in order;
    ``expr``: the arithmetic AST when it is an expression, else None."""

    source: str
    refs: tuple[str, ...]
    kind: str                   # "ref", "expr" or "text"
    expr: ast.AST | None = None

    def evaluate(self, lookup: Callable[[str], Any]) -> Any:
        """The value, with ``lookup(ref)`` giving each reference's value (raising
        ``TemplateError`` if it has none)."""
        if self.kind == "ref":
            return lookup(self.refs[0])
        if self.kind == "expr":
            values = {_PLACEHOLDER.format(i): lookup(r) for i, r in enumerate(self.refs)}
            return _eval(self.expr, values, self.refs)
        return REF_RE.sub(lambda m: _text(m.group(1), lookup(m.group(1))), self.source)


def parse_template(text: str) -> Template | None:
    """The template ``text`` is, or None when it holds no reference (a plain string)."""
    refs = tuple(m.group(1) for m in REF_RE.finditer(text))
    if not refs:
        return None
    if REF_RE.fullmatch(text.strip()):
        return Template(text, refs, "ref")
    counter = iter(range(len(refs)))
    replaced = REF_RE.sub(lambda m: _PLACEHOLDER.format(next(counter)), text)
    if not _ARITH_CHARS.match(replaced):
        return Template(text, refs, "text")
    try:
        tree = ast.parse(replaced.strip(), mode="eval").body
    except SyntaxError:
        return Template(text, refs, "text")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if not names or not names <= {_PLACEHOLDER.format(i) for i in range(len(refs))}:
        return Template(text, refs, "text")
    _check_arith(tree, text)
    return Template(text, refs, "expr", tree)


def _check_arith(node: ast.AST, text: str) -> None:
    if isinstance(node, ast.BinOp):
        if not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv)):
            raise TemplateError(f"{text!r}: only + - * / // are allowed")
        _check_arith(node.left, text)
        _check_arith(node.right, text)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise TemplateError(f"{text!r}: only + - * / // are allowed")
        _check_arith(node.operand, text)
    elif isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise TemplateError(f"{text!r}: {node.value!r} is not a number")
        problem = _number_problem(node.value)
        if problem:
            raise TemplateError(f"{text!r}: the number {problem}")
    elif not isinstance(node, ast.Name):
        raise TemplateError(f"{text!r}: only numbers, {{references}}, + - * / // and "
                            "parentheses are allowed")


# Integers in template arithmetic stay within 64 bits (every count, length and id in a model
# config does); floats are finite. Beyond that an expression is refused, never a traceback.
MAX_INTEGER = 2 ** 63


def _number_problem(value: int | float) -> str | None:
    """Why ``value`` cannot take part in template arithmetic, or None."""
    if isinstance(value, int) and abs(value) >= MAX_INTEGER:
        digits = len(str(abs(value)))
        return f"{value if digits < 30 else f'(an integer of {digits} digits)'} is outside " \
               "the 64-bit integer range"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    return None


def _eval(node: ast.AST, values: dict[str, Any], refs: tuple[str, ...]) -> int | float:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        value = values[node.id]
        ref = refs[int(node.id[len("__ref"):-2])]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TemplateError(f"{{{ref}}} is {_kind(value)}, not a number")
        problem = _number_problem(value)
        if problem:
            raise TemplateError(f"{{{ref}}}: {problem}")
        return value
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, values, refs)
        return -operand if isinstance(node.op, ast.USub) else operand
    if not isinstance(node, ast.BinOp):          # parse_template admits no other node
        raise TemplateError(f"unsupported expression {ast.dump(node)}")
    left, right = _eval(node.left, values, refs), _eval(node.right, values, refs)
    if isinstance(node.op, (ast.Div, ast.FloorDiv)) and right == 0:
        raise TemplateError("division by zero")
    try:
        if isinstance(node.op, ast.Add):
            result = left + right
        elif isinstance(node.op, ast.Sub):
            result = left - right
        elif isinstance(node.op, ast.Mult):
            result = left * right
        elif isinstance(node.op, ast.Div):
            result = left / right
        else:
            result = left // right
            result = int(result) if math.isfinite(result) else result  # exact, floats too
    except OverflowError:
        result = math.inf
    problem = _number_problem(result)
    if problem:
        raise TemplateError(f"the result {problem}")
    return result


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), "a value")


def _text(ref: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TemplateError(f"{{{ref}}} is {_kind(value)}; only strings and numbers can be "
                            "placed inside text")
    return str(value)


def config_ref(ref: str) -> tuple[str, list[str]] | None:
    """``(file, keys)`` for a reference into a model JSON file, else None (a parameter)."""
    head, _, rest = ref.partition(".")
    if head in CONFIG_FILES and rest:
        return CONFIG_FILES[head], rest.split(".")
    return None


def read_config_ref(data: Any, file: str, keys: list[str], ref: str) -> Any:
    """The value at ``keys`` in a model JSON document (None: the file is missing)."""
    if data is None:
        raise TemplateError(f"{{{ref}}}: the model has no {file}")
    value = data
    for depth, key in enumerate(keys):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            where = ".".join(keys[:depth]) or "the document"
            raise TemplateError(f"{{{ref}}}: {file} has no {'.'.join(keys[:depth + 1])} "
                                f"({where} is {_kind(value)} without {key!r})")
    translate = _TRANSLATED.get(ref.partition(".")[0])
    if translate is not None:
        if not isinstance(value, list):
            raise TemplateError(f"{{{ref}}}: {file} {'.'.join(keys)} is {_kind(value)}, "
                                f"not a list of module patterns")
        try:
            return translate(value)
        except ValueError as exc:
            raise TemplateError(f"{{{ref}}}: {file} {'.'.join(keys)}: {exc}") from None
    return value


def walk_templates(value: Any, fn: Callable[[Template], Any]) -> Any:
    """``value`` with every ``Template`` inside (at any depth) replaced by ``fn(template)``."""
    if isinstance(value, Template):
        return fn(value)
    if isinstance(value, dict):
        return {k: walk_templates(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [walk_templates(v, fn) for v in value]
    return value


def templates_in(value: Any) -> list[Template]:
    found: list[Template] = []
    walk_templates(value, lambda t: found.append(t))
    return found
