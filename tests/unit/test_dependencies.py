"""Declared dependencies earn their place: each runtime dependency in pyproject.toml is imported by the product
(installer/), each extra's by the code it is for, and everything installer/ imports from outside the standard
library is declared."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def imported_top_level(package: Path) -> set[str]:
    """Top-level names of every module imported anywhere under a package (also inside functions)."""
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def provided(dist: str) -> set[str]:
    """Import names a distribution provides (from the installed metadata)."""
    want = dist.lower().replace("_", "-")
    return {mod for mod, dists in packages_distributions().items()
            if any(d.lower().replace("_", "-") == want for d in dists)}


def declared(reqs: list[str]) -> dict[str, set[str]]:
    return {Requirement(r).name: provided(Requirement(r).name) for r in reqs}


def test_every_runtime_dependency_is_imported_by_the_product():
    used = imported_top_level(ROOT / "installer")
    unused = {dist: mods for dist, mods in declared(PYPROJECT["dependencies"]).items() if not mods & used}
    assert not unused, f"declared in pyproject.toml but never imported by installer/: {unused}"


def test_every_third_party_import_of_the_product_is_declared():
    used = imported_top_level(ROOT / "installer") - set(sys.stdlib_module_names) - {"installer", "__future__"}
    covered = set().union(*declared(PYPROJECT["dependencies"]).values())
    assert used <= covered, f"imported by installer/ but not declared: {sorted(used - covered)}"


def test_every_extra_dependency_is_imported_where_it_is_for():
    homes = {"test": [ROOT / "tests"], "lab": [ROOT / "gpu_install_lab", ROOT / "installer" / "lab"]}
    extras = PYPROJECT.get("optional-dependencies", {})
    for extra, reqs in extras.items():
        used = set().union(*(imported_top_level(p) for p in homes.get(extra, []) if p.is_dir()))
        # commands CI runs, stubs mypy reads, pytest plugins (loaded through their entry point)
        tools = {"ansible-lint", "ruff", "mypy", "types-PyYAML", "pytest-timeout", "pytest-xdist"}
        unused = {d: m for d, m in declared(reqs).items() if d not in tools and not m & used}
        assert not unused, f"[{extra}] declares {sorted(unused)} but nothing under {homes.get(extra)} imports them"
