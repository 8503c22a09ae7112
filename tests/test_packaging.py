"""Packaging: every third-party package placer imports is declared; the type marker ships."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def imported_top_level_modules() -> set[str]:
    found = set()
    for path in (ROOT / "placer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"placer", "__future__"}


def declared(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=\[ ;!~]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_imported_package_is_declared():
    extras = PYPROJECT["project"]["optional-dependencies"]
    names = declared(PYPROJECT["project"]["dependencies"]) | declared(extras["cuda"]) | declared(extras["pandas"])
    names |= {"distributed"}  # dask[distributed]
    dists = packages_distributions()
    missing = {}
    for mod in imported_top_level_modules():
        owners = {d.lower().replace("_", "-") for d in dists.get(mod, [mod])}
        if not owners & names:
            missing[mod] = sorted(owners)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_optional_packages_are_extras_not_requirements():
    core = declared(PYPROJECT["project"]["dependencies"])
    assert "pandas" not in core and "numba-cuda" not in core
    assert "pandas" in declared(PYPROJECT["project"]["optional-dependencies"]["pandas"])


def test_the_typed_marker_ships_with_the_package():
    assert (ROOT / "placer" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["placer"]
