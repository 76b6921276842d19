"""Packaging: the distribution's metadata declares ranges, never exact pins.

An exact ``torch==X`` made ``pip install -e .`` replace a user's CUDA torch with the CPU build.
The tested torch lives in ``constraints/cpu.txt`` instead, which only the README and CI use.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def _exact_pins(dist: metadata.Distribution) -> list[str]:
    """Every ``Requires-Dist`` (of any extra) whose specifier pins one version (== or ===)."""
    pins = []
    for line in dist.requires or []:
        req = Requirement(line)
        if any(spec.operator in ("==", "===") for spec in req.specifier):
            pins.append(line)
    return pins


@pytest.fixture(scope="module")
def built_metadata(tmp_path_factory) -> metadata.Distribution:
    """The metadata this checkout builds, as pip would install it (setuptools' PEP 517 hook)."""
    out = tmp_path_factory.mktemp("dist-info")
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    name = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return metadata.PathDistribution(out / name)


def test_built_metadata_pins_nothing_exactly(built_metadata):
    assert built_metadata.metadata["Name"] == "modelpatch"
    assert built_metadata.requires, "no Requires-Dist at all: the metadata was not read"
    assert _exact_pins(built_metadata) == []


def test_torch_is_a_range_the_tested_build_satisfies(built_metadata):
    torch_reqs = [Requirement(r) for r in built_metadata.requires
                  if Requirement(r).name == "torch"]
    assert len(torch_reqs) == 1
    assert torch_reqs[0].specifier.contains("2.13.0+cpu")   # the tested build
    assert torch_reqs[0].specifier.contains("2.9.1+cu128")  # a vLLM machine's build stays


def test_installed_metadata_pins_nothing_exactly():
    """The installed distribution, when it was installed from this checkout (as in CI)."""
    try:
        dist = metadata.distribution("modelpatch")
    except metadata.PackageNotFoundError:
        pytest.skip("modelpatch is not installed")
    origin = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if os.path.realpath(origin.removeprefix("file://")) != str(REPO):
        pytest.skip(f"the installed modelpatch comes from {origin or 'an index'}, "
                    "not this checkout")
    assert _exact_pins(dist) == []


def test_the_cpu_constraint_pins_the_tested_torch():
    lines = [line.strip() for line in (REPO / "constraints" / "cpu.txt").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "torch==2.13.0+cpu"
    assert "transformers==5.25.0" in lines
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", line) for line in lines), lines
    readme = (REPO / "README.md").read_text()
    opening = readme[readme.index("```bash"):readme.index("```", readme.index("```bash") + 3)]
    ci = (REPO / ".ci" / "run").read_text()
    installs = [line for text in (opening, ci) for line in text.splitlines()
                if line.startswith("python3 -m venv")]
    assert len(installs) == 3, installs            # the README's two commands and .ci/run's
    assert all("/pip install -q -c constraints/cpu.txt -e " in line for line in installs)


def test_the_package_is_marked_typed_and_ships_the_marker():
    """PEP 561: type checkers read the annotations of an installed ``patcher`` only when
    ``py.typed`` is in the package and in what the build ships."""
    import tomllib

    assert (REPO / "patcher" / "py.typed").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["patcher"]


def test_the_version_is_one_and_released():
    """``patcher.__version__`` (recorded in every manifest) is pyproject's version, and the
    CHANGELOG has a dated section for it."""
    import patcher

    tomllib = pytest.importorskip("tomllib")           # Python 3.11+

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert patcher.__version__ == version
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog,
                     re.MULTILINE)
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.MULTILINE)
    assert len(headings) == len(set(headings)), headings      # one section a version
