"""The package layout's rules (docs/architecture.md): which package may import which.

Imports are read with ``ast`` from every module of a package, including imports inside
functions, and resolved to absolute module names, so a relative import counts like an absolute one.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

PATCHER = Path(__file__).resolve().parent.parent / "patcher"
ARCHITECTURE = PATCHER.parent / "docs" / "architecture.md"

# Layers above the library: nothing in the library imports the command line or the API facade.
_ABOVE = ("patcher.cli", "patcher.api")

# rules inside one package, which the table of docs/architecture.md §4 (between packages) does
# not reach: the hub's storage is pure standard library, the Starlette side is the server's
FORBIDDEN = {"patcher.hub.store": ("patcher.hub.server",)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PATCHER.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, absolute module)`` for each import in ``source``, the code of ``module``. For
    ``from X import name`` both ``X`` and ``X.name`` are listed (``name`` may be a module)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def is_within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def module_paths(package: str) -> list[Path]:
    folder = PATCHER.parent.joinpath(*package.split("."))
    paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
    assert paths and all(p.is_file() for p in paths), package     # never pass on a typo
    return paths


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in module_paths(package):
        module = module_name(path)
        for line, name in imported_modules(path.read_text(), module, path.name == "__init__.py"):
            if any(is_within(name, banned) for banned in forbidden):
                found.append(f"{path.relative_to(PATCHER.parent)}:{line} imports {name}")
    return found


# --------------------------------------------------------------------------- the layers

# The table's row of what every module may import (modules that import nothing from patcher).
EVERYWHERE = "every module"


def nodes() -> list[str]:
    """The graph's nodes: the top-level packages and modules of ``patcher``, by name."""
    return sorted(p.stem if p.suffix == ".py" else p.name for p in PATCHER.iterdir()
                  if (p.suffix == ".py" and p.name != "__init__.py")
                  or (p.is_dir() and (p / "__init__.py").is_file()))


def node_of(module: str) -> str | None:
    """The node ``patcher.X...`` belongs to (None for ``patcher`` itself and its attributes)."""
    parts = module.split(".")
    if parts[0] != "patcher" or len(parts) < 2 or parts[1] not in nodes():
        return None
    return parts[1]


def import_edges() -> dict[str, dict[str, list[str]]]:
    """node -> imported node -> ``file:line imports module``, for every import of every module
    (at the top and inside functions), imports within a node left out."""
    edges: dict[str, dict[str, list[str]]] = {n: {} for n in nodes()}
    for node in nodes():
        for path in module_paths(f"patcher.{node}"):
            module = module_name(path)
            for line, name in imported_modules(path.read_text(), module,
                                               path.name == "__init__.py"):
                target = node_of(name)
                if target is not None and target != node:
                    edges[node].setdefault(target, []).append(
                        f"{path.relative_to(PATCHER.parent)}:{line} imports {name}")
    return edges


def cycles(edges: dict[str, dict[str, list[str]] | set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer_table(text: str) -> dict[str, tuple[str, ...]]:
    """The table of docs/architecture.md §4: node -> what it may import (``everything``, or
    the backticked names of its cell: a node, or ``node.module`` for that part alone)."""
    section = text.split("## 4. ", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines()
            if line.startswith("| `") or line.startswith(f"| {EVERYWHERE} |")]
    assert rows, "docs/architecture.md §4 has no table"
    table: dict[str, tuple[str, ...]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert len(cells) == 2, row
        allowed = ("everything",) if cells[1] == "everything" else tuple(
            re.findall(r"`([\w.]+)`", cells[1]))
        names = [EVERYWHERE] if cells[0] == EVERYWHERE else \
            re.findall(r"`([\w.]+?)(?:\.py|/)?`", cells[0])
        for name in names:
            assert name not in table, f"{name} has two rows"
            table[name] = allowed
    return table


def undeclared(edges, table) -> list[str]:
    """Each import the table does not allow its node."""
    base = set(table.get(EVERYWHERE, ()))
    found = []
    for node, targets in sorted(edges.items()):
        allowed = table.get(node, ())
        if "everything" in allowed:
            continue
        for target, sites in sorted(targets.items()):
            if target in base:
                continue
            for site in sites:
                name = site.rsplit(" imports ", 1)[1]
                if not any(is_within(name, f"patcher.{a}") for a in allowed):
                    found.append(site)
    return found


def allowed_graph(table) -> dict[str, set[str]]:
    """node -> the nodes its row allows (``everything``: all of them), for the cycle check
    of the document itself."""
    all_nodes = set(nodes())
    return {node: (all_nodes - {node}) if "everything" in allowed
            else {a.split(".")[0] for a in allowed} - {node}
            for node, allowed in table.items() if node != EVERYWHERE}


@pytest.fixture(scope="module")
def table():
    return layer_table(ARCHITECTURE.read_text())


def test_the_table_names_every_package_once_and_only_real_ones(table):
    """A new package or top-level module gets its row; a row names only what exists."""
    real = set(nodes())
    named = set(table) - {EVERYWHERE}
    assert sorted(real - named) == [], "packages without a row in docs/architecture.md §4"
    assert sorted(named - real) == [], "rows of docs/architecture.md §4 naming nothing"
    for node, allowed in table.items():
        for name in allowed:
            if name == "everything":
                continue
            path = PATCHER.joinpath(*name.split("."))
            assert path.is_dir() or path.with_suffix(".py").is_file(), f"{node}: {name}"
    for name in table.get(EVERYWHERE, ()):
        assert violations(f"patcher.{name}", ("patcher",)) == [], name


def test_every_import_is_one_the_table_allows(table):
    assert undeclared(import_edges(), table) == []


def test_no_package_import_cycle():
    """Top-level packages and modules as nodes, every import (functions included) an edge:
    the graph has no cycle, so each layer can be read, tested and changed below the next."""
    assert cycles(import_edges()) == []


def test_the_table_itself_is_layered(table):
    assert cycles(allowed_graph(table)) == []


def test_a_planted_cycle_is_caught(tmp_path, monkeypatch):
    """The cycle check fails on a copy of the tree where ``config`` imports ``plan`` (which
    imports ``config``), and the table check names the import."""
    copy = tmp_path / "patcher"
    shutil.copytree(PATCHER, copy, ignore=shutil.ignore_patterns("__pycache__", "builtin_recipes"))
    pointer = copy / "config" / "json_pointer.py"
    pointer.write_text(pointer.read_text() + "\ndef _late():\n    from ..plan import types\n")
    monkeypatch.setitem(globals(), "PATCHER", copy)
    edges = import_edges()
    assert any({"config", "plan"} <= set(c) for c in cycles(edges))
    found = undeclared(edges, layer_table(ARCHITECTURE.read_text()))
    assert any("patcher/config/json_pointer.py" in v and "patcher.plan" in v for v in found)


def test_the_table_parser_reads_cells_and_sees_a_cycle_in_them():
    text = ("## 4. Packages\n\n| package | may import |\n|---|---|\n"
            "| `a.py`, `b/` | `c`, `d.x` (the part named) |\n| `c/` | `a` |\n"
            "| `cli/` | everything |\n| every module | `e` |\n\n## 5. Next\n| `z/` | `a` |\n")
    table = layer_table(text)
    assert table == {"a": ("c", "d.x"), "b": ("c", "d.x"), "c": ("a",),
                     "cli": ("everything",), EVERYWHERE: ("e",)}
    assert cycles({"a": {"c"}, "c": {"a"}, "b": {"c"}}) == [["a", "c"]]
    assert cycles({"a": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package):
    assert violations(package, FORBIDDEN[package]) == []


def test_no_library_module_imports_the_command_line_or_the_api():
    """Only ``cli`` (and ``doctor``, a command of its own that runs ``api``) sit above the API."""
    packages = [p for p in sorted(PATCHER.iterdir())
                if (p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py"]
    found = []
    for path in packages:
        name = module_name(path if path.suffix == ".py" else path / "__init__.py")
        if name in ("patcher", "patcher.cli", "patcher.doctor"):
            continue
        found += violations(name, ("patcher.cli",) if name == "patcher.api" else _ABOVE)
    assert found == []


def test_a_leak_into_the_command_line_is_reported(tmp_path, monkeypatch):
    """The rule above fails on the leak it guards against (a copy of the tree with one)."""
    copy = tmp_path / "patcher"
    shutil.copytree(PATCHER, copy, ignore=shutil.ignore_patterns("__pycache__", "builtin_recipes"))
    linking = copy / "execute" / "linking.py"
    linking.write_text(linking.read_text() + "\nfrom ..cli.render import human_bytes\n")
    monkeypatch.setitem(globals(), "PATCHER", copy)
    found = violations("patcher.execute", _ABOVE)
    assert any("patcher/execute/linking.py" in v and "patcher.cli.render" in v for v in found)


def test_no_assert_statement_is_a_runtime_check():
    """``python -O`` drops asserts: every check in ``patcher`` raises a real error."""
    found = [f"{path.relative_to(PATCHER.parent)}:{node.lineno}"
             for path in sorted(PATCHER.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert)]
    assert found == []


def test_relative_imports_are_resolved():
    """The resolver sees through relative imports, imports inside functions and module names
    imported from a package, so the rule above cannot pass by spelling an import differently."""
    source = ("from ..execute import engine\n"
              "def f():\n"
              "    from ..hub.client.publish import publish\n"
              "from .. import hub\n")
    names = [name for _, name in imported_modules(source, "patcher.recipe.load", False)]
    assert "patcher.execute.engine" in names
    assert "patcher.hub.client.publish" in names
    assert "patcher.hub" in names
    assert [name for _, name in imported_modules("from .schema import X\n", "patcher.recipe",
                                                 True)] == ["patcher.recipe.schema",
                                                            "patcher.recipe.schema.X"]


def test_every_package_says_what_lives_there():
    for init in sorted(PATCHER.rglob("__init__.py")):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring, f"{init.relative_to(PATCHER.parent)} has no docstring"


def test_a_forbidden_import_is_reported_with_its_line():
    """The scan over a real package finds real imports: ``execute`` does import ``integrity``."""
    found = violations("patcher.execute", ("patcher.integrity",))
    assert any(v.startswith("patcher/execute/patch_builder.py:")
               and "patcher.integrity.manifest" in v
               for v in found), found


# --------------------------------------------------------------------------- errors

# Exceptions that may live beside their code: the hub server's HTTP answers (their own hierarchy)
# and internal signals that never leave the module that raises them.
LOCAL_EXCEPTIONS = {
    "patcher.hub.request_errors": None,               # every class there
    "patcher.fsops": {"NotRegularFile", "TooLarge"},  # OSError flavours read_capped raises
    "patcher.integrity.digests.hashing": {"_Cancelled"},
    "patcher.integrity.manifest_rules": {"Invalid"},
    "patcher.signing.parse": {"_NotOMS"},             # becomes VerifyMismatch in parse_bundle
    "patcher.tensors.quant.kernel_args": {"NonFiniteInput"},
    "patcher.gguf.format": {"_NeedMore"},             # control flow: read more of the header
    "patcher.integrity.canonical_json": {"_NotPlain"},  # control flow: fall back to the stdlib
}


def all_exception_classes():
    import importlib
    import pkgutil

    import patcher

    for info in pkgutil.walk_packages(patcher.__path__, "patcher."):
        if info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, BaseException)
                    and value.__module__ == info.name):
                yield value


def test_errors_live_in_errors_py():
    stray = []
    for cls in all_exception_classes():
        allowed = LOCAL_EXCEPTIONS.get(cls.__module__, set())
        if cls.__module__ != "patcher.errors" and allowed is not None \
                and cls.__name__ not in allowed:
            stray.append(f"{cls.__module__}.{cls.__name__}")
    assert stray == []


def test_hub_http_errors_are_not_command_line_errors():
    from patcher.errors import PatchError
    from patcher.hub.request_errors import BadRequest, HubRequestError

    assert not issubclass(HubRequestError, PatchError)
    err = BadRequest("no such\nthing", headers={"Allow": "GET"})
    assert (err.status, err.message, err.headers) == (400, "no such\nthing", {"Allow": "GET"})


def test_no_module_imports_another_modules_private_names():
    found = []
    for path in sorted(PATCHER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or
                                                     (node.module or "").startswith("patcher")):
                found += [f"{path.relative_to(PATCHER.parent)}:{node.lineno} {alias.name}"
                          for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert found == []


def test_the_executors_ask_a_task_its_kind_not_its_type():
    """A plan's file tasks are a ``FileTask`` with a ``TaskKind``: no module guesses what a
    task or a model is from the attributes it happens to have."""
    import re

    guess = re.compile(r"""(hasattr|getattr)\([^)]*["'](write|header_in_place|source_path|"""
                       r"""transfer_report)["']""")
    found = [f"{path.relative_to(PATCHER.parent)}:{n}"
             for path in sorted(PATCHER.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if guess.search(line)]
    assert found == []
    assert guess.search('if hasattr(task, "write"):')
