"""`gpu-install images`: OS-suffixed driver tags per node, fail-closed resolution, formats."""

from __future__ import annotations

import json
import textwrap

import pytest

from installer.config import parse_site
from installer.errors import ConfigError
from installer.facts import Node, os_tag
from tests.conftest import nodes_of, plan_of


def image_list(s, nodes=None):
    return plan_of(s, nodes).images


def site(release="v24.9.2", **over):
    data = {"operator": {"version": release}, "registry": {"host": "registry.lab:5000"}}
    data.update(over)
    return parse_site(data)


@pytest.mark.parametrize(
    "release, os_id, version, want",
    [
        ("v24.9.2", "ubuntu", "22.04", "ubuntu22.04"),
        ("v25.10.1", "rhel", "9.4", "rhel9.4"),
        ("v22.9.0", "centos", "7", "centos7"),
        ("v26.3.0", "rocky", "9.5", "rocky9"),
        ("v26.3.3", "rhel", "10.1", "rhel10"),
        ("v26.3.3", "rhel", "9.4", "rhel9.4"),
        ("v26.7.0", "rhel", "9.4", "rhel9"),
        ("v26.7.0", "rhel", "8.10", "rhel8"),
        ("v26.7.0", "ol", "9.3", "ol9"),
        ("v26.7.0", "rocky", "9.5", "rocky9"),
        ("v26.7.0", "ubuntu", "24.04", "ubuntu24.04"),
    ],
)
def test_os_tag_rule_per_release(release, os_id, version, want):
    assert os_tag(os_id, version, release) == want


def test_driver_images_expand_per_node_os():
    nodes = [Node("a", "ubuntu", "22.04"), Node("b", "ubuntu", "22.04"), Node("c", "rhel", "8.10")]
    imgs = {i.source: i.destination for i in image_list(site(), nodes)}
    assert imgs["nvcr.io/nvidia/driver:550.144.03-ubuntu22.04"] == "registry.lab:5000/nvidia/driver:550.144.03-ubuntu22.04"
    assert "nvcr.io/nvidia/driver:550.144.03-rhel8.10" in imgs
    assert sorted(s for s in imgs if "/driver:" in s) == [
        "nvcr.io/nvidia/driver:550.144.03-rhel8.10", "nvcr.io/nvidia/driver:550.144.03-ubuntu22.04"]
    # v26.7.0: RHEL tags are major-only
    imgs = {i.source for i in image_list(site("v26.7.0"), nodes)}
    assert "nvcr.io/nvidia/driver:595.91.07-rhel8" in imgs and "nvcr.io/nvidia/driver:595.91.07-rhel8.10" not in imgs


def test_precompiled_tags_need_kernels():
    s = site(driver={"mode": "precompiled"})
    imgs = {i.source for i in image_list(s, [Node("a", "ubuntu", "22.04", "5.15.0-105-generic")])}
    assert "nvcr.io/nvidia/driver:550-5.15.0-105-generic-ubuntu22.04" in imgs
    with pytest.raises(ConfigError, match="kernel of a unknown"):
        image_list(s, [Node("a", "ubuntu", "22.04")])


def test_driver_image_needs_node_os_but_host_driver_does_not():
    with pytest.raises(ConfigError, match=r"depends on the nodes' OS .*550.144.03-<osTag>"):
        image_list(site())
    imgs = {i.source for i in image_list(site(driver={"mode": "host"}))}
    assert not any("/driver:" in s for s in imgs)
    assert not any("k8s-driver-manager" in s for s in imgs)  # follows the driver


def test_only_deployed_components_are_listed():
    imgs = {i.source for i in image_list(site(driver={"mode": "host"}, toolkit={"mode": "host"}))}
    assert not any("container-toolkit" in s for s in imgs)
    assert not any("kubevirt-gpu-device-plugin" in s for s in imgs)  # sandbox only
    assert not any("/dcgm:" in s for s in imgs)  # standalone dcgm off by default
    imgs = {i.source for i in image_list(site(driver={"mode": "host"}, components={"dcgm": {"enabled": True}}))}
    assert "nvcr.io/nvidia/cloud-native/dcgm:3.3.9-1-ubuntu22.04" in imgs


def test_user_built_image_fails_closed_then_resolves():
    with pytest.raises(ConfigError, match=r"vgpuManager is enabled but its image is not published"):
        image_list(site(driver={"mode": "host"}, sandboxWorkloads={"enabled": True},
                        components={"vgpuManager": {"enabled": True}}), [Node("a", "ubuntu", "22.04")])
    s = site(driver={"mode": "host"}, sandboxWorkloads={"enabled": True},
             components={"vgpuManager": {"enabled": True, "repository": "registry.lab:5000/site", "version": "550.90.05"}})
    imgs = {i.source: i.destination for i in image_list(s, [Node("a", "ubuntu", "22.04")])}
    assert imgs["registry.lab:5000/site/vgpu-manager:550.90.05-ubuntu22.04"] == \
        "registry.lab:5000/site/vgpu-manager:550.90.05-ubuntu22.04"


def test_images_agree_with_rendered_values():
    """Same Plan: every destination is a repository/image:version (+ OS suffix) from the values."""
    nodes = [Node("a", "ubuntu", "22.04")]
    s = site(components={"dcgm": {"enabled": True}})
    p = plan_of(s, nodes)
    rendered = set()
    for comp in p.components.values():
        node = p.values
        for part in comp.spec.values_path.split("."):
            node = node[part]
        if comp.spec.is_nfd:
            rendered.add(f"{node['repository']}:{node['tag']}")
        elif "repository" in node:
            rendered.add(f"{node['repository']}/{node['image']}:{node['version']}")
    for img in image_list(s, nodes):
        base = img.destination.removesuffix("-ubuntu22.04") if img.component == "driver" else img.destination
        assert base in rendered, img


def test_images_cli_json_and_text(cli, write_site):
    path = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"}})
    rc, out, _ = cli("images", "-s", path, "--os", "ubuntu22.04", "--os", "rhel8.10", "--format", "json")
    assert rc == 0
    data = json.loads(out)
    assert all(set(d) == {"source", "destination"} for d in data)
    assert {"source": "nvcr.io/nvidia/driver:550.144.03-rhel8.10",
            "destination": "registry.lab:5000/nvidia/driver:550.144.03-rhel8.10"} in data
    rc, text, _ = cli("images", "-s", path, "--os", "ubuntu22.04")
    assert rc == 0 and len(text.splitlines()) == len({d["source"] for d in data if "rhel" not in d["source"]})
    rc, _, err = cli("images", "-s", path, "--os", "22.04")
    assert rc == 2 and "not an OS tag" in err


def test_inventory_nodes(tmp_path, cli, write_site):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(textwrap.dedent("""\
        all:
          children:
            gpu_nodes:
              hosts:
                g1: {gpu_install_os: ubuntu24.04, gpu_install_kernel: 6.8.0-31-generic}
                g2: {gpu_install_os_id: rocky, gpu_install_os_version: "9.5"}
                g3: {}
            other:
              hosts:
                cp: {}
        """))
    (inv / "group_vars" / "gpu_nodes.yml").write_text("gpu_install_os: ubuntu22.04\n")
    (inv / "site.yaml").write_text("operator: {version: v26.7.0}\nregistry: {host: registry.lab:5000}\n")
    nodes = {n.name: n for n in nodes_of(inv)}
    assert set(nodes) == {"g1", "g2", "g3"}  # site.yaml in the directory is not an inventory source
    assert (nodes["g1"].os_id, nodes["g1"].os_version, nodes["g1"].kernel) == ("ubuntu", "24.04", "6.8.0-31-generic")
    assert nodes["g3"].os_tag("v24.9.2") == "ubuntu22.04"  # from group_vars
    rc, out, _ = cli("images", "-s", inv / "site.yaml", "-i", inv)
    assert rc == 0
    assert "nvcr.io/nvidia/driver:595.91.07-rocky9 " in out and "-ubuntu24.04 " in out


def test_inventory_errors(tmp_path):
    bad = tmp_path / "hosts.yml"
    bad.write_text("all:\n  hosts:\n    a: {}\n")
    with pytest.raises(ConfigError, match="no group 'gpu_nodes'"):
        nodes_of(bad)
    bad.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        a: {}\n")
    unknown = nodes_of(bad)[0]  # only what needs the OS fails: the driver image tags
    with pytest.raises(ConfigError, match=r"host a: OS unknown"):
        unknown.os_tag("v24.9.2")
    with pytest.raises(ConfigError, match=r"host a: OS unknown"):
        _ = plan_of(site(), inventory=bad).images
    with pytest.raises(ConfigError, match="not found"):
        nodes_of(tmp_path / "missing")


def test_an_inventory_that_does_not_parse_is_an_error_with_ansibles_reason(tmp_path, cli, write_site):
    """Never a silently empty (or smaller) inventory blamed on a missing group."""
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpu_nodes]\ng1 gpu_install_os=ubuntu22.04\ng2 = bad = line\ng3 gpu_install_os=ubuntu22.04\n")
    with pytest.raises(ConfigError, match=r"hosts.ini:3 \('g2 = bad = line'\): Failed to parse inventory with 'ini' plugin: .*key=value"):
        nodes_of(inv)
    rc, out, err = cli("images", "-s", write_site({"operator": {"version": "v24.9.2"},
                                                   "registry": {"host": "registry.lab:5000"}}), "-i", inv)
    assert rc == 2 and out == "" and "no group" not in err and "has no hosts" not in err


@pytest.mark.parametrize("release, os_version, pinned", [("v25.10.1", "24.04", "580.105.08"),
                                                         ("v24.9.2", "22.04", "550.144.03")])
def test_a_branch_only_driver_version_in_operator_mode_is_exit_2_naming_the_releases_full_version(release, os_version,
                                                                                                   pinned):
    """driver:580-ubuntu24.04 does not exist: operator mode's driver images are tagged <full version>-<osTag>, so a
    branch is refused before any image is listed, naming the version the release pins; precompiled (tagged by
    branch) and a full version are fine."""
    nodes = [Node("a", "ubuntu", os_version, "6.8.0-49-generic")]
    with pytest.raises(ConfigError, match=rf"driver.version: '580' is a driver branch; .*pins {pinned}") as exc:
        image_list(site(release, driver={"version": "580"}), nodes)
    assert exc.value.exit_code == 2
    assert f'driver.version: "{pinned}"' in (exc.value.hint or "") and "precompiled" in (exc.value.hint or "")
    assert f"nvcr.io/nvidia/driver:580.95.05-ubuntu{os_version}" in {
        i.source for i in image_list(site(release, driver={"version": "580.95.05"}), nodes)}
    assert f"nvcr.io/nvidia/driver:580-6.8.0-49-generic-ubuntu{os_version}" in {
        i.source for i in image_list(site(release, driver={"mode": "precompiled", "version": "580"}), nodes)}
    assert not any("/driver:" in i.source for i in image_list(site(release, driver={"mode": "host", "version": "580"}),
                                                                nodes))
