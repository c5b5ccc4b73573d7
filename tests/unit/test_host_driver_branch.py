"""driver.mode host/runfile follows the release and driver.kernelModuleType (issue 38 items 2 and 3): the default branch
is the release's pinned driver branch (a site pins another with driver.version), the kernel modules' flavour is
resolved from driver.kernelModuleType, the branch and the nodes' GPUs (facts); `config check` says which and why; the
package set of the flavour is what `mirror plan` lists and what the role installs (the role's own task rendered by the
real Ansible), with open no proprietary package; proprietary on a GPU that needs the open modules is refused at
`config check` with facts (exit 2) and on the node at preflight (exit 3, real sysfs read of a node tree); the
runfile gets -m=kernel-open / -m=kernel and the lab's STAND-IN runfile records it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from installer import content
from installer.config import parse_site
from installer.errors import ConfigError, PreflightError
from installer.facts import Node
from installer.render.role_vars import FIRST_OPEN_BRANCH, OPEN_DEFAULT_BRANCH, host_driver, open_only_devices
from tests.conftest import plan_of
from tests.unit.test_ansible_apply import LOCAL, fake_node, inventory, options, preflight
from tests.unit.test_facts_file import B200, facts_doc, write
from tests.unit.test_facts_file import inventory as facts_inventory

ROLE = content.role_dir("nvidia_driver")
KERNEL = "6.8.0-45-generic"
NEXT = "6.8.0-49-generic"


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))


def site(release="v25.10.1", **driver):
    return parse_site({"operator": {"version": release}, "registry": {"host": "registry.lab:5000"},
                       "driver": {"mode": "host", **driver}})


def rv(s, nodes=()):
    return dict(plan_of(s, list(nodes)).role_vars)


def gpu_node(name, *archs, arch="x86_64"):
    return Node(name, "ubuntu", "24.04", KERNEL, arch=arch, gpu_architectures=tuple(archs),
                facts_from="facts file f.json (read 2026-11-28T10:00:00Z)")


# ---------------------------------------------------------------- the branch: the release's, or the site's pin


@pytest.mark.parametrize("release, branch, flavour", [
    ("v25.10.1", "580", "open"), ("v26.7.0", "595", "open"), ("v25.3.1", "570", "open"),
    ("v24.9.2", "550", "proprietary"), ("v23.6.0", "535", "proprietary")])
def test_the_default_branch_is_the_release_s_pinned_driver_branch(release, branch, flavour):
    from installer.catalog import Catalog

    pinned = Catalog.default().get(release).components["driver"].version
    assert pinned.split(".")[0] == branch
    v = rv(site(release))
    assert v["nvidia_driver_package_version"] == branch and v["nvidia_driver_kernel_module_type"] == flavour
    hd = host_driver(site(release), Catalog.default().get(release))
    assert hd is not None and hd.release_driver == pinned and f"pins driver {pinned}" in hd.version_why
    assert (int(branch) >= OPEN_DEFAULT_BRANCH) == (flavour == "open") and "auto: branch" in hd.module_why


def test_a_site_pin_wins_and_auto_follows_it():
    v = rv(site(version="535"))
    assert v["nvidia_driver_package_version"] == "535" and v["nvidia_driver_kernel_module_type"] == "proprietary"
    v = rv(site(version="535.309.01", kernelModuleType="open"))
    assert v["nvidia_driver_package_version"] == "535.309.01" and v["nvidia_driver_kernel_module_type"] == "open"
    assert rv(site(kernelModuleType="proprietary"))["nvidia_driver_kernel_module_type"] == "proprietary"
    # the other modes: no host driver to resolve; operator/precompiled keep driver.version as given
    ops = rv(parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "r:1"}}))
    assert "nvidia_driver_package_version" not in ops and "nvidia_driver_kernel_module_type" not in ops


def test_the_runfile_gets_the_flavour_with_its_exact_version():
    url = "https://files.lab/NVIDIA-Linux-x86_64-580.105.08.run"
    v = rv(site(mode="runfile", runfile=url, runfileSha256="a" * 64))
    assert v["nvidia_driver_package_version"] == "580.105.08" and v["nvidia_driver_kernel_module_type"] == "open"
    v = rv(site(mode="runfile", runfile=url.replace("580.105.08", "535.216.03"), runfileSha256="a" * 64))
    assert v["nvidia_driver_kernel_module_type"] == "proprietary"


def test_open_before_the_first_open_branch_is_refused():
    with pytest.raises(ConfigError, match=f"driver branch 470 has none .*from R{FIRST_OPEN_BRANCH}") as exc:
        rv(site(version="470", kernelModuleType="open"))
    assert exc.value.exit_code == 2 and "driver.kernelModuleType: proprietary" in exc.value.hint


# ---------------------------------------------------------------- the flavour from the nodes' GPUs


@pytest.mark.parametrize("version, archs, arch, flavour, why", [
    ("535", ("Blackwell",), "x86_64", "open", "host g1 has Blackwell GPUs"),
    ("550", ("Hopper",), "aarch64", "open", "host g1 has a Grace Hopper superchip"),
    ("550", ("Hopper",), "x86_64", "proprietary", "auto: branch 550 < 560"),
    ("580", ("Volta",), "x86_64", "proprietary", "host g1 has Volta GPUs (facts file f.json"),
    ("580", ("Hopper",), "aarch64", "open", "host g1 has a Grace Hopper superchip"),
])
def test_auto_follows_the_gpus_in_the_facts(version, archs, arch, flavour, why):
    s = site(version=version)
    assert rv(s, [gpu_node("g1", *archs, arch=arch)])["nvidia_driver_kernel_module_type"] == flavour
    from installer.catalog import Catalog

    hd = host_driver(s, Catalog.default().get("v25.10.1"), [gpu_node("g1", *archs, arch=arch)])
    assert hd is not None and why in hd.module_why


@pytest.mark.parametrize("asked, archs, arch, message, fix", [
    ("proprietary", ("Blackwell",), "x86_64", "host g2: driver.kernelModuleType is proprietary, and the node has "
     "Blackwell GPUs (facts file f.json", "set driver.kernelModuleType: open"),
    ("proprietary", ("Hopper",), "aarch64", "host g2: driver.kernelModuleType is proprietary, and the node has a "
     "Grace Hopper superchip", "set driver.kernelModuleType: open"),
    ("open", ("Volta",), "x86_64", "host g2: driver.kernelModuleType is open, and the node has Volta GPUs",
     "set driver.kernelModuleType: proprietary"),
])
def test_a_flavour_the_gpus_cannot_run_is_refused_naming_host_gpu_and_fix(asked, archs, arch, message, fix):
    nodes = [gpu_node("g1", "Hopper"), gpu_node("g2", *archs, arch=arch)]
    with pytest.raises(ConfigError) as exc:
        rv(site(kernelModuleType=asked), nodes)
    assert exc.value.exit_code == 2 and message in str(exc.value) and fix in exc.value.hint
    rv(site(kernelModuleType=asked), nodes[:1])  # the same site without that node passes


def test_auto_with_nodes_needing_both_flavours_is_refused():
    with pytest.raises(ConfigError, match="host a has Blackwell GPUs, which need the open GPU kernel modules, and host "
                                          "b has Volta GPUs, which the open modules do not support") as exc:
        rv(site(), [gpu_node("a", "Blackwell"), gpu_node("b", "Volta")])
    assert "--limit" in exc.value.hint


def test_config_check_says_the_branch_the_flavour_and_why(cli, write_site):
    rc, out, err = cli("config", "check", "-s", write_site({"operator": {"version": "v25.10.1"},
                                                            "registry": {"host": "r.lab:5000"},
                                                            "driver": {"mode": "host"}}))
    assert rc == 0, err
    assert ("driver: host mode installs branch 580 (the release v25.10.1 pins driver 580.105.08; driver.version "
            "unset) with the open kernel modules (auto: branch 580 >= 560, where NVIDIA's default is the open "
            "modules)\n") in out
    rc, out, err = cli("config", "check", "-s", write_site({"operator": {"version": "v25.10.1"},
                                                            "registry": {"host": "r.lab:5000"},
                                                            "driver": {"mode": "host", "version": "535"}}))
    assert rc == 0 and ("driver: host mode installs branch 535 (driver.version in the site pins it) with the "
                        "proprietary kernel modules (auto: branch 535 < 560") in out, err


def test_config_check_with_facts_refuses_proprietary_on_blackwell(cli, write_site, tmp_path):
    """The real facts script read a node tree with two B200s; the file crossed back; exit 2 names host, GPU, fix."""
    facts = write(tmp_path, facts_doc(tmp_path, {"gpu2": {"devices": B200}}))
    inv = facts_inventory(tmp_path, {"gpu2": {}})
    path = write_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "r.lab:5000"},
                       "driver": {"mode": "host", "kernelModuleType": "proprietary"}})
    rc, out, err = cli("config", "check", "-s", path, "-i", inv, "--facts", facts)
    assert rc == 2 and out == "", out
    assert "host gpu2: driver.kernelModuleType is proprietary, and the node has Blackwell GPUs (facts file" in err
    assert "set driver.kernelModuleType: open" in err
    path = write_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "r.lab:5000"},
                       "driver": {"mode": "host", "version": "550"}}, name="auto.yaml")
    rc, out, err = cli("config", "check", "-s", path, "-i", inv, "--facts", facts)
    assert rc == 0 and "branch 550 (driver.version in the site pins it) with the open kernel modules (auto: host " \
                       "gpu2 has Blackwell GPUs" in out, err


# ---------------------------------------------------------------- the packages: mirror plan = the role


UBUNTU_OPEN = {"nvidia-driver-{b}-server-open", "nvidia-utils-{b}-server", "nvidia-dkms-{b}-server-open"}
UBUNTU_PROPRIETARY = {"nvidia-driver-{b}-server", "nvidia-utils-{b}-server", "nvidia-dkms-{b}-server"}
DEBIAN_OPEN = {"nvidia-driver", "nvidia-smi", "nvidia-open-kernel-dkms"}
DEBIAN_PROPRIETARY = {"nvidia-driver", "nvidia-smi", "nvidia-kernel-dkms"}
#: package names that carry (or build) the proprietary kernel modules, per OS map
PROPRIETARY = re.compile(r"^(nvidia-(driver|dkms|headless|headless-no-dkms)-[0-9]+(-server)?|nvidia-kernel-dkms|"
                         r"nvidia-kernel-source|linux-modules-nvidia-[0-9]+(-server)?-[0-9].*)$")
EXPECTED = {("ubuntu22.04", "open"): UBUNTU_OPEN, ("ubuntu24.04", "open"): UBUNTU_OPEN,
            ("ubuntu22.04", "proprietary"): UBUNTU_PROPRIETARY, ("ubuntu24.04", "proprietary"): UBUNTU_PROPRIETARY,
            ("debian12", "open"): DEBIAN_OPEN, ("debian12", "proprietary"): DEBIAN_PROPRIETARY}
KERNELS = {"ubuntu22.04": "5.15.0-105-generic", "ubuntu24.04": KERNEL, "debian12": "6.1.0-28-amd64",
           "rocky9.5": "5.14.0-503.14.1.el9_5.x86_64"}


def mirror_packages(cli, path, os_tag, *more) -> dict[str, dict]:
    rc, out, err = cli("mirror", "plan", "-s", path, "--os", os_tag, "--kernel", KERNELS[os_tag], *more,
                       "--format", "json")
    assert rc == 0, err
    (osp,) = [o for o in json.loads(out)["packages"] if o["os"] == os_tag]
    return {p["name"]: p for p in osp["roots"]}


def driver_roots(roots: dict[str, dict]) -> dict[str, str]:
    """The driver package roots (pinned to the driver version): name -> spec."""
    return {n: p["spec"] for n, p in roots.items() if p["version"] is not None}


@pytest.mark.parametrize("os_tag, flavour", sorted(EXPECTED))
def test_mirror_plan_lists_the_flavour_s_set_and_with_open_nothing_proprietary(cli, write_site, os_tag, flavour):
    path = write_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "r.lab:5000"},
                       "driver": {"mode": "host", "kernelModuleType": flavour}})
    roots = mirror_packages(cli, path, os_tag)
    want = {n.format(b="580") for n in EXPECTED[(os_tag, flavour)]}
    assert driver_roots(roots) == {n: f"{n}=580*" for n in want}
    proprietary = sorted(n for n in roots if PROPRIETARY.match(n))
    if flavour == "open":
        assert proprietary == [], proprietary
        needs = [n["setting"] for n in roots[sorted(want)[0]]["needs"]]
        assert "kernel modules: open (driver.kernelModuleType: open)" in needs
    else:
        assert proprietary


@pytest.mark.parametrize("module, os_tag, spec", [
    ("test_driver_toolkit_roles", "debian12", "nvidia-driver={v}*"), ("test_rhel_path", "debian12", "nvidia-driver={v}*"),
    ("test_rhel_path", "rocky9.5", "nvidia-driver-{v}*")])
def test_the_lab_s_pinned_branch_reaches_the_role_and_the_mirror(cli, write_site, module, os_tag, spec):
    """The lab tests that host-install the lab's 535 packages pin driver.version (their DRIVER) on a release whose
    default branch is another (v24.9.2: 550): the pin is what the role gets and what the mirror lists, and auto on
    535 is the proprietary set the lab serves."""
    import importlib

    version = importlib.import_module(f"tests.integration.{module}").DRIVER
    assert version.startswith("535.")
    v = rv(site("v24.9.2", version=version))
    assert v["nvidia_driver_package_version"] == version and v["nvidia_driver_kernel_module_type"] == "proprietary"
    path = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.lab:5000"},
                       "driver": {"mode": "host", "version": version}})
    roots = driver_roots(mirror_packages(cli, path, os_tag))
    assert roots["nvidia-driver"] == spec.format(v=version)
    if os_tag == "debian12":
        assert roots == {n: f"{n}={version}*" for n in DEBIAN_PROPRIETARY}
    # unpinned, the same site would take the release's branch
    path = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.lab:5000"},
                       "driver": {"mode": "host"}}, name="unpinned.yaml")
    assert driver_roots(mirror_packages(cli, path, os_tag))["nvidia-driver"] == spec.format(v="550")


def prebuilt_inventory(tmp_path: Path, os_tag: str) -> Path:
    p = tmp_path / f"prebuilt-{os_tag}.yml"
    p.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        "hosts": {"g1": {"ansible_host": "192.0.2.1", "gpu_install_os": os_tag, "gpu_install_kernel": KERNELS[os_tag]}},
        "vars": {"nvidia_driver_prebuilt_modules": True}}}}}))
    return p


def test_canonical_prebuilt_modules_when_the_site_asks(cli, write_site, tmp_path):
    path = write_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "r.lab:5000"},
                       "driver": {"mode": "host"}})
    rc, out, err = cli("mirror", "plan", "-s", path, "-i", prebuilt_inventory(tmp_path, "ubuntu24.04"),
                       "--kernel", NEXT, "--format", "json")
    assert rc == 0, err
    (osp,) = json.loads(out)["packages"]
    roots = {p["name"]: p["spec"] for p in osp["roots"]}
    assert roots == {"nvidia-headless-no-dkms-580-server-open": "nvidia-headless-no-dkms-580-server-open=580*",
                     "nvidia-utils-580-server": "nvidia-utils-580-server=580*",
                     # the kernel's version, not the driver's: unpinned, one per kernel (running and next)
                     f"linux-modules-nvidia-580-server-open-{KERNEL}": f"linux-modules-nvidia-580-server-open-{KERNEL}",
                     f"linux-modules-nvidia-580-server-open-{NEXT}": f"linux-modules-nvidia-580-server-open-{NEXT}"}
    rc, out, err = cli("mirror", "plan", "-s", path, "-i", prebuilt_inventory(tmp_path, "debian12"))
    assert rc == 2 and "host g1: nvidia_driver_prebuilt_modules is true, and debian12 has no prebuilt NVIDIA " \
                       "kernel modules" in err


# The role's own "Decide the packages" task (roles/nvidia_driver/tasks/host.yml), run by the real Ansible with the
# role's defaults and OS map, one play per case; what it decides is written out and held against `mirror plan`.
CASES = [("ubuntu24.04", "Ubuntu", "open", False), ("ubuntu24.04", "Ubuntu", "proprietary", False),
         ("ubuntu22.04", "Ubuntu", "open", False), ("ubuntu22.04", "Ubuntu", "proprietary", False),
         ("debian12", "Debian", "open", False), ("debian12", "Debian", "proprietary", False),
         ("ubuntu24.04", "Ubuntu", "open", True), ("ubuntu24.04", "Ubuntu", "proprietary", True)]


def _role_task(name: str) -> dict:
    tasks = yaml.safe_load((ROLE / "tasks" / "host.yml").read_text())
    (task,) = [t for t in tasks if t["name"] == name]
    return task


def render_role_packages(tmp_path: Path, variables: dict) -> dict[tuple, dict]:
    from installer import ansible as seam

    plays, out = [], {}
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for os_tag, osmap, flavour, prebuilt in CASES:
        dest = tmp_path / f"{os_tag}-{flavour}-{prebuilt}.json"
        out[(os_tag, flavour, prebuilt)] = dest
        plays.append({
            "name": f"{os_tag} {flavour}", "hosts": "all", "gather_facts": False,
            "vars_files": [str(ROLE / "vars" / f"{osmap}.yml")],
            "vars": {**defaults, "nvidia_driver_kernel_module_type": flavour, "nvidia_driver_prebuilt_modules": prebuilt},
            "tasks": [{"name": "Facts", "ansible.builtin.setup": {"gather_subset": ["min"]}},
                      _role_task("Driver | Decide the packages"),
                      {"name": "Write", "ansible.builtin.copy": {"dest": str(dest), "content": (
                          "{{ {'pinned': nvidia_driver_pinned, 'prebuilt': nvidia_driver_prebuilt_install} "
                          "| to_json }}")}}]})
    pb = tmp_path / "play.yml"
    pb.write_text(yaml.safe_dump(plays, sort_keys=False))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"node": LOCAL}}}))
    res = seam.run_playbook(pb, inv, variables)
    assert res.exit_code() == 0, [f.message for f in res.failures]
    return {k: json.loads(p.read_text()) for k, p in out.items()}


def test_the_role_installs_exactly_what_mirror_plan_lists(cli, write_site, tmp_path):
    here = os.uname().release  # the role reads the node's running kernel (ansible_facts.kernel): this machine's
    rendered = render_role_packages(tmp_path, {"nvidia_driver_package_version": "580"})
    for (os_tag, flavour, prebuilt), got in rendered.items():
        path = write_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "r.lab:5000"},
                           "driver": {"mode": "host", "kernelModuleType": flavour}}, name=f"{flavour}.yaml")
        if prebuilt:
            inv = tmp_path / f"inv-{flavour}.yml"
            inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
                "hosts": {"g1": {"ansible_host": "192.0.2.1", "gpu_install_os": os_tag, "gpu_install_kernel": here}},
                "vars": {"nvidia_driver_prebuilt_modules": True}}}}}))
            rc, out, err = cli("mirror", "plan", "-s", path, "-i", inv, "--format", "json")
            assert rc == 0, err
            roots = {p["name"]: p for p in json.loads(out)["packages"][0]["roots"]}
        else:
            roots = mirror_packages(cli, path, os_tag)
        assert sorted(got["pinned"]) == sorted(driver_roots(roots).values()), (os_tag, flavour, prebuilt)
        unpinned_kernel = sorted(n for n in roots if n.startswith("linux-modules-nvidia-"))
        assert sorted(got["prebuilt"]) == unpinned_kernel, (os_tag, flavour, prebuilt)
        names = [s.split("=")[0] for s in got["pinned"]] + got["prebuilt"]
        if flavour == "open":
            assert not [n for n in names if PROPRIETARY.match(n)], (os_tag, names)
        if prebuilt:
            assert got["prebuilt"] == [f"linux-modules-nvidia-580-server{'-open' if flavour == 'open' else ''}-{here}"]
            assert not {"dkms", "gcc", "make"} & set(roots) and not any(n.startswith("linux-headers") for n in roots)


# ---------------------------------------------------------------- on the node: the PCI bus read before anything


def pci_tree(root: Path, devices) -> Path:
    pci = root / "sys" / "bus" / "pci" / "devices"
    pci.mkdir(parents=True, exist_ok=True)
    for addr, vendor, device, cls in devices:
        d = pci / addr
        d.mkdir()
        for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
            (d / name).write_text(value + "\n")
    return pci


H200 = [("0000:18:00.0", "0x10de", "0x2335", "0x030200"), ("0000:05:00.0", "0x10de", "0x22a3", "0x068000")]
GH200 = [("0009:01:00.0", "0x10de", "0x2342", "0x030200")]


def run_check(tmp_path: Path, devices, flavour: str, arch: str | None = None):
    """roles/nvidia_driver/tasks/gpus.yml through the real Ansible against a PCI tree; arch: what `uname -m` says
    (a uname on PATH that answers for the node)."""
    from installer import ansible as seam

    env = {}
    if arch:
        fake = tmp_path / "bin"
        fake.mkdir(exist_ok=True)
        (fake / "uname").write_text(f"#!/bin/sh\n[ \"$1\" = -m ] && echo {arch} && exit 0\nexec /bin/uname \"$@\"\n")
        (fake / "uname").chmod(0o755)
        env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    anywhere, aarch64 = open_only_devices()
    pb = tmp_path / "play.yml"
    pb.write_text(yaml.safe_dump([{"name": "Check", "hosts": "all", "gather_facts": False, "environment": env,
                                   "tasks": [{"name": "Role", "ansible.builtin.include_role": {
                                       "name": content.fqcn("nvidia_driver"), "tasks_from": "gpus.yml"}}]}]))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"gpu1": LOCAL}}}))
    return seam.run_playbook(pb, inv, {"nvidia_driver_kernel_module_type": flavour,
                                       "nvidia_driver_pci_devices_dir": str(pci_tree(tmp_path / "node", devices)),
                                       "nvidia_driver_open_only_devices": anywhere,
                                       "nvidia_driver_open_only_aarch64_devices": aarch64})


def test_the_open_only_ids_are_blackwell_anywhere_and_hopper_on_aarch64_never_an_nvswitch():
    anywhere, aarch64 = open_only_devices()
    assert anywhere["0x2901"] == "B200 (GB100, Blackwell)" and "0x3182" in anywhere  # B300
    assert aarch64["0x2342"].startswith("GH200 120GB / 480GB (GH100") and "0x2335" in aarch64  # H200 on aarch64
    assert "0x22a3" not in aarch64 and "0x1af1" not in anywhere  # H100 / A100 NVSwitch
    assert not any(k in anywhere for k in aarch64) and "0x20b2" not in anywhere | aarch64  # A100: either flavour


def test_the_node_check_refuses_proprietary_on_blackwell_naming_gpu_and_address(tmp_path):
    res = run_check(tmp_path, H200 + B200, "proprietary")
    assert res.failed == ["gpu1"]
    msg = res.failures[0].message
    assert "driver.kernelModuleType resolved to proprietary, and gpu1 has B200 (GB100, Blackwell) at 0000:1b:00.0, " \
           "B200 (GB100, Blackwell) at 0000:43:00.0: NVIDIA supports these GPUs only with the open GPU kernel " \
           "modules. Nothing was installed. Set driver.kernelModuleType: open" in msg
    assert "H200" not in msg


@pytest.mark.parametrize("devices, flavour, arch, refused", [
    (H200, "proprietary", None, False),  # Hopper on x86_64: either flavour
    (GH200, "proprietary", "aarch64", True),  # Grace Hopper
    (GH200, "proprietary", "x86_64", False),
    (B200, "open", None, False),
    ([("0000:1b:00.0", "0x8086", "0x2901", "0x030200")], "proprietary", None, False),  # not NVIDIA's 0x2901
    ([("0000:1b:00.0", "0x10de", "0x2901", "0x068000")], "proprietary", None, False),  # not a display controller
])
def test_the_node_check_by_vendor_class_and_architecture(tmp_path, devices, flavour, arch, refused):
    res = run_check(tmp_path, devices, flavour, arch)
    assert (res.failed == ["gpu1"]) == refused, [f.message for f in res.failures]
    if refused:
        assert "GH200 120GB / 480GB (GH100, Hopper: Grace Hopper on an aarch64 node) at 0009:01:00.0" in \
            res.failures[0].message


def test_preflight_refuses_proprietary_on_a_blackwell_node_exit_3_nothing_changed(tmp_path):
    """Without facts (auto on the pinned 535 branch is proprietary): `gpu-install preflight` reads the node's PCI
    bus and stops with exit 3 before site.yml; with driver.kernelModuleType open the same node passes."""
    node = fake_node(tmp_path / "node")
    pci_tree(node, B200)
    opts, daemon = options(tmp_path, inventory(tmp_path, {"gpu1": LOCAL}), node)
    opts.extra.update(nvidia_driver_enabled=True, preflight_require_kernel_headers=False,
                      nvidia_driver_pci_devices_dir=str(node / "sys" / "bus" / "pci" / "devices"))
    s = parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "reg.lab:5000", "insecure": True},
                    "runtime": "docker", "driver": {"mode": "host", "version": "535"}})
    with pytest.raises(PreflightError, match=r"preflight failed on gpu1: gpu1: driver.kernelModuleType resolved to "
                                             r"proprietary, and gpu1 has B200 \(GB100, Blackwell\) at 0000:1b:00.0") as exc:
        preflight(s, opts)
    assert exc.value.exit_code == 3 and not daemon.exists()
    s = parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "reg.lab:5000", "insecure": True},
                    "runtime": "docker", "driver": {"mode": "host", "version": "535", "kernelModuleType": "open"}})
    assert preflight(s, opts).failed == []


def test_the_host_and_runfile_tasks_run_the_check_before_anything_else():
    """The role's own tasks: the check comes before any task that changes the node (host.yml, runfile.yml)."""
    for name in ("host.yml", "runfile.yml"):
        tasks = yaml.safe_load((ROLE / "tasks" / name).read_text())
        first_change = next(i for i, t in enumerate(tasks) if any(k in t for k in (
            "ansible.builtin.include_tasks", "gpu_install.node.install_record", "ansible.builtin.file"))
            and t.get("ansible.builtin.include_tasks") != "gpus.yml")
        check = next(i for i, t in enumerate(tasks) if t.get("ansible.builtin.include_tasks") == "gpus.yml")
        assert check < first_change, name


# ---------------------------------------------------------------- the runfile's -m


def sandboxed_runfile(tmp_path: Path, version: str = "580.105.08") -> tuple[Path, Path]:
    """The lab's STAND-IN runfile with every path it writes moved under a temporary root and its root check answered
    (these tests run as root on a shared machine: the real file would install into /usr/bin); (script, root)."""
    from gpu_install_lab.packages import standin_runfile

    root = tmp_path / "root"
    script = standin_runfile(version).read_text()
    for p in ("/usr/bin", "/var/lib/nvidia", "/var/log"):
        script = script.replace(p, str(root) + p)
        (root / p.lstrip("/")).mkdir(parents=True, exist_ok=True)
    assert re.findall(r"(?<![\w.])/(?:usr|var|etc|lib)/", script) == []  # nothing left outside the root
    script = script.replace('"$(id -u)" != 0', '"0" != 0')
    fake = tmp_path / f"NVIDIA-Linux-x86_64-{version}-STANDIN.run"
    fake.write_text(script)
    return fake, root


def test_the_runfile_passes_the_flavour_and_the_lab_standin_records_it(tmp_path):
    """runfile.yml's installer command line, rendered per flavour, run against the lab's STAND-IN runfile, which
    records the flavour it was given (it takes -m/--kernel-module-build-directory and -M/--kernel-module-type as the
    real nvidia-installer does, and refuses another value)."""
    from jinja2 import Environment

    tasks = yaml.safe_load((ROLE / "tasks" / "runfile.yml").read_text())
    (task,) = [t for t in tasks if str(t["name"]).startswith("Driver | Run the installer")]
    argv_t = task["ansible.builtin.command"]["argv"]
    fake, root = sandboxed_runfile(tmp_path)
    record = root / "var/lib/nvidia/gpu-install-standin.kernel-module-type"
    for flavour, flag in (("open", "-m=kernel-open"), ("proprietary", "-m=kernel")):
        argv = json.loads(Environment().from_string("{{ (" + argv_t.strip()[2:-2] + ") | tojson }}").render(
            nvidia_driver_runfile_path=str(fake), nvidia_driver_kernel_module_type=flavour,
            nvidia_driver_runfile_dkms=True, nvidia_driver_runfile_extra_args=[]))
        assert flag in argv and ("-m=kernel" if flavour == "open" else "-m=kernel-open") not in argv
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert record.read_text().strip() == flavour
        assert f"dkms=yes kernel modules {flavour}" in (root / "var/log/nvidia-installer.log").read_text().splitlines()[-1]
    for args, want in ((["--kernel-module-type=open"], "open"), (["-M=proprietary"], "proprietary"),
                       (["--kernel-module-build-directory=kernel-open"], "open"), ([], "open")):
        proc = subprocess.run(["sh", str(fake), "--silent", *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and record.read_text().strip() == want, (args, proc.stderr)
    record.unlink()
    proc = subprocess.run(["sh", str(fake), "--silent", "-m=kernel-closed"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "'kernel-closed'" in proc.stderr and not record.exists()
    # before R560 the installer's own default is the proprietary modules
    old, old_root = sandboxed_runfile(tmp_path / "535", "535.216.03")
    assert subprocess.run(["sh", str(old), "--silent"], capture_output=True, timeout=30).returncode == 0
    assert (old_root / "var/lib/nvidia/gpu-install-standin.kernel-module-type").read_text().strip() == "proprietary"
