"""Where gpu-install's shipped content lives: the Ansible content (playbooks, roles, modules), ansible.cfg and the
catalog (values/). The ONE place that knows; everything else asks here.

Installed from a wheel/sdist the content is package data under installer/_content (found with importlib.resources);
in a checkout (editable install, tests) it is the repository's top level.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def root() -> Path:
    """The directory holding playbooks/, roles/, values/ and ansible.cfg."""
    here = Path(__file__).resolve().parent
    packaged = here / "_content"
    if (packaged / "playbooks").is_dir():
        return packaged
    return here.parent


def playbooks_dir() -> Path:
    return root() / "playbooks"


def ansible_cfg() -> Path:
    return root() / "ansible.cfg"


def catalog_dir() -> Path:
    return root() / "values" / "catalog"


def mig_models_file() -> Path:
    return root() / "values" / "mig" / "models.yaml"
