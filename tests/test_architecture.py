"""The package layout's rules (docs/architecture.md): which package may import which.

Imports are read with ``ast`` from every module of a package, including imports inside
functions, and resolved to absolute module names, so a relative import counts like an absolute one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PATCHER = Path(__file__).resolve().parent.parent / "patcher"

# Layers above the library: nothing in the library imports the command line or the API facade.
_ABOVE = ("patcher.cli", "patcher.api")

# package -> packages it must not import (directly or from inside a function)
FORBIDDEN = {
    "patcher.recipe": ("patcher.execute", "patcher.hub", "patcher.tensors", "patcher.plan",
                       *_ABOVE),
    "patcher.model": ("patcher.execute", "patcher.hub", "patcher.tensors", "patcher.plan",
                      *_ABOVE),
    "patcher.config": ("patcher.execute", "patcher.hub", "patcher.tensors", "patcher.plan",
                       *_ABOVE),
    "patcher.tensors": ("patcher.execute", "patcher.hub", *_ABOVE),
    "patcher.integrity": ("patcher.execute", "patcher.hub", *_ABOVE),
    "patcher.execute": ("patcher.hub", *_ABOVE),
    "patcher.gguf": ("patcher.hub", *_ABOVE),
    "patcher.remote": _ABOVE,
    "patcher.signing": ("patcher.execute", "patcher.hub", "patcher.tensors", "patcher.plan",
                        "patcher.recipe", *_ABOVE),
    "patcher.hub": _ABOVE,
    # a saved plan is read back by the library itself, never through the hub
    "patcher.saved_plan": ("patcher.hub", *_ABOVE),
    "patcher.saved_plan_checks": ("patcher.hub", "patcher.execute", *_ABOVE),
    # the hub's storage is pure standard library: the Starlette side is the server's
    "patcher.hub.store": ("patcher.hub.server",),
}

# exceptions to FORBIDDEN: recipe validation reads the scheme names from the registry (torch-free)
ALLOWED = {"patcher.recipe": ("patcher.tensors.schemes",)}

# modules every package may import: they import nothing from patcher
STANDALONE = ("patcher.collector", "patcher.errors", "patcher.fsops", "patcher.faults",
              "patcher.units", "patcher.display", "patcher.dispatch", "patcher.changes",
              "patcher.file_task")


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


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    folder = PATCHER.parent.joinpath(*package.split("."))
    paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
    assert paths and all(p.is_file() for p in paths), package     # never pass on a typo
    found = []
    for path in paths:
        module = module_name(path)
        for line, name in imported_modules(path.read_text(), module, path.name == "__init__.py"):
            if any(is_within(name, banned) for banned in forbidden) and not any(
                    is_within(name, allowed) for allowed in ALLOWED.get(package, ())):
                found.append(f"{path.relative_to(PATCHER.parent)}:{line} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package):
    assert violations(package, FORBIDDEN[package]) == []


@pytest.mark.parametrize("module", STANDALONE)
def test_standalone_modules_import_nothing_from_patcher(module):
    assert violations(module, ("patcher",)) == []


# modules that sit just above the standalone ones: everything may import them, so they import
# only what is named here (the parsing of a MODEL, the plan's options)
LEAVES = {"patcher.model_ref": ("patcher.errors", "patcher.names"),
          "patcher.plan_options": ("patcher.errors",)}


@pytest.mark.parametrize("module", sorted(LEAVES))
def test_leaf_modules_import_only_their_few(module):
    found = [v for v in violations(module, ("patcher",))
             if not any(v.endswith(f"imports {name}") or f"imports {name}." in v
                        for name in LEAVES[module])]
    assert found == []


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
    import shutil

    copy = tmp_path / "patcher"
    shutil.copytree(PATCHER, copy, ignore=shutil.ignore_patterns("__pycache__", "builtin_recipes"))
    linking = copy / "execute" / "linking.py"
    linking.write_text(linking.read_text() + "\nfrom ..cli.render import human_bytes\n")
    monkeypatch.setitem(globals(), "PATCHER", copy)
    found = violations("patcher.execute", FORBIDDEN["patcher.execute"])
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
