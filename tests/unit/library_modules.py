"""Import the collection's Ansible modules (plugins/modules/*.py) for unit tests, under their real package names
(ansible_collections.gpu_install.node.plugins.modules.<name>), so their module_utils imports resolve as on a node."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from installer import content

MODULES = content.modules_dir()
PACKAGE = f"ansible_collections.{content.NAMESPACE}.{content.NAME}.plugins.modules"


def load_module(name: str) -> ModuleType:
    where = str(content.collections_path())
    if where not in sys.path:
        sys.path.insert(0, where)
    mod = importlib.import_module(f"{PACKAGE}.{name}")
    assert Path(mod.__file__).resolve() == (MODULES / f"{name}.py").resolve(), mod.__file__
    return mod
