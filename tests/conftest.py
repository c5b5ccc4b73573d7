"""Shared test helpers. Lab fixtures live in tests/integration/conftest.py."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT.parent / "shared" / "upstream" / "gpu-operator"

BASE_SITE = {
    "operator": {"version": "v24.9.2"},
    "registry": {"host": "registry.lab:5000", "pullSecret": {"name": "gpu-registry"}},
}


@pytest.fixture
def site_data() -> dict:
    return copy.deepcopy(BASE_SITE)


@pytest.fixture
def write_site(tmp_path):
    import yaml

    def write(data: dict, name: str = "site.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return path

    return write


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from installer.cli import main

    def run(*args: str):
        rc = main([str(a) for a in args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def plan_of(site, nodes=None, inventory: str | None = None, **options):
    """installer.plan.resolve for a parsed site, with GPU nodes given directly or from an inventory."""
    from installer.plan import Options, resolve

    return resolve(site, Options(inventory=str(inventory) if inventory else None, **options), facts=nodes)


def nodes_of(inventory) -> list:
    """The GPU nodes installer.plan reads from an inventory."""
    from installer.facts import node_from_vars
    from installer.plan import gpu_host_vars, load_inventory

    return [node_from_vars(name, hv) for name, hv in gpu_host_vars(load_inventory(str(inventory)))]


def upstream_available() -> bool:
    return (UPSTREAM / "matrix.json").is_file()


needs_upstream = pytest.mark.skipif(not upstream_available(), reason=f"upstream facts not found at {UPSTREAM}")
