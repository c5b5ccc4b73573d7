"""Where gpu-install's shipped content lives: the Ansible collection gpu_install.node (playbooks, roles, modules,
module_utils), ansible.cfg and the catalog (values/). The ONE place that knows; everything else asks here.

Installed from a wheel/sdist the content is package data under installer/_content (found with importlib.resources);
in a checkout (editable install, tests) it is the repository's top level. Either way that directory is the root of
the collection gpu_install.node: Ansible finds it through collections_path(), a directory holding
ansible_collections/gpu_install/node as a link to the root. No roles_path or library setting is involved.

`python -m installer.content` prints the ANSIBLE_CONFIG and ANSIBLE_COLLECTIONS_PATH settings for running the
playbooks by hand with ansible-playbook.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path

NAMESPACE = "gpu_install"
NAME = "node"
COLLECTION = f"{NAMESPACE}.{NAME}"


@lru_cache(maxsize=1)
def root() -> Path:
    """The directory holding playbooks/, roles/, plugins/, values/ and ansible.cfg (the collection's root)."""
    packaged = Path(str(resources.files("installer") / "_content"))
    if (packaged / "playbooks").is_dir():
        return packaged.resolve()
    return Path(__file__).resolve().parent.parent


def playbooks_dir() -> Path:
    return root() / "playbooks"


def roles_dir() -> Path:
    return root() / "roles"


def role_dir(role: str) -> Path:
    """A role of the collection by its short name (nvidia_driver) or FQCN (gpu_install.node.nvidia_driver)."""
    return roles_dir() / role.removeprefix(COLLECTION + ".")


def modules_dir() -> Path:
    return root() / "plugins" / "modules"


def module_utils_dir() -> Path:
    return root() / "plugins" / "module_utils"


def ansible_cfg() -> Path:
    return root() / "ansible.cfg"


def catalog_dir() -> Path:
    return root() / "values" / "catalog"


def mig_models_file() -> Path:
    return root() / "values" / "mig" / "models.yaml"


def sharing_pins_file(mode: str) -> Path:
    """values/sharing/<mode>.yaml: the pinned images of a sharing mode."""
    return root() / "values" / "sharing" / f"{mode}.yaml"


def chart_dir(name: str) -> Path:
    """charts/<name>: a Helm chart of gpu-install's own (e.g. gpu-manager for sharing.mode gpumanager)."""
    return root() / "charts" / name


def fqcn(name: str) -> str:
    """gpu_install.node.<name>: how playbooks, roles and tests name the collection's roles and modules."""
    return f"{COLLECTION}.{name}"


def _cache_base() -> Path:
    from installer.util import cache_dir

    key = hashlib.sha256(str(root()).encode()).hexdigest()[:12]  # one per checkout / installed copy
    return cache_dir() / "collections" / key


def collections_path(base: str | os.PathLike[str] | None = None) -> Path:
    """A directory to put on ANSIBLE_COLLECTIONS_PATH: it holds ansible_collections/gpu_install/node, a symbolic link
    to root(). Made (or corrected) on demand, atomically, so concurrent callers agree.

    base: where to make it (apply puts it in the run's private data dir); default: a per-content-root directory
    under the cache root's collections/ ($GPU_INSTALL_CACHE; a temp directory when the cache is not writable)."""
    bases = [Path(base)] if base is not None else [
        _cache_base(), Path(tempfile.gettempdir()) / f"gpu-install-{os.getuid()}" / _cache_base().name]
    error: OSError | None = None
    for where in bases:
        try:
            _link(where)
            return where
        except OSError as exc:
            error = exc
    raise OSError(f"cannot make the {COLLECTION} collection link under {bases[-1]}: {error}")


def _link(where: Path) -> None:
    link = where / "ansible_collections" / NAMESPACE / NAME
    target = str(root())
    if link.is_symlink() and os.readlink(link) == target:
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{NAME}.{os.getpid()}.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(target, tmp, target_is_directory=True)
    os.replace(tmp, link)  # atomic; fails (OSError) on a real directory in the way, which is not ours to remove


def ansible_env(base: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The environment the playbooks run with: this content's ansible.cfg and the collection on the collections path
    (only ours: an older gpu_install.node elsewhere cannot shadow it)."""
    return {"ANSIBLE_CONFIG": str(ansible_cfg()), "ANSIBLE_COLLECTIONS_PATH": str(collections_path(base))}


if __name__ == "__main__":  # pragma: no cover - a helper for running the playbooks by hand
    for key, value in ansible_env().items():
        print(f"export {key}={value}")
    print(f"# ansible-playbook -i INVENTORY {playbooks_dir() / 'site.yml'}")
