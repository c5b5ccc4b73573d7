"""The product (installer/) never imports the lab (gpu_install_lab/); the lab's CLI arrives as a plugin
(entry point group "gpu_install.commands") that costs nothing heavy at start-up and disappears when the
[lab] extra is not installed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAB = "gpu_install_lab"


def lab_imports(source: str, filename: str = "<source>") -> list[str]:
    """`import gpu_install_lab…`, `from gpu_install_lab… import …` and import_module("gpu_install_lab…")
    anywhere in the module (functions, classes, try blocks included), as 'line: what'."""
    found = []

    def is_lab(name: str | None) -> bool:
        return bool(name) and (name == LAB or name.startswith(LAB + "."))  # type: ignore[union-attr]

    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if is_lab(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_lab(node.module):
            found.append(f"{node.lineno}: from {node.module} import …")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and is_lab(str(node.args[0].value)):
                found.append(f"{node.lineno}: {name}({node.args[0].value!r})")
    return found


def test_the_checker_sees_every_form():
    src = (
        "import os\nimport gpu_install_lab\nfrom gpu_install_lab.lab import Lab\n"
        "def f():\n    import gpu_install_lab.kube as k\n    from gpu_install_lab import pki\n"
        "class C:\n    def g(self):\n        import importlib\n"
        "        return importlib.import_module('gpu_install_lab.cli')\n"
        "from installer import lab_things\nimport gpu_install_labs\n"
    )
    assert [f.split(":")[0] for f in lab_imports(src)] == ["2", "3", "5", "6", "10"]


def test_installer_never_imports_the_lab():
    offenders = []
    for path in sorted((ROOT / "installer").rglob("*.py")):
        offenders += [f"{path.relative_to(ROOT)}:{f}" for f in lab_imports(path.read_text(), str(path))]
    assert offenders == [], "the product must not import the lab:\n" + "\n".join(offenders)


def test_importing_every_installer_module_loads_no_lab():
    code = (
        "import importlib, pkgutil, sys, installer\n"
        "names = [m.name for m in pkgutil.walk_packages(installer.__path__, 'installer.')]\n"
        "for n in names: importlib.import_module(n)\n"
        f"print(len(names), sorted(m for m in sys.modules if m == {LAB!r} or m.startswith({LAB + '.'!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    count, _, loaded = out.stdout.strip().partition(" ")
    assert int(count) > 20 and loaded == "[]", out.stdout


def test_lab_command_is_a_cheap_plugin():
    code = (
        "import sys; from installer.cli import build_parser; p = build_parser(); "
        "sub = next(a for a in p._actions if a.dest == 'command'); "
        "print('lab' in sub.choices, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('cryptography', 'bcrypt', 'kubernetes', 'yaml') or (m.startswith('gpu_install_lab.') and m != 'gpu_install_lab.cli')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True []", out.stdout + out.stderr


def test_without_the_lab_extra_there_is_no_lab_command():
    # sys.modules[name] = None makes find_spec/import report the module as not installed
    code = (
        "import sys; sys.modules['cryptography'] = None\n"
        "from installer.cli import build_parser, main\n"
        "p = build_parser(); sub = next(a for a in p._actions if a.dest == 'command')\n"
        "print(sorted(sub.choices))\n"
        "main(['lab', 'status'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice: 'lab'" in out.stderr, out.stderr
    commands = eval(out.stdout)  # noqa: S307 - our own print of a list of names
    assert "lab" not in commands and {"render", "images", "config", "catalog"} <= set(commands)


def test_a_plugin_that_cannot_load_registers_nothing(monkeypatch):
    import importlib.metadata

    from installer import cli

    ghost = importlib.metadata.EntryPoint("ghost", "gpu_install_ghost.cli:register", "gpu_install.commands")
    real = importlib.metadata.entry_points(group="gpu_install.commands")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ghost, *real])
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert "ghost" not in sub.choices and "lab" in sub.choices
