"""scripts/build-kubernetes and gpu_install_lab.kube.binaries agree on what the cache holds."""

from __future__ import annotations

import re

from gpu_install_lab.kube import binaries


def script_var(name: str) -> str:
    m = re.search(rf'^{name}="?([^"\n#]*)"?', binaries.BUILD_SCRIPT.read_text(), re.M)
    assert m, name
    return m.group(1).strip()


def test_script_and_module_list_the_same_binaries():
    assert tuple(script_var("BINARIES").split()) == binaries.BINARIES
    assert "kubelet" in binaries.BINARIES  # the real kubelet is built too (not only kubemark)


def test_recipe_is_read_from_the_script():
    assert binaries._script_recipe() == script_var("RECIPE")
    assert int(script_var("RECIPE")) >= 4  # 4: empty strings in custom resources are no longer null


def test_cache_without_kubelet_is_incomplete(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_CACHE", str(tmp_path))
    d = binaries.bin_dir()
    d.mkdir(parents=True)
    (d / "BUILD-INFO").write_text(f"version=1.20.2\nrecipe={binaries._script_recipe()}\n")
    for b in binaries.BINARIES:
        (d / b).write_text("#!/bin/sh\n")
        (d / b).chmod(0o755)
    assert binaries.find_binaries() == d
    (d / "kubelet").unlink()
    assert binaries.find_binaries() is None
