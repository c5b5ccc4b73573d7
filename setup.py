"""Build hook: the wheel carries the Ansible collection gpu_install.node and the catalog as package data.

The content lives at the repository's top level (playbooks/, roles/, plugins/, meta/, ansible.cfg, values/): that is
where Ansible tooling, ansible-lint and the tests expect a collection's root to be. A build copies it into
installer/_content/ of the wheel, where installer/content.py finds it through importlib.resources. Editable installs
copy nothing: content.py then finds the checkout. The sdist gets the same files through MANIFEST.in.
Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CONTENT = ["ansible.cfg", "meta", "playbooks", "plugins", "roles", "values/catalog", "values/mig", "values/sharing",
           "values/monitoring", "charts"]
IGNORE = shutil.ignore_patterns("__pycache__", "*.py[cod]", ".*")


class build_py_with_content(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "installer" / "_content"
        if dest.exists():
            shutil.rmtree(dest)
        for item in CONTENT:
            src, out = HERE / item, dest / item
            if not src.exists():
                raise FileNotFoundError(f"{src}: part of the Ansible content the wheel must carry")
            out.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, out, ignore=IGNORE)
            else:
                shutil.copy2(src, out)


setup(cmdclass={"build_py": build_py_with_content})
