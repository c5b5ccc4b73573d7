"""installer/mirror imports itself without a cycle: the shared helpers live in common (credentials, CA, skopeo,
fetch, --since, paths inside the bundle, failures) and lock (the lock's entries as untrusted input), and the modules
of the kinds (images, charts, packages) and verify import those, never each other for them.

The graph is read from the source with ast (no module is imported): every import statement of every module under
installer/mirror -- at the top, inside a function, under TYPE_CHECKING alike -- that names another module there."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import installer.mirror

ROOT = Path(installer.mirror.__file__).parent
PACKAGE = "installer.mirror"


def _module(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the modules of the package it imports}, from the source of every .py file below root."""
    modules = {_module(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package the module is in
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import mod` imports pkg.mod when that is a module, else a name of pkg
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules:  # `import installer.mirror.images.x` -> its module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_installer_mirror_has_no_import_cycle() -> None:
    graph = import_graph()
    # the graph is the real one: the kinds import the shared modules (a reader that found nothing would pass)
    assert {"installer.mirror.common", "installer.mirror.lock"} <= graph["installer.mirror.images"]
    assert "installer.mirror.common" in graph["installer.mirror.charts"]
    assert "installer.mirror.packages.tools" in graph["installer.mirror.packages.resolve"]
    assert cycle(graph) is None, f"import cycle in {PACKAGE}: {' -> '.join(cycle(graph) or [])}"


def test_shared_modules_import_no_kind() -> None:
    graph = import_graph()
    kinds = {f"{PACKAGE}.{k}" for k in ("images", "charts", "packages", "verify")}
    for shared in (f"{PACKAGE}.common", f"{PACKAGE}.lock", f"{PACKAGE}.registry", f"{PACKAGE}.bundle"):
        assert not graph[shared] & kinds, f"{shared} imports {graph[shared] & kinds}"


@pytest.mark.parametrize("source", [
    "from installer.mirror.b import x\n",  # from a module
    "def f():\n    from installer.mirror import b\n",  # a lazy import counts as much
    "from . import b\n",  # relative
])
def test_the_reader_finds_a_cycle(tmp_path: Path, source: str) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text(source)
    (tmp_path / "b.py").write_text("import installer.mirror.a\n")
    graph = import_graph(tmp_path)
    assert graph[f"{PACKAGE}.a"] == {f"{PACKAGE}.b"}
    assert cycle(graph) is not None
