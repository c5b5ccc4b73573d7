"""The nodes' architectures (gpu_install_arch, or a facts file): never an x86 artifact for an arm64 node. What cannot
exist on aarch64 (precompiled driver images, an x86_64 runfile) is refused when the plan is resolved (config check,
render, mirror), OS packages for aarch64 when they would be listed or pulled, and the nodes' architectures choose the
platform `mirror pull`/`sync` copy (refusing a --platform that leaves a node without its images)."""

from __future__ import annotations

import json

import pytest

from installer import architectures
from installer.errors import ConfigError
from installer.facts import Node
from tests.unit.test_facts_file import facts_doc, inventory, write

SITE = {"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"}}


def node(name: str, arch: str | None) -> Node:
    return Node(name, "ubuntu", "24.04", "6.8.0-45-generic", arch=arch)


@pytest.mark.parametrize("arches,given,every,expect", [
    (["aarch64", "aarch64"], None, False, ("linux/arm64", None)),
    (["x86_64"], None, False, ("linux/amd64", None)),
    (["x86_64", "aarch64"], None, False, ("all", "the nodes run 2 architectures (linux/amd64, linux/arm64): "
                                                  "multi-arch images are copied whole (every platform)")),
    ([None], None, False, ("linux/amd64", "the nodes' architecture is not known: images are copied for linux/amd64 "
                                          "(give gpu_install_arch in the inventory, or --facts FILE from `gpu-install "
                                          "nodes facts`)")),
    ([], None, False, ("linux/amd64", None)),
    (["aarch64"], "linux/arm64", False, ("linux/arm64", None)),
    (["aarch64", "x86_64"], None, True, ("all", None)),
    ([None], "linux/arm64", False, ("linux/arm64", None)),
])
def test_the_platform_follows_the_nodes(arches, given, every, expect):
    nodes = [node(f"gpu{i}", a) for i, a in enumerate(arches)]
    assert architectures.platform_for(nodes, given, every) == expect


def test_a_platform_leaving_a_node_without_its_images_is_refused():
    with pytest.raises(ConfigError) as exc:
        architectures.platform_for([node("gpu1", "x86_64"), node("gpu2", "aarch64")], "linux/amd64", False)
    assert exc.value.message == ("--platform linux/amd64: node(s) gpu2 run linux/arm64 images; they would get images "
                                 "they cannot run")
    assert "--all-platforms" in (exc.value.hint or "")


@pytest.mark.parametrize("driver,message", [
    ({"mode": "precompiled", "version": "580"},
     "driver.mode precompiled: NVIDIA publishes precompiled driver images for x86_64 only, and node(s) gh1 are aarch64"),
    ({"mode": "runfile", "runfile": "https://files.lab/NVIDIA-Linux-x86_64-580.105.08.run", "runfileSha256": "a" * 64},
     "driver.runfile NVIDIA-Linux-x86_64-580.105.08.run is the x86_64 runfile, and node(s) gh1 are aarch64"),
])
def test_what_cannot_exist_on_aarch64_is_refused_at_config_check(tmp_path, write_site, cli, driver, message):
    site = write_site({**SITE, "driver": driver})
    inv = inventory(tmp_path, {"gh1": {"gpu_install_os": "ubuntu24.04", "gpu_install_kernel": "6.8.0-1013-nvidia-64k",
                                       "gpu_install_arch": "aarch64"},
                               "x1": {"gpu_install_os": "ubuntu24.04", "gpu_install_kernel": "6.8.0-45-generic",
                                      "gpu_install_arch": "x86_64"}})
    rc, _, err = cli("config", "check", "-s", site, "-i", inv)
    assert rc == 2 and message in err, err
    inv_x86 = inventory(tmp_path, {"x1": {"gpu_install_os": "ubuntu24.04", "gpu_install_kernel": "6.8.0-45-generic",
                                          "gpu_install_arch": "x86_64"}})
    rc, _, err = cli("config", "check", "-s", site, "-i", inv_x86)
    assert rc == 0, err


def test_an_aarch64_runfile_for_aarch64_nodes_is_accepted(tmp_path, write_site, cli):
    site = write_site({**SITE, "driver": {"mode": "runfile", "runfileSha256": "a" * 64,
                                          "runfile": "https://files.lab/NVIDIA-Linux-aarch64-580.105.08.run"}})
    inv = inventory(tmp_path, {"gh1": {"gpu_install_os": "ubuntu24.04", "gpu_install_arch": "aarch64"}})
    rc, _, err = cli("config", "check", "-s", site, "-i", inv)
    assert rc == 0, err


def test_host_mode_packages_for_an_aarch64_node_are_refused_by_mirror_plan_and_pull(tmp_path, write_site, cli):
    """The facts say gh1 is aarch64: its packages would be resolved for x86_64, so listing them is refused; the x86_64
    node alone plans fine; `mirror pull --skip-packages` (images only) is not concerned."""
    doc = facts_doc(tmp_path, {"gh1": {}, "x1": {}})
    doc["hosts"][0]["facts"]["architecture"] = "aarch64"
    doc["hosts"][1]["facts"]["architecture"] = "x86_64"
    facts = write(tmp_path, doc)
    site = write_site({**SITE, "driver": {"mode": "host", "version": "580"}})
    rc, _, err = cli("mirror", "plan", "-s", site, "-i", inventory(tmp_path, {"gh1": {}, "x1": {}}), "--facts", facts)
    assert rc == 2, err
    assert "ubuntu24.04 packages: OS packages for aarch64 nodes (gh1) are not resolved yet" in err
    rc, out, err = cli("mirror", "plan", "-s", site, "-i", inventory(tmp_path, {"x1": {}}), "--facts", facts,
                       "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["packages"][0]["hosts"] == ["x1"]
    rc, _, err = cli("mirror", "pull", "-s", site, "-i", inventory(tmp_path, {"gh1": {}, "x1": {}}), "--facts", facts,
                     "-o", tmp_path / "bundle")
    assert rc == 2 and "OS packages for aarch64 nodes (gh1)" in err, err
    assert not (tmp_path / "bundle").exists()
