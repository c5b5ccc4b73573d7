"""The NVSwitch fabric (issue 38 item 6): validate's node.fabric check from recorded `nvidia-smi -q` Fabric sections and
`-q -x` documents (tests/fixtures/nvidia-smi/README.md, "The NVSwitch fabric"), `mirror plan`'s Fabric Manager packages
for NVSwitch nodes, the nvidia_driver role's decision (tasks/fabric.yml, run by ansible-playbook against a sysfs tree
made here) and the lab's Fabric Manager STAND-IN refusing a driver of another version."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from installer import content
from installer import validate as validate_pkg
from installer.config import parse_site
from installer.errors import ConfigError
from installer.facts import Node
from installer.validate import probe
from installer.validate.node import (
    FABRIC,
    Expectations,
    check_node,
    fabric_expected,
    fabric_setting,
)
from installer.validate.nvsmi import DriverNotLoaded, Fabric, NvidiaSmiError, parse_fabric_text, parse_xml
from tests.conftest import plan_of

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
FABRIC_FIX = FIX / "fabric"


def recorded_with_fabric(state: str, status: str, doc: str = "h200-580-v13.xml") -> str:
    """The recorded H200 document (one GPU, on no fabric: N/A) with its <fabric> state and status set to these values:
    what an HGX GPU's document says in that state (the STAND-IN nvidia-smi renders NVSwitch nodes the same way)."""
    text = (FIX / doc).read_text()
    block = re.search(r"<fabric>.*?</fabric>", text, re.S)
    assert block and "<state>N/A</state>" in block[0] and "<status>N/A</status>" in block[0]
    new = block[0].replace("<state>N/A</state>", f"<state>{state}</state>", 1)
    new = new.replace("<status>N/A</status>", f"<status>{status}</status>", 1)
    return text.replace(block[0], new, 1)


def fabric_findings(xml: str, nvswitch: bool | None):
    return [f for f in check_node("hgx-01", parse_xml(xml), Expectations(nvswitch=nvswitch)) if f.check == FABRIC]


# ---------------------------------------------------------------- reading the fabric


@pytest.mark.parametrize("name, state, status, initialised", [
    ("debian12-550-nvswitch-completed.txt", "Completed", "Success", True),
    ("mnnvl-completed-health-unhealthy.txt", "Completed", "Success", True),  # the health summary is not judged
    ("completed-insufficient-resources.txt", "Completed", "Insufficient Resources", False),
])
def test_published_fabric_sections(name, state, status, initialised):
    (f,) = parse_fabric_text((FABRIC_FIX / name).read_text())
    assert (f.state, f.status, f.reported, f.initialised) == (state, status, True, initialised)


@pytest.mark.parametrize("machine, doc", [("h100-80gb-hbm3", "h100-80gb-hbm3-580-v13.xml"), ("h200", "h200-580-v13.xml")])
def test_the_text_and_the_xml_of_one_machine_agree_on_no_fabric(machine, doc):
    """The real H100/H200 (single-GPU VMs, no NVSwitch): -q says N/A under Fabric (and `GPU Fabric GUID : N/A`
    elsewhere, which is not a Fabric section), -q -x the same; both read as not reported."""
    text = (FIX / machine / "q.txt").read_text()
    assert "GPU Fabric GUID" in text
    assert parse_fabric_text(text) == (Fabric(None, None),)
    (gpu,) = parse_xml((FIX / doc).read_text()).gpus
    assert gpu.fabric == Fabric(None, None) and not gpu.fabric.reported


def test_documents_without_a_fabric_element_read_none():
    (gpu,) = parse_xml((FIX / "tesla-t4.xml").read_text()).gpus  # driver 515, DTD v11
    assert gpu.fabric is None


def test_the_documented_states_and_unknown_error_as_a_status():
    assert parse_xml(recorded_with_fabric("In Progress", "N/A")).gpus[0].fabric == Fabric("In Progress", None)
    assert parse_xml(recorded_with_fabric("Not Started", "N/A")).gpus[0].fabric == Fabric("Not Started", None)
    # "Unknown Error" is an unavailable value elsewhere in nvidia-smi's output; as a fabric status it is the failure
    f = parse_xml(recorded_with_fabric("Completed", "Unknown Error")).gpus[0].fabric
    assert f == Fabric("Completed", "Unknown Error") and not f.initialised
    assert Fabric("completed", "SUCCESS").initialised  # compared case-insensitively
    assert parse_fabric_text("    Fabric\n        State : Not Supported\n        Status : N/A\n") == (Fabric(None, None),)


def test_a_value_that_is_not_short_printable_text_is_refused():
    with pytest.raises(NvidiaSmiError, match="fabric state/status"):
        parse_xml(recorded_with_fabric("x" * 200, "Success"))
    with pytest.raises(NvidiaSmiError):
        parse_fabric_text("Fabric\n    State : Compl\x1beted\n")


def test_several_gpus_each_their_own_section_and_bounded_text():
    one = (FABRIC_FIX / "debian12-550-nvswitch-completed.txt").read_text()
    bad = (FABRIC_FIX / "completed-insufficient-resources.txt").read_text()
    text = "GPU 00000000:18:00.0\n" + one + "    Processes : None\nGPU 00000000:2A:00.0\n" + bad
    assert parse_fabric_text(text) == (Fabric("Completed", "Success"), Fabric("Completed", "Insufficient Resources"))
    from installer.validate import nvsmi

    assert parse_fabric_text(" " * nvsmi.MAX_QUERY_TEXT + one) == ()  # nothing after the bound is read


# ---------------------------------------------------------------- node.fabric


def test_a_node_without_nvswitch_reporting_na_is_not_checked():
    xml = (FIX / "h200-580-v13.xml").read_text()
    assert fabric_findings(xml, None) == [] and fabric_findings(xml, False) == []


def test_an_initialised_fabric_passes_with_its_message():
    (f,) = fabric_findings(recorded_with_fabric("Completed", "Success"), True)
    assert f.severity == "info" and f.message == "hgx-01: NVSwitch fabric initialised on all 1 GPU(s) (Completed, Success)"


@pytest.mark.parametrize("state, status, said", [
    ("In Progress", "N/A", "fabric state In Progress (Fabric Manager has not set the fabric up)"),
    ("Not Started", "N/A", "fabric state Not Started (Fabric Manager has not set the fabric up)"),
    ("Completed", "Insufficient Resources", "fabric registration completed with status Insufficient Resources"),
])
def test_a_fabric_not_initialised_fails_naming_the_node_the_gpu_and_the_fix(state, status, said):
    for nvswitch in (True, None, False):  # a GPU that reports a fabric state is checked whatever the inventory says
        (f,) = fabric_findings(recorded_with_fabric(state, status), nvswitch)
        assert f.severity == "error" and f.host == "hgx-01" and f.gpu_index == 0
        assert f.message.startswith("hgx-01 GPU 0 (GPU-af8d6c48-55af-fd5f-dead-4a982160bd0d, NVIDIA H200): " + said)
        assert "systemctl status nvidia-fabricmanager" in f.fix and "version is the driver's exactly" in f.fix


def test_the_published_sections_through_the_check():
    for name, severity in (("debian12-550-nvswitch-completed.txt", "info"),
                           ("completed-insufficient-resources.txt", "error")):
        (fab,) = parse_fabric_text((FABRIC_FIX / name).read_text())
        (f,) = fabric_findings(recorded_with_fabric(fab.state or "N/A", fab.status or "N/A"), True)
        assert f.severity == severity, name


def test_an_nvswitch_node_whose_gpus_report_nothing_is_a_warning():
    """HGX A100: GPUs before Hopper say N/A even with Fabric Manager running (the recorded A100 document)."""
    (f,) = fabric_findings((FIX / "a100-sxm4-v12.xml").read_text(), True)
    assert f.severity == "warning" and "report no fabric state (N/A)" in f.message
    assert "systemctl is-active nvidia-fabricmanager" in f.fix


def test_not_read_or_driver_not_loaded_is_not_a_fabric_finding():
    assert fabric_findings((FIX / "tesla-t4.xml").read_text(), True) == []  # no <fabric>: not read
    res = check_node("hgx-01", DriverNotLoaded(9, "NVIDIA-SMI has failed"), Expectations(nvswitch=True))
    assert [f.check for f in res] == ["node.driver.not-loaded"]


def test_the_probe_reports_node_fabric_only_on_nvswitch_nodes():
    t = probe.Target("hgx-01", "hgx-01", {})

    def checks(xml: str, nvswitch: bool | None):
        m = probe.MARK
        text = f"{m} nvidia-smi\n{xml}\n{m} rc 0\n{m} lspci\n\n{m} modules\nnvidia\n{m} end\n"
        return {c.check: c for c in probe.checks_for(t, probe.parse_probe(text), Expectations(nvswitch=nvswitch), 1.0)}

    plain = checks((FIX / "h200-580-v13.xml").read_text(), None)
    assert FABRIC not in plain and plain["node.nvidia-smi"].status == "pass"
    ok = checks(recorded_with_fabric("Completed", "Success"), True)[FABRIC]
    assert ok.status == "pass" and "initialised" in ok.message and ok.fix == ""
    bad = checks(recorded_with_fabric("In Progress", "N/A"), True)[FABRIC]
    assert bad.status == "fail" and bad.gpu == "0" and "nvidia-fabricmanager" in bad.fix


def test_fabric_manager_setting_and_expectation():
    assert [fabric_setting(v) for v in ("auto", "AUTO", True, "true", "yes", False, "false", "no")] == \
        [None, None, True, True, True, False, False, False]
    for bad in ("maybe", "", 2):
        with pytest.raises(ValueError):
            fabric_setting(bad)
    assert fabric_expected(True) is True and fabric_expected(None) is None and fabric_expected(False, "auto") is False
    assert fabric_expected(None, True) is True and fabric_expected(True, "false") is False
    assert fabric_expected(True, "maybe") is True  # validate reads; the role refuses such a value


def write_inventory(tmp_path: Path, hosts: dict) -> str:
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    return str(inv)


def test_validate_expects_the_fabric_from_the_inventory(tmp_path):
    s = parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"},
                    "driver": {"mode": "host", "version": "580.95.05"}})
    inv = write_inventory(tmp_path, {
        "hgx": {"gpu_install_os": "ubuntu24.04", "gpu_install_nvswitch": True},
        "pcie": {"gpu_install_os": "ubuntu24.04", "gpu_install_nvswitch": False},
        "forced": {"gpu_install_os": "ubuntu24.04", "nvidia_driver_fabric_manager": True},
        "plain": {"gpu_install_os": "ubuntu24.04"}})
    plan = plan_of(s, inventory=inv)
    got = {h: validate_pkg.expectations(plan, h).nvswitch for h in ("hgx", "pcie", "forced", "plain")}
    assert got == {"hgx": True, "pcie": False, "forced": True, "plain": None}


# ---------------------------------------------------------------- mirror plan


def fabric_roots(site: dict, nodes: list[Node]) -> dict[str, dict[str, tuple[str, tuple[str, ...]]]]:
    """{os: {name: (spec, needs)}} of the plan's fabric packages."""
    ap = plan_of(parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"}, **site}),
                 nodes).artifacts()
    return {o.os: {p.name: (p.spec, tuple(n.setting for n in p.needs)) for p in o.packages
                   if "fabric" in p.name or "nscq" in p.name or p.name == "nvlsm"} for o in ap.packages}


HOST_580 = {"driver": {"mode": "host", "version": "580.95.05"}}


def test_plan_lists_fabric_manager_pinned_to_the_driver_on_nvswitch_nodes():
    got = fabric_roots(HOST_580, [Node("hgx", "ubuntu", "24.04", "6.8.0-51-generic", nvswitch=True,
                                       gpu_architectures=("Hopper",))])["ubuntu24.04"]
    assert {n: spec for n, (spec, _) in got.items()} == {
        "nvidia-fabricmanager-580": "nvidia-fabricmanager-580=580.95.05*", "libnvidia-nscq-580": "libnvidia-nscq-580=580.95.05*"}
    needs = got["nvidia-fabricmanager-580"][1]
    assert "NVSwitch node: CUDA needs Fabric Manager" in needs
    assert "the driver's version 580.95.05: Fabric Manager refuses to start with another" in needs
    assert "NVSwitches on the node (gpu_install_nvswitch)" in needs


def test_plan_nvlsm_on_blackwell_from_570_only():
    b200 = Node("b200", "ubuntu", "24.04", "6.8.0-51-generic", nvswitch=True, gpu_architectures=("Blackwell",))
    got = fabric_roots(HOST_580, [b200])["ubuntu24.04"]
    assert got["nvlsm"][0] == "nvlsm" and any("Blackwell GPUs, branch 580" in n for n in got["nvlsm"][1])
    old = fabric_roots({"driver": {"mode": "host", "version": "550.163.01", "kernelModuleType": "open"}}, [b200])
    assert "nvlsm" not in old["ubuntu24.04"] and "nvidia-fabricmanager-550" in old["ubuntu24.04"]


@pytest.mark.parametrize("version, fm, nscq", [
    ("535.261.03", "nvidia-fabric-manager", "libnvidia-nscq-535"),  # NVIDIA's CUDA repository names before 580
    ("580.95.05", "nvidia-fabricmanager", "libnvidia-nscq"),  # and from 580
])
def test_plan_rhel_names_follow_the_branch(version, fm, nscq):
    node = Node("hgx", "rocky", "9.5", "5.14.0-503.14.1.el9_5.x86_64", nvswitch=True)
    got = fabric_roots({"driver": {"mode": "host", "version": version, "kernelModuleType": "open"}}, [node])["rocky9.5"]
    assert {n: spec for n, (spec, _) in got.items()} == {fm: f"{fm}-{version}*", nscq: f"{nscq}-{version}*"}


def test_plan_runfile_mode_pins_the_runfiles_version():
    node = Node("hgx", "ubuntu", "22.04", "5.15.0-105-generic", nvswitch=True)
    got = fabric_roots({"driver": {"mode": "runfile", "version": "580.95.05", "runfileSha256": "a" * 64,
                                   "runfile": "https://files.lab/NVIDIA-Linux-x86_64-580.95.05.run"}}, [node])
    assert got["ubuntu22.04"]["nvidia-fabricmanager-580"][0] == "nvidia-fabricmanager-580=580.95.05*"


def test_plan_without_nvswitch_lists_none_and_an_unknown_node_is_a_note():
    assert fabric_roots(HOST_580, [Node("pcie", "ubuntu", "24.04", "6.8.0-51-generic", nvswitch=False)]) == \
        {"ubuntu24.04": {}}
    s = parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"}, **HOST_580})
    ap = plan_of(s, [Node("x", "ubuntu", "24.04", "6.8.0-51-generic")]).artifacts()
    assert any(n.startswith("NVSwitch nodes: whether a node has NVSwitches is not known") for n in ap.notes)
    assert not any("fabric" in p.name for o in ap.packages for p in o.packages)


def test_plan_honours_the_role_variable_and_notes_a_branch_only_version(tmp_path):
    inv = write_inventory(tmp_path, {
        "forced": {"gpu_install_os": "ubuntu24.04", "gpu_install_kernel": "6.8.0-51-generic",
                   "nvidia_driver_fabric_manager": True},
        "off": {"gpu_install_os": "ubuntu22.04", "gpu_install_kernel": "5.15.0-105-generic", "gpu_install_nvswitch": True,
                "nvidia_driver_fabric_manager": "false"}})
    s = parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"},
                    "driver": {"mode": "host", "version": "580"}})
    ap = plan_of(s, inventory=inv).artifacts()
    by_os = {o.os: {p.name: p for p in o.packages} for o in ap.packages}
    fm = by_os["ubuntu24.04"]["nvidia-fabricmanager-580"]
    assert fm.spec == "nvidia-fabricmanager-580=580*" and fm.hosts == ("forced",)
    assert "nvidia_driver_fabric_manager=true" in [n.setting for n in fm.needs]
    assert not [p for p in by_os["ubuntu22.04"] if "fabric" in p]
    assert any(n.startswith("NVSwitch nodes: driver version 580 is a branch") for n in ap.notes)


def test_plan_refuses_a_fabric_manager_setting_it_cannot_read(tmp_path):
    inv = write_inventory(tmp_path, {"g1": {"gpu_install_os": "ubuntu24.04", "nvidia_driver_fabric_manager": "maybe"}})
    s = parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"}, **HOST_580})
    with pytest.raises(ConfigError, match=r"host g1: nvidia_driver_fabric_manager is 'maybe', not auto, true or false") \
            as exc:
        plan_of(s, inventory=inv).artifacts()
    assert exc.value.exit_code == 2


# ---------------------------------------------------------------- the role's decision (tasks/fabric.yml)


def sysfs(root: Path, *devices: tuple[str, str, str]) -> Path:
    """A /sys/bus/pci/devices tree: (vendor, class, device) per function."""
    base = root / "sys" / "bus" / "pci" / "devices"
    for i, (vendor, klass, device) in enumerate(devices):
        d = base / f"0000:{0x10 + i:02x}:00.0"
        d.mkdir(parents=True)
        for name, value in (("vendor", vendor), ("class", klass), ("device", device)):
            (d / name).write_text(value + "\n")
    base.mkdir(parents=True, exist_ok=True)
    return base


H100 = ("0x10de", "0x030200", "0x2330")
NVSWITCH = ("0x10de", "0x068000", "0x22a3")
B200 = ("0x10de", "0x030200", "0x2901")
NIC = ("0x15b3", "0x020000", "0x1021")


def run_fabric_tasks(tmp_path: Path, hosts: dict[str, tuple[tuple, dict]]) -> dict[str, dict]:
    """tasks/fabric.yml in check mode on this machine (one ansible-playbook run, every host ansible_connection local
    with its own sysfs tree and host variables), the OS map of Ubuntu, no driver installed yet: per host what it decided
    (its facts) and the run's output."""
    inv: dict = {}
    for host, (devices, host_vars) in hosts.items():
        inv[host] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                     "nvidia_driver_pci_devices_dir": str(sysfs(tmp_path / host, *devices)), **host_vars}
    osm = yaml.safe_load((content.role_dir("nvidia_driver") / "vars" / "Ubuntu.yml").read_text())["nvidia_driver_os"]
    play = [{"hosts": "all", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": content.fqcn("nvidia_driver"), "tasks_from": "fabric.yml"}},
        {"ansible.builtin.copy": {"dest": str(tmp_path / "{{ inventory_hostname }}.json"),
                                  "content": "{{ {'fabric': nvidia_driver_fabric | bool, 'why': nvidia_driver_fabric_why, "
                                  "'blackwell': nvidia_driver_fabric_blackwell | bool, "
                                  "'version': nvidia_driver_fabric_version | default(None)} | to_json }}"},
         "check_mode": False}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": inv}}))
    extra = {"nvidia_driver_os": osm, "nvidia_driver_found_version": "", "nvidia_driver_package_version": "580.95.05"}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = {**os.environ, **content.ansible_env(), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                           "--check", "-e", f"@{tmp_path / 'extra.json'}", str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=300)
    out = {}
    for host in hosts:
        f = tmp_path / f"{host}.json"
        out[host] = json.loads(f.read_text()) if f.exists() else {}
    out["run"] = {"rc": proc.returncode, "output": proc.stdout + proc.stderr}
    return out


def test_role_decides_from_the_pci_bus_the_inventory_and_the_role_variable(tmp_path):
    got = run_fabric_tasks(tmp_path, {
        "hgx": ((H100, NVSWITCH, NVSWITCH, NIC), {}),
        "pcie": ((H100, NIC), {}),
        "told": ((H100,), {"gpu_install_nvswitch": True}),
        "denied": ((H100, NVSWITCH), {"gpu_install_nvswitch": False}),
        "forced": ((H100,), {"nvidia_driver_fabric_manager": True}),
        "off": ((H100, NVSWITCH), {"nvidia_driver_fabric_manager": "false"}),
        "b200": ((B200, NVSWITCH), {}),
        "arch": ((H100,), {"gpu_install_gpu_architectures": ["Blackwell"], "gpu_install_nvswitch": True}),
        "bad": ((H100,), {"nvidia_driver_fabric_manager": "maybe"}),
    })
    output = got["run"]["output"]
    assert {h: (d.get("fabric"), d.get("why"), d.get("blackwell")) for h, d in got.items() if h != "run"} == {
        "hgx": (True, "2 NVSwitch(es) on the PCI bus", False),
        "pcie": (False, "0 NVSwitch(es) on the PCI bus", False),
        "told": (True, "gpu_install_nvswitch: true", False),
        "denied": (False, "gpu_install_nvswitch: false", False),
        "forced": (True, "nvidia_driver_fabric_manager: true", False),
        "off": (False, "nvidia_driver_fabric_manager: false", False),
        "b200": (True, "1 NVSwitch(es) on the PCI bus", True),  # device id 0x2901 (B200)
        "arch": (True, "gpu_install_nvswitch: true", True),  # the host variable, whatever the PCI ids
        "bad": (None, None, None),  # refused before anything
    }, output[-3000:]
    assert "nvidia_driver_fabric_manager is 'maybe': use auto" in output
    assert re.search(r"failed=1\b", output) and got["run"]["rc"] != 0  # the one refused host only
    # check mode before the driver is installed: its version is not known yet, nothing is installed or enabled
    assert got["hgx"]["version"] == "" and "once the driver is installed (check mode" in output
    assert "Fabric Manager not installed (0 NVSwitch(es) on the PCI bus)" in output


# ---------------------------------------------------------------- the lab's Fabric Manager STAND-IN


def test_standin_fabric_manager_refuses_another_driver_version(tmp_path):
    """The STAND-IN nv-fabricmanager from its built .deb, run with a dpkg-query that says which package owns
    /usr/bin/nvidia-smi and its version (no NVIDIA module is loaded here): another version is refused with the real
    message, no driver at all too; neither writes the fabric state."""
    from gpu_install_lab.gpus import FABRIC_STATE
    from gpu_install_lab.standin_fabric import names, standin_fabric_debs

    assert not Path("/sys/module/nvidia/version").exists()
    fm, nscq = standin_fabric_debs("535.309.01")
    assert fm.name == "nvidia-fabricmanager-535_535.309.01-1_all.deb" and names("535.309.01")[1] in nscq.name
    tree = tmp_path / "deb"
    subprocess.run(["dpkg-deb", "-x", str(fm), str(tree)], check=True)
    unit = (tree / "lib/systemd/system/nvidia-fabricmanager.service").read_text()
    assert "Type=forking" in unit and f"ExecStopPost=/bin/rm -f {FABRIC_STATE}" in unit
    # the daemon as packaged, its state and pid files in tmp_path and no process left behind (`true`, not `sleep`)
    from gpu_install_lab.standin_fabric import PID_FILE

    script = tmp_path / "nv-fabricmanager"
    text = (tree / "usr/bin/nv-fabricmanager").read_text()
    assert f"STATE={FABRIC_STATE}\n" in text and f"PIDFILE={PID_FILE}\n" in text and text.count("sleep infinity") == 1
    script.write_text(text.replace(FABRIC_STATE, str(tmp_path / "state")).replace(PID_FILE, str(tmp_path / "pid"))
                      .replace("sleep infinity", "true"))
    script.chmod(0o755)
    fake = tmp_path / "bin"
    fake.mkdir()

    def run(version: str):
        (fake / "dpkg-query").write_text(
            "#!/bin/sh\ncase \"$1\" in -S) " + ("echo 'nvidia-smi: /usr/bin/nvidia-smi';;" if version else "exit 1;;")
            + f" -W) printf '%s' '{version}';; esac\n")
        (fake / "dpkg-query").chmod(0o755)
        return subprocess.run([str(script), "-c", "/dev/null"], capture_output=True,
                              text=True, env={"PATH": f"{fake}:/usr/bin:/bin"}, timeout=30)

    other = run("535.309.02-1~deb12u1")
    assert other.returncode == 1
    assert ("fabric manager NVIDIA GPU driver interface version 535.309.01 don't match with driver version 535.309.02. "
            "Please update with matching NVIDIA driver package.") in other.stderr
    none = run("")
    assert none.returncode == 1 and "no NVIDIA driver installed" in none.stderr
    assert not (tmp_path / "state").exists()
    same = run("535.309.01-0+deb12u1")  # Debian's revision of the same upstream version
    assert same.returncode == 0 and (tmp_path / "state").read_text() == "Completed 535.309.01\n"


def test_lab_nvswitch_node_config_and_the_node_smi_on_a_running_node(tmp_path):
    from gpu_install_lab import gpus

    assert "nvswitch" not in gpus.node_config("lab", "node1", 1) and \
        gpus.node_device_info(gpus.node_config("lab", "node1", 1))["nvswitch"] is False
    cfg = gpus.node_config("lab", "node1", 1, "NVIDIA H100 80GB HBM3", nvswitch=True)
    cfg["driverVersion"] = "535.309.01"
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / gpus.SMI).write_bytes(b"#!/bin/sh\necho stand-in\n")
    root = tmp_path / "node"
    gpus.install_node_smi(root, cfg, tools)
    assert yaml.safe_load((root / gpus.CONFIG_PATH.lstrip("/")).read_text())["nvswitch"] is True
    info = json.loads((root / gpus.NODE_DEVICES.lstrip("/")).read_text())
    assert info["nvswitch"] is True and info["driverVersion"] == "535.309.01" and len(info["devices"]) == 1
    wrapper = (root / gpus.NODE_SMI.lstrip("/")).read_text()
    assert f"NVIDIA_STANDIN_FABRIC_STATE={gpus.FABRIC_STATE} exec {gpus.NODE_LIB}/{gpus.SMI}" in wrapper
    assert (root / gpus.NODE_LIB.lstrip("/") / gpus.SMI).stat().st_mode & 0o111
    assert not (root / "etc/systemd/system" / gpus.UNIT).exists()  # no device plugin
