"""Preflight compares the inventory's node variables (gpu_install_os, gpu_install_os_id + gpu_install_os_version,
gpu_install_kernel, gpu_install_arch, gpu_install_nvswitch) with the node: one message per difference naming host,
variable and both values, exit 3, nothing changed; a variable not set is not compared.

The preflight module's comparison (plugins/modules/preflight.py inventory_differences) is tested pure, its reading of
os-release and PCI against the real node-facts script (installer/node_facts.py SCRIPT) on the same trees, and the role
through the real seam with local connections: the kernel and architecture are this machine's (`uname -r`, `uname
-m`), the OS and PCI bus a fake node root's (preflight_root)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest

from installer.errors import PreflightError
from installer.facts import split_os
from installer.node_facts import parse
from tests.unit.library_modules import load_module
from tests.unit.test_ansible_apply import LOCAL, apply_nodes, fake_node, inventory, options, preflight, site
from tests.unit.test_node_facts import HGX_H200, ROCKY_94, UBUNTU_2404, node_tree, run_script

probe = load_module("preflight")
KERNEL, ARCH = os.uname().release, platform.machine()
OTHER_ARCH = "aarch64" if ARCH != "aarch64" else "x86_64"
WRONG_KERNEL = "5.15.0-105-generic" if KERNEL != "5.15.0-105-generic" else "6.8.0-45-generic"
FIX = "correct the inventory, or regenerate it from `gpu-install nodes facts -i INV -o facts.json`"


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))


def node(os_id="ubuntu", version="22.04", kernel="5.15.0-105-generic", arch="x86_64", nvswitches=()):
    return {"os_id": os_id, "os_version": version, "kernel": kernel, "arch": arch, "nvswitches": list(nvswitches)}


def said(var: str, inventory_value: str, node_value: str, host="gpu1", verb="runs") -> str:
    return f"host {host}: {var} is '{inventory_value}' in the inventory, the node {verb} '{node_value}'"


# ---------------------------------------------------------------- the comparison (pure)


@pytest.mark.parametrize("given", [
    {},
    {"gpu_install_os": "ubuntu22.04", "gpu_install_kernel": "5.15.0-105-generic", "gpu_install_arch": "x86_64",
     "gpu_install_nvswitch": False},
    {"gpu_install_os": "Ubuntu22.04"}, {"gpu_install_os": " ubuntu-22.04 "},  # split_os: lowercased, stripped, ID-VER
    {"gpu_install_os_id": "Ubuntu", "gpu_install_os_version": "22.04"},
    # not set: absent, null or empty (node_from_vars reads these as not given)
    {"gpu_install_os": None, "gpu_install_kernel": "", "gpu_install_arch": None, "gpu_install_nvswitch": None,
     "gpu_install_os_id": "", "gpu_install_os_version": None},
])
def test_values_that_match_the_node_or_are_not_set_pass(given):
    assert probe.inventory_differences("gpu1", given, node()) == []


@pytest.mark.parametrize("var,value,node_value,verb", [
    ("gpu_install_os", "ubuntu24.04", "ubuntu22.04", "runs"),
    ("gpu_install_os", "debian12", "ubuntu22.04", "runs"),
    ("gpu_install_os_id", "rocky", "ubuntu", "runs"),
    ("gpu_install_os_version", "22.10", "22.04", "runs"),
    ("gpu_install_kernel", "5.15.0-106-generic", "5.15.0-105-generic", "runs"),
    ("gpu_install_arch", "aarch64", "x86_64", "runs"),
    ("gpu_install_nvswitch", True, "false", "has"),
])
def test_each_difference_is_one_message_naming_host_variable_both_values_and_the_fix(var, value, node_value, verb):
    [message] = probe.inventory_differences("gpu1", {var: value}, node())
    shown = str(value).lower() if isinstance(value, bool) else value
    note = " (no NVSwitch on PCI)" if var == "gpu_install_nvswitch" else ""
    assert message == said(var, shown, node_value, verb=verb) + note + ": " + FIX


def test_an_nvswitch_node_said_false_names_its_switches():
    [message] = probe.inventory_differences("gpu1", {"gpu_install_nvswitch": False},
                                            node(nvswitches=["0000:05:00.0", "0000:06:00.0"]))
    assert message.startswith(said("gpu_install_nvswitch", "false", "true", verb="has") + " (2 NVSwitch on PCI)")
    assert probe.inventory_differences("gpu1", {"gpu_install_nvswitch": True}, node(nvswitches=["0000:05:00.0"])) == []


def test_every_difference_of_a_host_is_listed_at_once():
    given = {"gpu_install_os": "rocky9.4", "gpu_install_os_id": "rocky", "gpu_install_os_version": "9.4",
             "gpu_install_kernel": "5.14.0-427.el9.x86_64", "gpu_install_arch": "aarch64", "gpu_install_nvswitch": True}
    found = probe.inventory_differences("gpu7", given, node())
    assert [m.split(" is ", 1)[0] for m in found] == [f"host gpu7: {v}" for v in (
        "gpu_install_os", "gpu_install_os_id", "gpu_install_os_version", "gpu_install_kernel", "gpu_install_arch",
        "gpu_install_nvswitch")], found
    # the fix once, after the last: a failed task's message is cut at 500 characters
    assert [m.endswith(FIX) for m in found] == [False] * 5 + [True]
    # the four a host may have (gpu_install_os, not its two parts besides) fit in that, joined as the role joins them
    four = probe.inventory_differences("gpu7", {k: v for k, v in given.items() if not k.startswith("gpu_install_os_")},
                                       node(kernel="5.15.0-1063-nvidia-64k"))
    assert len(four) == 4 and len(" | ".join(four)) <= 500, four


def test_a_value_of_the_wrong_form_is_said_not_compared():
    [tag] = probe.inventory_differences("gpu1", {"gpu_install_os": "windows"}, node())
    assert "host gpu1: gpu_install_os 'windows' is not an OS tag" in tag and "the node runs 'ubuntu22.04'" in tag
    [flag] = probe.inventory_differences("gpu1", {"gpu_install_nvswitch": "yes"}, node())
    assert flag == "host gpu1: gpu_install_nvswitch must be true or false, not 'yes': " + FIX


@pytest.mark.parametrize("tag", ["ubuntu22.04", "Ubuntu24.04", "rhel9.4", "rhel8.10", "rocky9.5", "rocky-9.5",
                                 "centos7", "debian12", "ol9.4", "opensuse-leap15.6", " sles15.5 "])
def test_the_os_tag_is_read_as_installer_facts_reads_it(tag):
    """gpu_install_os means on the node what it means to the plan (installer.facts.split_os)."""
    os_id, version = split_os(tag, "test")
    assert probe.inventory_differences("h", {"gpu_install_os": tag}, node(os_id, version)) == []
    assert probe.inventory_differences("h", {"gpu_install_os": tag}, node(os_id, version + "1")) != []


# ---------------------------------------------------------------- the node's side, as `nodes facts` reads it


# another vendor's function of the same class as an NVSwitch (0x0680xx, "other bridge"): not an NVSwitch
OTHER_BRIDGE = ("0000:00:14.2", "0x8086", "0x7a27", "0x068000")


@pytest.mark.parametrize("text", [UBUNTU_2404, ROCKY_94, "ID='debian'\nVERSION_ID='12'\n",
                                  'ID=rocky\nID=ubuntu\nVERSION_ID="9.5"\n'])
@pytest.mark.parametrize("devices,switches", [((), 0), (HGX_H200, 4), ((OTHER_BRIDGE,), 0),
                                              ((*HGX_H200, OTHER_BRIDGE), 4)])
def test_the_probe_reads_the_os_and_nvswitches_as_the_facts_script_does(tmp_path, text, devices, switches):
    """The same tree read by the preflight module and by the real `nodes facts` script gives the same OS and the
    same NVSwitches: preflight compares the inventory with what `nodes facts` would write into it."""
    root = node_tree(tmp_path / "n", os_release=text, devices=devices)
    f = probe.probe(str(root), lambda cmd: (0, "", ""), kernel="k", arch="x86_64")
    facts = parse(run_script(root))
    assert (f["os_id"], f["os_version"]) == (facts.os_id, facts.os_version)
    assert f["nvswitches"] == [d.address for d in facts.nvswitches]
    assert len(f["nvswitches"]) == switches


def test_os_release_under_usr_lib_when_etc_has_none(tmp_path):
    root = node_tree(tmp_path / "n", os_release=ROCKY_94)
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "etc" / "os-release").rename(root / "usr" / "lib" / "os-release")
    f = probe.probe(str(root), lambda cmd: (0, "", ""), kernel="k", arch="x86_64")
    assert (f["os_id"], f["os_version"]) == ("rocky", "9.4") == (parse(run_script(root)).os_id, "9.4")


# ---------------------------------------------------------------- the role, through the real seam


def test_the_role_passes_what_the_inventory_sets_and_nothing_else(tmp_path):
    """Through Ansible's templating the values arrive with their types (a bool stays a bool), only those set."""
    root = fake_node(tmp_path / "node")  # ubuntu 22.04, one GPU, no NVSwitch
    hosts = {"gpu1": dict(LOCAL, gpu_install_os="ubuntu22.04", gpu_install_kernel=KERNEL, gpu_install_arch=ARCH,
                          gpu_install_nvswitch=False),
             "gpu2": dict(LOCAL)}
    opts, _ = options(tmp_path, inventory(tmp_path, hosts), root)
    res = preflight(site(), opts)
    assert res.failed == [] and {"gpu1", "gpu2"} <= set(res.hosts)
    given = {h: _probe_invocation(tmp_path, h)["inventory"] for h in ("gpu1", "gpu2")}
    assert given == {"gpu1": {"gpu_install_os": "ubuntu22.04", "gpu_install_kernel": KERNEL, "gpu_install_arch": ARCH,
                              "gpu_install_nvswitch": False},
                     "gpu2": {}}


def test_a_wrong_kernel_and_os_on_one_host_exit_3_both_named_the_other_passes_nothing_changed(tmp_path):
    root = fake_node(tmp_path / "node")
    hosts = {"gpu1": dict(LOCAL, gpu_install_os="rocky9.5", gpu_install_kernel=WRONG_KERNEL),
             "gpu2": dict(LOCAL, gpu_install_os="ubuntu22.04", gpu_install_kernel=KERNEL)}
    opts, daemon = options(tmp_path, inventory(tmp_path, hosts), root)
    with pytest.raises(PreflightError) as exc:
        apply_nodes(site(), opts)  # preflight, then site.yml: never reached
    message = str(exc.value)
    assert exc.value.exit_code == 3 and message.startswith("preflight failed on gpu1: "), message
    assert said("gpu_install_os", "rocky9.5", "ubuntu22.04") in message
    assert said("gpu_install_kernel", WRONG_KERNEL, KERNEL) in message
    assert message.count(FIX) == 1 and "gpu2" not in message
    assert not daemon.exists()  # the docker_runtime role of site.yml did not run
    stats = _stats(tmp_path)
    assert "gpu2" not in stats.get("failures", {}) and stats["ok"].get("gpu2", 0) >= 1 and stats["failures"]["gpu1"]


def test_the_new_variables_arch_and_nvswitch_are_compared_on_the_node(tmp_path):
    root = fake_node(tmp_path / "node")
    switch = root / "sys/bus/pci/devices/0000:05:00.0"
    switch.mkdir(parents=True)
    for f, v in {"vendor": "0x10de", "class": "0x068000", "device": "0x22a3"}.items():
        (switch / f).write_text(v + "\n")
    hosts = {"gpu1": dict(LOCAL, gpu_install_arch=OTHER_ARCH, gpu_install_nvswitch=False),
             "gpu2": dict(LOCAL, gpu_install_arch=ARCH, gpu_install_nvswitch=True)}
    opts, _ = options(tmp_path, inventory(tmp_path, hosts), root)
    with pytest.raises(PreflightError) as exc:
        preflight(site(), opts)
    message = str(exc.value)
    assert exc.value.exit_code == 3 and message.startswith("preflight failed on gpu1: "), message
    assert said("gpu_install_arch", OTHER_ARCH, ARCH) in message
    assert said("gpu_install_nvswitch", "false", "true", verb="has") + " (1 NVSwitch on PCI): " + FIX in message


def _run_dirs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state" / "runs").iterdir())


def _events(tmp_path: Path) -> list[dict]:
    run = next(p for p in reversed(_run_dirs(tmp_path)) if "preflight" in p.name)
    return [json.loads(p.read_text()) for p in sorted((run / "artifacts" / "run" / "job_events").glob("*.json"))]


def _stats(tmp_path: Path) -> dict:
    return next(e["event_data"] for e in _events(tmp_path) if e.get("event") == "playbook_on_stats")


def _probe_invocation(tmp_path: Path, host: str) -> dict:
    """The preflight module's arguments on host, as the run recorded them."""
    for e in _events(tmp_path):
        d = e.get("event_data", {})
        if e.get("event") == "runner_on_ok" and d.get("host") == host and d.get("task", "").startswith("Preflight | Probe"):
            return d["res"]["invocation"]["module_args"]
    raise AssertionError(f"no probe result of {host}")
