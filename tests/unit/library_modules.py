"""Import the project's Ansible modules (library/*.py, single files outside any package) for unit tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

LIBRARY = Path(__file__).resolve().parent.parent.parent / "library"


def load_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, LIBRARY / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
