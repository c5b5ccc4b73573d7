"""`gpu-install nodes facts` (installer/node_facts.py, installer/facts_pass.py): the node script run for real with sh
-- on this machine as it is, and on trees made in tmp_path through its GPU_INSTALL_FACTS_ROOT seam (os-release of
Ubuntu 24.04 and Rocky 9.4, a sysfs with H100/H200/B200 GPUs and NVSwitches, EFI Secure Boot on and off) --, the
pure parser on hostile answers, the PCI id table against pci.ids, and the whole command over a real SSH server
(tests/unit/test_validate_hostkeys.py's paramiko server, here running the command it is sent with sh).
"""

from __future__ import annotations

import hashlib
import os
import platform
import random
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from installer import facts_pass, jsonout, node_facts
from installer.node_facts import MARK, parse
from installer.validate import probe
from tests.unit.test_json_output import closed_port, load
from tests.unit.test_validate_hostkeys import PASSWORD, SSHServer

# /etc/os-release of Ubuntu 24.04.3 LTS as the system prints it (transcribed in github.com/syunkitada/home,
# docs/env/os/ubuntu/upgrade_to_24.04.md) and of Rocky Linux 9.4 (rocky-release 9.4; as printed by `cat
# /etc/os-release` in public install notes, e.g. the Rocky 9.4 nodes of an Oracle RAC install log on GitHub)
UBUNTU_2404 = """PRETTY_NAME="Ubuntu 24.04.3 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.3 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
"""
ROCKY_94 = """NAME="Rocky Linux"
VERSION="9.4 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.4"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"
ANSI_COLOR="0;32"
LOGO="fedora-logo-icon"
CPE_NAME="cpe:/o:rocky:rocky:9::baseos"
HOME_URL="https://rockylinux.org/"
BUG_REPORT_URL="https://bugs.rockylinux.org/"
SUPPORT_END="2032-05-31"
ROCKY_SUPPORT_PRODUCT="Rocky-Linux-9"
ROCKY_SUPPORT_PRODUCT_VERSION="9.4"
REDHAT_SUPPORT_PRODUCT="Rocky Linux"
REDHAT_SUPPORT_PRODUCT_VERSION="9.4"
"""
# UEFI spec: EFI_GLOBAL_VARIABLE = {8BE4DF61-93CA-11d2-AA0D-00E098032B8C}; efivarfs names a variable NAME-<guid>
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# an HGX H200 board: 8 GPUs (10de:2335, 3D controller) and 4 NVSwitches (10de:22a3, class 0x068000), plus an NVIDIA
# function that is neither (an HD audio controller) and an Intel device the script must not list
HGX_H200 = ([(f"0000:{b:02x}:00.0", "0x10de", "0x2335", "0x030200") for b in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab,
                                                                               0xba, 0xdb)]
            + [(f"0000:{b:02x}:00.0", "0x10de", "0x22a3", "0x068000") for b in (0x05, 0x06, 0x07, 0x08)]
            + [("0000:c1:00.1", "0x10de", "0x22e8", "0x040300"), ("0000:00:1f.0", "0x8086", "0xa1c2", "0x060100")])


def node_tree(root: Path, *, os_release: str = UBUNTU_2404, devices=(), secure_boot: bytes | None = None,
              efi: bool = True, kernels=("6.8.0-45-generic", "6.8.0-49-generic"), vmlinuz=("6.8.0-49-generic",)) -> Path:
    """A node's files as the script reads them, under root."""
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text(os_release)
    for k in kernels:
        (root / "lib" / "modules" / k / "kernel").mkdir(parents=True)
    (root / "boot").mkdir()
    for k in vmlinuz:
        (root / "boot" / f"vmlinuz-{k}").write_bytes(b"\0")
    if efi:
        (root / "sys" / "firmware" / "efi" / "efivars").mkdir(parents=True)
        if secure_boot is not None:
            (root / "sys" / "firmware" / "efi" / "efivars" / SECURE_BOOT_VAR).write_bytes(secure_boot)
    pci = root / "sys" / "bus" / "pci" / "devices"
    pci.mkdir(parents=True)
    for addr, vendor, device, cls in devices:
        d = pci / addr
        d.mkdir()
        for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
            (d / name).write_text(value + "\n")
    return root


def run_script(root: Path | None = None) -> bytes:
    env = {k: v for k, v in os.environ.items() if k != node_facts.ROOT_ENV}
    if root is not None:
        env[node_facts.ROOT_ENV] = str(root)
    return subprocess.run(["sh", "-c", node_facts.SCRIPT], env=env, capture_output=True, check=True,
                          timeout=60).stdout


# ---------------------------------------------------------------- the script, run for real


def test_on_this_machine_the_script_says_what_python_reads():
    f = parse(run_script())
    assert f.kernel == os.uname().release and f.arch == platform.machine()
    osr = platform.freedesktop_os_release()
    assert (f.os_id, f.os_version) == (osr["ID"], osr.get("VERSION_ID"))
    expect = [p.name for p in sorted(Path("/lib/modules").glob("*")) if p.is_dir()] if Path("/lib/modules").is_dir() \
        else []
    expect += [p.name[len("vmlinuz-"):] for p in sorted(Path("/boot").glob("vmlinuz-*"))]
    assert f.kernels_installed == tuple(dict.fromkeys(expect))
    efi = Path("/sys/firmware/efi")
    var = efi / "efivars" / SECURE_BOOT_VAR
    if not efi.is_dir():
        assert f.secure_boot == "off (no EFI)"
    elif var.is_file() and os.access(var, os.R_OK):
        assert f.secure_boot == ("on" if var.read_bytes()[4] == 1 else "off")
    nvidia = sorted(p.name for p in Path("/sys/bus/pci/devices").glob("*")
                    if (p / "vendor").is_file() and (p / "vendor").read_text().strip() == "0x10de")
    assert [d.address for d in f.devices] == nvidia
    assert f.problems == ()


@pytest.mark.parametrize("text,expect", [(UBUNTU_2404, ("ubuntu", "24.04", "ubuntu24.04")),
                                         (ROCKY_94, ("rocky", "9.4", "rocky9.4"))])
def test_os_release_of_ubuntu_2404_and_rocky_94(tmp_path, text, expect):
    f = parse(run_script(node_tree(tmp_path / "n", os_release=text)))
    assert (f.os_id, f.os_version, f.os_name) == expect
    assert f.problems == ()


def test_os_release_under_usr_lib_and_none_at_all(tmp_path):
    """os-release(5): /etc/os-release, else /usr/lib/os-release; neither: said, the OS left unknown."""
    root = node_tree(tmp_path / "a")
    (root / "etc" / "os-release").unlink()
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "os-release").write_text(ROCKY_94)
    assert parse(run_script(root)).os_name == "rocky9.4"
    (root / "usr" / "lib" / "os-release").unlink()
    f = parse(run_script(root))
    assert f.os_id is None and "no /etc/os-release (nor /usr/lib/os-release) on the node" in f.problems


def test_an_hgx_h200_board_without_a_driver(tmp_path):
    root = node_tree(tmp_path / "n", devices=HGX_H200, secure_boot=bytes([6, 0, 0, 0, 1]))
    f = parse(run_script(root))
    assert [(g.device_id, g.name, g.chip, g.architecture) for g in f.gpus] == \
        [("0x2335", "H200 SXM 141GB", "GH100", "Hopper")] * 8
    assert [(s.device_id, s.name) for s in f.nvswitches] == [("0x22a3", "H100 NVSwitch")] * 4
    assert [d.kind for d in f.devices if d.device_id == "0x22e8"] == ["other"]
    assert all(d.address != "0000:00:1f.0" for d in f.devices)  # not NVIDIA: not listed
    assert f.kernels_installed == ("6.8.0-45-generic", "6.8.0-49-generic")
    assert f.secure_boot == "on" and f.problems == ()
    doc = node_facts.facts_json(f)
    assert (doc["gpuCount"], doc["gpuModels"], doc["gpuArchitectures"], doc["nvswitchCount"]) == \
        (8, {"H200 SXM 141GB": 8}, ["Hopper"], 4)


def test_b200_h100_and_an_unknown_id(tmp_path):
    devices = [("0000:1b:00.0", "0x10de", "0x2901", "0x030200"), ("0000:43:00.0", "0x10de", "0x2330", "0x030200"),
               ("0000:52:00.0", "0x10de", "0x2342", "0x030200"), ("0000:61:00.0", "0x10de", "0xffff", "0x030000")]
    f = parse(run_script(node_tree(tmp_path / "n", devices=devices, secure_boot=bytes([6, 0, 0, 0, 0]))))
    assert [(g.name, g.architecture) for g in f.gpus] == [("B200", "Blackwell"), ("H100 SXM5 80GB", "Hopper"),
                                                          ("GH200 120GB / 480GB", "Hopper"), (None, None)]
    assert f.secure_boot == "off"
    assert node_facts.facts_json(f)["gpuModels"] == {"B200": 1, "H100 SXM5 80GB": 1, "GH200 120GB / 480GB": 1,
                                                     "unknown NVIDIA GPU 0xffff": 1}


@pytest.mark.parametrize("efi,var,expect", [(False, None, "off (no EFI)"), (True, None, "unknown"),
                                            (True, bytes([6, 0, 0, 0, 1]), "on"), (True, bytes([6, 0, 0, 0]),
                                                                                   "unknown")])
def test_secure_boot_states(tmp_path, efi, var, expect):
    if efi and var is None and any((Path(p) / "mokutil").exists() for p in os.environ["PATH"].split(":")):
        pytest.skip("mokutil on this machine answers for the EFI variable the tree lacks")
    f = parse(run_script(node_tree(tmp_path / "n", efi=efi, secure_boot=var)))
    assert f.secure_boot == expect


def test_the_script_writes_nothing_and_needs_no_python(tmp_path):
    """It runs with a PATH of the coreutils it needs only (no python there), and the tree is left byte for byte."""
    root = node_tree(tmp_path / "n", devices=HGX_H200, secure_boot=bytes([6, 0, 0, 0, 1]))
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "grep", "head", "uname", "cat", "od"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(found)
    out = subprocess.run([str(bin_dir / "sh"), "-c", node_facts.SCRIPT], capture_output=True, check=True,
                         env={"PATH": str(bin_dir), node_facts.ROOT_ENV: str(root)}).stdout
    f = parse(out)
    assert len(f.gpus) == 8 and f.runtimes == () and f.problems == ()
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


# ---------------------------------------------------------------- the parser on what a node may answer


def answer(*lines: str, end: bool = True) -> bytes:
    return "".join(f"{MARK} {line}\n" for line in [*lines, *(["end"] if end else [])]).encode()


GOOD = ("os ID=ubuntu", 'os VERSION_ID="24.04"', "uname-r 6.8.0-45-generic", "uname-m x86_64",
        "secureboot efivar 1", "pci 0000:18:00.0 0x10de 0x2335 0x030200",
        "runtime containerd containerd containerd.io 2.1.9 4ac6c20c7bbf8177f29e46bbdc658fec02ffb8ad",
        "runtime dockerd Docker version 27.5.1, build 4c9b3b0", "runtime docker 27.5.1")


@pytest.mark.parametrize("line, version", [
    # Debian 12's containerd (the lab's nodes): the kubelet reports containerd://1.6.20 over CRI
    ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", "1.6.20"),
    ("containerd github.com/containerd/containerd/v2 v2.1.9 4ac6c20c7bbf8177f29e46bbdc658fec02ffb8ad", "2.1.9"),
    ("containerd github.com/containerd/containerd/v2 v2.0.0-rc.1 abc", "2.0.0-rc.1"),
])
def test_a_runtimes_version_is_its_release_number_and_the_line_is_kept(line, version):
    (r,) = parse(answer(*GOOD[:5], f"runtime containerd {line}")).runtimes
    assert (r.version, r.text) == (version, line)


def test_a_good_answer():
    f = parse(answer(*GOOD))
    assert (f.os_name, f.kernel, f.arch, f.secure_boot, len(f.gpus)) == ("ubuntu24.04", "6.8.0-45-generic",
                                                                         "x86_64", "on", 1)
    assert [(r.name, r.version) for r in f.runtimes] == [("containerd", "2.1.9"), ("dockerd", "27.5.1"),
                                                         ("docker", "27.5.1")]
    assert f.problems == ()


def test_an_answer_over_the_bound_is_cut_and_said():
    raw = answer(*GOOD) + b"x" * (node_facts.MAX_OUTPUT + 10)
    f = parse(raw)
    assert f.kernel == "6.8.0-45-generic"
    assert any(f"more than {node_facts.MAX_OUTPUT} bytes" in p for p in f.problems), f.problems


def test_too_many_lines_are_cut_and_said():
    f = parse(answer(*GOOD) + b"\n" * (node_facts.MAX_LINES + 5))
    assert any(f"only the first {node_facts.MAX_LINES}" in p for p in f.problems), f.problems


def test_a_long_line_is_ignored_and_said():
    f = parse(answer(*GOOD[:2], "uname-r " + "a" * 5000, *GOOD[3:]))
    assert f.kernel is None
    assert any("characters ignored" in p for p in f.problems), f.problems


@pytest.mark.parametrize("line,field", [
    ("uname-r 6.8.0\x1b[31m-evil", "uname -r"),
    ("uname-r ../../etc/passwd", "uname -r"),
    ("uname-m x86_64;rm", "uname -m"),
    ("module 6.8.0 generic", "installed kernel"),
    ("pci 0000:18:00.0 0x10de 0x2335 0x030200 extra", "PCI device"),
    ("pci 0000:18:00.0 0x8086 0x2335 0x030200", "PCI device"),
    ("pci ../18:00.0 0x10de 0x2335 0x030200", "PCI device"),
    ("runtime containerd \x00\x01", "container runtime"),
    ("runtime podman 5.0", "container runtime"),
    ("os ID=ubu ntu", "os-release ID"),
    ('os VERSION_ID="24.04\\";reboot"', "os-release VERSION_ID"),
])
def test_a_malformed_value_is_refused_and_said(line, field):
    f = parse(answer(line))
    assert any(p.startswith(field) and "refused" in p for p in f.problems), f.problems
    assert not f.devices and not f.runtimes and not f.kernels_installed


def test_too_many_devices_are_cut_and_said():
    lines = [f"pci 0000:{i // 256:02x}:{i % 256:02x}.0 0x10de 0x2335 0x030200" for i in range(node_facts.MAX_ITEMS + 3)]
    f = parse(answer(*lines))
    assert len(f.devices) == node_facts.MAX_ITEMS
    assert any("more than" in p and "PCI devices" in p for p in f.problems)


def test_too_many_kernels_and_runtimes_are_cut_and_said():
    lines = [f"module 6.8.0-{i}-generic" for i in range(node_facts.MAX_ITEMS + 3)]
    lines += ["runtime docker 27.5.1"] * (node_facts.MAX_ITEMS + 3)
    f = parse(answer(*lines))
    assert len(f.kernels_installed) == node_facts.MAX_ITEMS and len(f.runtimes) == node_facts.MAX_ITEMS
    assert any("installed kernels: the rest ignored" in p for p in f.problems)
    assert any("container runtimes: the rest ignored" in p for p in f.problems)


def test_missing_lines_and_no_end_are_said():
    f = parse(answer("uname-m x86_64", end=False))
    assert f.os_id is None and f.kernel is None
    assert "the node's answer is incomplete (no end line: the script did not finish)" in f.problems
    assert "os-release ID: not given" in f.problems and "uname -r: not given" in f.problems


def test_any_bytes_give_facts_never_an_exception():
    rng = random.Random(38)
    pieces = [MARK.encode() + b" ", b"pci ", b"os ID=", b"uname-r ", b"runtime docker ", b"\n", b"\xff\xfe", b"\x00",
              b"0x10de ", b"module ", b"secureboot efivar ", b"end"]
    for _ in range(400):
        raw = b"".join(rng.choice(pieces) if rng.random() < .7 else bytes([rng.randrange(256)])
                       for _ in range(rng.randrange(1, 200)))
        f = parse(raw)
        assert isinstance(f, node_facts.NodeFacts)
        jsonout_check(f)


def jsonout_check(f: node_facts.NodeFacts) -> None:
    """The facts make a valid host entry of the document (strict schema)."""
    doc = jsonout.envelope(jsonout.NODE_FACTS, "nodes facts")
    doc.update(inventory=None, limit=None, hosts=[{"host": "h", "node": "h", "via": "ssh", "readAt": doc["started"],
                                                   "seconds": 0.0, "error": None, "facts": node_facts.facts_json(f)}])
    jsonout.check(doc)


# ---------------------------------------------------------------- the PCI id table


def _table_header() -> dict[str, str]:
    from importlib import resources

    text = (resources.files("installer") / "data" / "nvidia-pci-ids.tsv").read_text()
    return {k.strip(): v.strip() for k, _, v in (line[2:].partition(": ") for line in text.splitlines()
                                                 if line.startswith("# ") and ": " in line)}


def test_the_table_agrees_with_the_systems_pci_ids():
    """Every data-centre id the system's pci.ids (Debian's package pci.ids) names is in the table with the same chip;
    an older pci.ids lacks newer ids (Debian 12's 2023.04 one has no H200 or B200) and pci.ids corrects names over
    time, so only the chip is compared there. Where the file the table was extracted from is at hand (the system's,
    or GPU_INSTALL_PCI_IDS), the table is re-derived from it whole, byte for byte."""
    path = Path(os.environ.get("GPU_INSTALL_PCI_IDS") or "/usr/share/misc/pci.ids")
    if not path.is_file():
        pytest.skip("no pci.ids here (apt-get install pci.ids; scripts/apt-packages.txt lists it)")
    data = path.read_bytes()
    derived = node_facts.extract_pci_ids(data.decode("utf-8", "replace"))
    table = node_facts.pci_table()
    assert derived, f"{path}: no NVIDIA data-centre id found"
    for dev, (chip, _name) in derived.items():
        assert dev in table and table[dev][0] == chip, (dev, chip, table.get(dev))
    head = _table_header()
    if hashlib.sha256(data).hexdigest() == head["pci.ids sha256"]:
        from importlib import resources

        shipped = (resources.files("installer") / "data" / "nvidia-pci-ids.tsv").read_text()
        assert node_facts.pci_table_text(derived, source=head["source"], version=head["pci.ids Version"],
                                         sha256=head["pci.ids sha256"]) == shipped


def test_architecture_rule():
    assert [node_facts.architecture_of(c) for c in ("GA100", "GH100", "GB100", "GB102", "GB202GL", "AD102GL",
                                                    "XY1", None)] == \
        ["Ampere", "Hopper", "Blackwell", "Blackwell", "Blackwell", "Ada Lovelace", None, None]
    assert all(node_facts.architecture_of(chip) for chip, _ in node_facts.pci_table().values())


# ---------------------------------------------------------------- over SSH: the real client path


def _run_locally(root: Path):
    """An SSH server's exec handler: the command it is sent (`sh -c SCRIPT`) run here with sh, the node's files from
    root (the script's seam)."""
    def on_exec(channel, command):
        argv = shlex.split(command)
        out = subprocess.run(argv, capture_output=True, env={**os.environ, node_facts.ROOT_ENV: str(root)},
                             timeout=60).stdout
        channel.sendall(out)
        channel.send_exit_status(0)
        channel.shutdown_write()
        channel.settimeout(30)
        try:
            channel.recv(1)
        except (EOFError, OSError):
            pass
        channel.close()
    return on_exec


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return h


def _inventory(tmp_path: Path, server: SSHServer, known: Path) -> Path:
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        "gpu1": {"ansible_host": "127.0.0.1", "ansible_port": server.port, "ansible_user": "probe",
                 "ansible_password": PASSWORD, "gpu_install_node_name": "hgx-01",
                 "ansible_ssh_common_args": f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"},
        "gpu2": {"ansible_host": "127.0.0.1", "ansible_port": closed_port(), "ansible_user": "probe"}}}}}}))
    return inv


def test_the_command_over_ssh_one_node_read_one_unreachable(tmp_path, home, cli):
    """`gpu-install nodes facts` end to end: gpu1 is a real SSH server (host key checked against the inventory's
    known_hosts file, password login) that runs the script it is sent on a tree with an HGX H200 board; gpu2's port
    is closed. Exit 5 naming gpu2; -o and --json both hold gpu1's facts and gpu2's error; nothing written under
    HOME."""
    server = SSHServer(on_exec=_run_locally(node_tree(tmp_path / "node", devices=HGX_H200,
                                                      secure_boot=bytes([6, 0, 0, 0, 1]))))
    try:
        known = tmp_path / "known_hosts"
        known.write_text(server.line())
        out, js = tmp_path / "facts.json", tmp_path / "ci.json"
        rc, stdout, err = cli("nodes", "facts", "-i", _inventory(tmp_path, server, known), "-o", out, "--json", js,
                              "--ssh-timeout", "10")
    finally:
        server.close()
    assert rc == 5, (stdout, err)
    assert "error: 1 of 2 GPU node(s) could not be read: gpu2 (127.0.0.1)" in err
    assert "the other nodes' facts are recorded" in err
    doc = load(out, jsonout.NODE_FACTS)
    assert load(js, jsonout.NODE_FACTS) == doc
    assert (doc["exitCode"], doc["error"]["type"]) == (5, "HostsUnreachable")
    gpu1, gpu2 = doc["hosts"]
    assert (gpu1["host"], gpu1["node"], gpu1["error"]) == ("gpu1", "hgx-01", None)
    assert gpu1["via"] == f"ssh probe@127.0.0.1:{server.port}"
    f = gpu1["facts"]
    assert (f["os"], f["gpuCount"], f["gpuModels"], f["nvswitchCount"], f["secureBoot"]) == \
        ("ubuntu24.04", 8, {"H200 SXM 141GB": 8}, 4, "on")
    assert (f["kernel"], f["architecture"]) == (os.uname().release, platform.machine())
    assert f["kernelsInstalled"] == ["6.8.0-45-generic", "6.8.0-49-generic"]
    assert (gpu2["host"], gpu2["facts"]) == ("gpu2", None)
    assert "Unable to connect" in gpu2["error"]["message"]
    assert server.log["auth"] == ["probe"] and server.log["exec"] == [facts_pass.command()]
    assert "gpu1: ubuntu 24.04; kernel" in stdout and "8x H200 SXM 141GB (Hopper); 4 NVSwitch" in stdout
    assert list((home / ".ssh").iterdir()) == []


def test_an_unknown_host_key_is_refused_before_anything_is_sent(tmp_path, home, cli):
    server = SSHServer(on_exec=_run_locally(node_tree(tmp_path / "node")))
    try:
        empty = tmp_path / "known_hosts"
        empty.write_text("")
        out = tmp_path / "facts.json"
        rc, _, err = cli("nodes", "facts", "-i", _inventory(tmp_path, server, empty), "--limit", "gpu1", "-o", out,
                         "-q", "--ssh-timeout", "10")
    finally:
        server.close()
    assert rc == 5 and "is not in known_hosts" in err
    assert server.log["auth"] == [] and server.log["exec"] == []
    assert [h["host"] for h in load(out, jsonout.NODE_FACTS)["hosts"]] == ["gpu1"]


def _flood(size: int, trickle: bool = False):
    def on_exec(channel, command):
        try:
            if trickle:  # a byte at a time, forever: only the reader's deadline ends it
                while True:
                    channel.sendall(b"x")
                    time.sleep(0.05)
            sent = 0
            chunk = (MARK.encode() + b" uname-m x86_64\n") * 4096
            while sent < size:
                channel.sendall(chunk)
                sent += len(chunk)
            channel.send_exit_status(0)
            channel.shutdown_write()
        except (EOFError, OSError):
            pass
    return on_exec


def _target(server: SSHServer, tmp_path: Path) -> probe.Target:
    known = tmp_path / "kh"
    known.write_text(server.line())
    return probe.Target("gpu1", "gpu1", {"ansible_host": "127.0.0.1", "ansible_port": server.port,
                                         "ansible_user": "probe", "ansible_password": PASSWORD,
                                         "ansible_ssh_common_args": f"-o UserKnownHostsFile={known}"})


def test_a_node_that_floods_is_read_up_to_the_bound(tmp_path, home):
    """A node printing 64 MiB: the reader stops after MAX_OUTPUT + 1 bytes and the facts say it was more."""
    server = SSHServer(on_exec=_flood(64 * 1024 * 1024))
    try:
        t0 = time.monotonic()
        [h] = facts_pass.read([_target(server, tmp_path)], timeout=20)
        took = time.monotonic() - t0
    finally:
        server.close()
    assert h.facts is not None and h.error is None
    assert any(f"more than {node_facts.MAX_OUTPUT} bytes" in p for p in h.facts.problems), h.facts.problems
    assert took < 15


def test_a_node_that_trickles_forever_is_unreachable_after_the_timeout(tmp_path, home):
    """A byte every 50 ms, never an end: each recv is within the timeout, the whole answer is not."""
    server = SSHServer(on_exec=_flood(0, trickle=True))
    found: list = []
    try:
        reader = threading.Thread(target=lambda: found.extend(facts_pass.read([_target(server, tmp_path)], timeout=2)),
                                  daemon=True)
        reader.start()
        reader.join(15)
    finally:
        server.close()
    assert not reader.is_alive(), "still reading a node that never ends its answer after 15 s (timeout 2 s)"
    [h] = found
    assert h.facts is None and "TimeoutError: no complete answer within 2 s" in (h.error or ""), h


def test_run_bounded_reads_at_most_limit_plus_one(tmp_path, home):
    server = SSHServer(on_exec=_flood(1024 * 1024))
    try:
        raw = probe.run_bounded(_target(server, tmp_path), "anything", 20, 1000)
    finally:
        server.close()
    assert len(raw) == 1001



def test_an_unwritable_output_or_inventory_is_exit_2_before_any_node(tmp_path, home, cli):
    """-o or --json into a missing directory, and an inventory without gpu_nodes: exit 2, no node contacted (the
    server logs no connection); the document, where it can be written, holds the error and no hosts."""
    server = SSHServer(on_exec=_run_locally(node_tree(tmp_path / "node")))
    try:
        known = tmp_path / "known_hosts"
        known.write_text(server.line())
        inv = _inventory(tmp_path, server, known)
        for flags in (["-o", tmp_path / "missing" / "f.json"],
                      ["-o", tmp_path / "f.json", "--json", tmp_path / "missing" / "ci.json"]):
            rc, _, err = cli("nodes", "facts", "-i", inv, *flags, "-q")
            assert rc == 2 and "does not exist" in err, err
        no_group = tmp_path / "other.yml"
        no_group.write_text(yaml.safe_dump({"all": {"hosts": {"gpu1": {"ansible_host": "127.0.0.1"}}}}))
        out = tmp_path / "f.json"
        rc, _, err = cli("nodes", "facts", "-i", no_group, "-o", out, "-q")
        assert rc == 2 and "no group 'gpu_nodes'" in err, err
    finally:
        server.close()
    assert server.log["connections"] == 0
    doc = load(out, jsonout.NODE_FACTS)
    assert (doc["hosts"], doc["error"]["type"], doc["exitCode"]) == ([], "ConfigError", 2)


def test_the_script_and_preflight_read_the_same_efi_variable():
    """nodes facts and preflight read Secure Boot from the one UEFI global variable (the GUID once had a typo here)."""
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("preflight_module", ROOT / "plugins" / "modules" / "preflight.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.EFI_SB.rsplit("/", 1)[1] == SECURE_BOOT_VAR
    assert f"efivars/{SECURE_BOOT_VAR}" in node_facts.SCRIPT
