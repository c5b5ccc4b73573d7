"""`--facts FILE`: the nodes as `gpu-install nodes facts` read them, carried to the connected side. The file is made
here the way the command makes it (the real facts script run on node trees, facts_json, the node-facts envelope);
with -i it fills what the inventory leaves unset and refuses what the inventory contradicts; without -i it is the
nodes. The file crossed the gap: every value is checked again and names come from this installation's PCI table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from installer import jsonout, node_facts
from installer.errors import ConfigError
from tests.unit.test_node_facts import HGX_H200, ROCKY_94, node_tree, run_script

B200 = [(f"0000:{b:02x}:00.0", "0x10de", "0x2901", "0x030200") for b in (0x1b, 0x43)]


def facts_doc(tmp_path: Path, nodes: dict[str, dict]) -> dict:
    doc = jsonout.envelope(jsonout.NODE_FACTS, "nodes facts")
    hosts = []
    for host, tree in nodes.items():
        if tree is None:
            hosts.append({"host": host, "node": host, "via": "ssh root@192.0.2.9:22", "readAt": "2026-11-28T10:00:00Z",
                          "seconds": 0.1, "error": {"message": "Unable to connect", "hint": None}, "facts": None})
            continue
        f = node_facts.parse(run_script(node_tree(tmp_path / host, **tree)))
        hosts.append({"host": host, "node": host, "via": "ssh root@192.0.2.1:22", "readAt": "2026-11-28T10:00:00Z",
                      "seconds": 0.2, "error": None, "facts": node_facts.facts_json(f)})
    doc.update(inventory="hosts.yml", limit=None, hosts=hosts)
    jsonout.check(doc)
    return doc


def write(tmp_path: Path, doc: dict, name: str = "facts.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


@pytest.fixture
def host_site(write_site):
    return write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "driver": {"mode": "host", "version": "535"}})


def inventory(tmp_path: Path, hosts: dict[str, dict]) -> Path:
    """An inventory file of these GPU hosts, a new file each call."""
    import yaml

    p = tmp_path / f"hosts-{len(list(tmp_path.glob('hosts-*.yml')))}.yml"
    p.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        h: {"ansible_host": "192.0.2.1", **v} for h, v in hosts.items()}}}}}))
    return p


def test_the_facts_fill_what_the_inventory_leaves_unset(tmp_path, host_site, cli):
    """gpu1 (HGX H200, Ubuntu 24.04, two kernels installed) and gpu2 (Rocky 9.4, B200) have no OS or kernel in the
    inventory; gpu3 could not be read and says its OS itself. The plan lists each node's headers: the running kernel
    and the other installed one (it boots next)."""
    running = __import__("os").uname().release
    facts = write(tmp_path, facts_doc(tmp_path, {
        "gpu1": {"devices": HGX_H200},
        "gpu2": {"devices": B200, "os_release": ROCKY_94, "kernels": ("5.14.0-427.el9.x86_64",), "vmlinuz": ()},
        "gpu3": None}))
    inv = inventory(tmp_path, {"gpu1": {}, "gpu2": {}, "gpu3": {"gpu_install_os": "ubuntu22.04",
                                                                "gpu_install_kernel": "5.15.0-105-generic"}})
    rc, out, err = cli("mirror", "plan", "-s", host_site, "-i", inv, "--facts", facts, "--format", "json")
    assert rc == 0, err
    kernels = {k["host"]: (k["os"], k["kernel"], k["next"], k["headers"]) for k in json.loads(out)["kernels"]}
    assert kernels["gpu1"] == ("ubuntu24.04", running, ["6.8.0-45-generic", "6.8.0-49-generic"],
                               [f"linux-headers-{running}", "linux-headers-6.8.0-45-generic",
                                "linux-headers-6.8.0-49-generic"])
    assert kernels["gpu2"][:3] == ("rocky9.4", running, ["5.14.0-427.el9.x86_64"])
    assert kernels["gpu3"] == ("ubuntu22.04", "5.15.0-105-generic", [], ["linux-headers-5.15.0-105-generic"])

    from installer.config import load_site
    from installer.plan import Options, resolve

    plan = resolve(load_site(str(host_site)), Options(inventory=str(inv), facts=str(facts)))
    by = {n.name: n for n in plan.nodes}
    assert (by["gpu1"].nvswitch, by["gpu1"].gpu_architectures, by["gpu1"].arch) == \
        (True, ("Hopper",), __import__("platform").machine())
    assert (by["gpu2"].nvswitch, by["gpu2"].gpu_architectures) == (False, ("Blackwell",))
    assert (by["gpu3"].nvswitch, by["gpu3"].facts_from) == (None, None)
    assert by["gpu1"].facts_from == f"facts file {facts} (read 2026-11-28T10:00:00Z)"


def test_without_an_inventory_the_facts_are_the_nodes(tmp_path, host_site, cli):
    facts = write(tmp_path, facts_doc(tmp_path, {"gpu1": {"devices": HGX_H200}, "gpu2": None}))
    rc, out, err = cli("mirror", "plan", "-s", host_site, "--facts", facts, "--format", "json")
    assert rc == 0, err
    assert [(p["os"], p["hosts"]) for p in json.loads(out)["packages"]] == [("ubuntu24.04", [])]
    rc, _, err = cli("mirror", "plan", "-s", host_site, "--facts", facts, "--os", "ubuntu22.04")
    assert rc == 2 and "--facts and --os both describe the nodes" in err


@pytest.mark.parametrize("var,value,found", [
    ("gpu_install_kernel", "5.15.0-105-generic", None),  # None: the running kernel of this machine
    ("gpu_install_os", "ubuntu22.04", "'ubuntu24.04'"),
    ("gpu_install_arch", "aarch64", None),
    ("gpu_install_nvswitch", False, "true"),
])
def test_a_value_the_node_contradicts_is_refused(tmp_path, host_site, cli, var, value, found):
    import os
    import platform

    facts = write(tmp_path, facts_doc(tmp_path, {"gpu1": {"devices": HGX_H200}}))
    if platform.machine() == "aarch64" and var == "gpu_install_arch":
        value = "x86_64"
    rc, _, err = cli("mirror", "plan", "-s", host_site, "-i", inventory(tmp_path, {"gpu1": {var: value}}),
                     "--facts", facts)
    assert rc == 2, err
    found = found or repr({"gpu_install_kernel": os.uname().release, "gpu_install_arch": platform.machine()}[var])
    shown = str(value).lower() if isinstance(value, bool) else repr(value)
    assert f"host gpu1: {var} is {shown} in the inventory, and the node had {found} when it was read " \
           f"(facts file {facts} (read 2026-11-28T10:00:00Z))" in err
    assert f"correct {var} in the inventory" in err


def test_the_same_values_are_accepted(tmp_path, host_site, cli):
    import os
    import platform

    facts = write(tmp_path, facts_doc(tmp_path, {"gpu1": {"devices": HGX_H200}}))
    inv = inventory(tmp_path, {"gpu1": {"gpu_install_os": "ubuntu24.04", "gpu_install_kernel": os.uname().release,
                                        "gpu_install_arch": platform.machine(), "gpu_install_nvswitch": True}})
    rc, _, err = cli("mirror", "plan", "-s", host_site, "-i", inv, "--facts", facts)
    assert rc == 0, err


@pytest.mark.parametrize("var,value,message", [
    ("gpu_install_arch", "amd64", "gpu_install_arch is 'amd64', not one of x86_64, aarch64"),
    ("gpu_install_nvswitch", "yes", "gpu_install_nvswitch must be true or false, not 'yes'"),
])
def test_inventory_values_of_the_wrong_form(tmp_path, host_site, cli, var, value, message):
    rc, _, err = cli("mirror", "plan", "-s", host_site, "-i",
                     inventory(tmp_path, {"gpu1": {"gpu_install_os": "ubuntu22.04", var: value}}))
    assert rc == 2 and f"host gpu1: {message}" in err, err


def _tampered(tmp_path: Path, change) -> Path:
    doc = facts_doc(tmp_path, {"gpu1": {"devices": HGX_H200}})
    change(doc)
    return write(tmp_path, doc, "tampered.json")


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(schema="gpu-install.apply/v1"), "schema: 'gpu-install.apply/v1', not gpu-install.node-facts/v1"),
    (lambda d: d["hosts"][0]["facts"].update(kernel="5.15 $(reboot)"), "host gpu1: facts.kernel: '5.15 $(reboot)'"),
    (lambda d: d["hosts"][0]["facts"].update(osId="../../etc"), "host gpu1: facts.osId"),
    (lambda d: d["hosts"].append(dict(d["hosts"][0])), "host gpu1: listed twice"),
    (lambda d: d["hosts"][0]["facts"]["pciDevices"][0].update(deviceId="0x2335; x"), "host gpu1: facts.pciDevices[0]"),
    (lambda d: d["hosts"][0]["facts"].update(kernelsInstalled=["k"] * 300), "host gpu1: facts.kernelsInstalled"),
    (lambda d: d["hosts"][0].update(host="gpu1\nx"), "hosts[0].host"),
])
def test_a_changed_file_is_refused_naming_the_field(tmp_path, host_site, cli, change, message):
    rc, _, err = cli("mirror", "plan", "-s", host_site, "--facts", _tampered(tmp_path, change))
    assert rc == 2, err
    assert f"facts file {tmp_path / 'tampered.json'}: {message}" in err


def test_names_come_from_this_installations_table_not_the_file(tmp_path):
    doc = facts_doc(tmp_path, {"gpu1": {"devices": HGX_H200}})
    for d in doc["hosts"][0]["facts"]["pciDevices"]:
        d.update(name="GTX 1080", chip="GP104", architecture="Pascal")
    got = node_facts.read_file(str(write(tmp_path, doc)))["gpu1"].facts
    assert {g.architecture for g in got.gpus} == {"Hopper"} and len(got.nvswitches) == 4


def test_a_file_over_the_bound_is_refused(tmp_path, monkeypatch):
    p = write(tmp_path, facts_doc(tmp_path, {"gpu1": {"devices": HGX_H200}}))
    monkeypatch.setattr(node_facts, "MAX_FILE", 100)
    with pytest.raises(ConfigError, match="facts file"):
        node_facts.read_file(str(p))
