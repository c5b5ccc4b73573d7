"""validate's node layer without SSH: the inventory's ssh options, the probe's output, and the Checks made from it
(recorded nvidia-smi documents from tests/fixtures/nvidia-smi)."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.validate import probe
from installer.validate.node import CHECKS, Expectations

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
T = probe.Target("gpu1.example.com", "gpu-01", {})


def output(smi: str, rc: int = 0, lspci: str = "", modules: str = "nvidia\nnvidia_uvm", sb: str = "",
           reboot: str = "") -> str:
    m = probe.MARK
    return (f"{m} nvidia-smi\n{smi}\n{m} rc {rc}\n{m} lspci\n{lspci}\n{m} modules\n{modules}\n{m} secureboot\n{sb}\n"
            f"{m} reboot\n{reboot}\n{m} end\n")


def test_ssh_options_from_ansible_common_args():
    opts = probe.ssh_options("-o UserKnownHostsFile=/lab/known_hosts -o StrictHostKeyChecking=yes "
                             "-oGlobalKnownHostsFile=/etc/ssh/lab_hosts -o 'ProxyCommand ssh -W %h:%p gw'")
    assert opts == {"userknownhostsfile": "/lab/known_hosts", "stricthostkeychecking": "yes",
                    "globalknownhostsfile": "/etc/ssh/lab_hosts", "proxycommand": "ssh -W %h:%p gw"}
    assert probe.ssh_options("-oProxyJump=jump@bastion:2222") == {"proxyjump": "jump@bastion:2222"}
    assert probe.ssh_options("-J other") == {"proxyjump": "other"}
    assert probe.ssh_options(None) == {} and probe.ssh_options(None, None) == {}


@pytest.mark.parametrize("common, extra, want", [
    # OpenSSH keeps the first value of an option; Ansible puts the common args before the extra args
    ("-o StrictHostKeyChecking=yes", "-o StrictHostKeyChecking=no", "yes"),
    ("-o StrictHostKeyChecking=yes -o StrictHostKeyChecking=no", None, "yes"),
    ("-oStricthostkeychecking=accept-new", "-o 'StrictHostKeyChecking no'", "accept-new"),
    # the extra args are read even when common args are set
    ("-o ConnectTimeout=3", "-o StrictHostKeyChecking=no", "no"),
    (None, "-o StrictHostKeyChecking=accept-new", "accept-new"),
])
def test_ssh_options_first_value_wins_over_common_then_extra_args(common, extra, want):
    assert probe.ssh_options(common, extra)["stricthostkeychecking"] == want


def test_proxyjump_and_proxycommand_compete_the_first_wins():
    """ssh_config(5): ProxyJump and ProxyCommand compete, whichever is specified first prevents the other."""
    assert probe.ssh_options("-o ProxyJump=a -o 'ProxyCommand nc %h %p' -J b") == {"proxyjump": "a"}
    assert probe.ssh_options("-o 'ProxyCommand nc %h %p'", "-J b -o ProxyJump=c") == {"proxycommand": "nc %h %p"}


def test_parse_probe_sections_and_incomplete_output():
    p = probe.parse_probe(output("<xml/>", 0, "0000:01:00.0 3D controller: NVIDIA Corporation GA100"))
    assert p.nvidia_smi_rc == 0 and p.sections["nvidia-smi"] == "<xml/>" and "GA100" in p.sections["lspci"]
    with pytest.raises(ValueError, match="incomplete"):
        probe.parse_probe(output("<xml/>").split(f"{probe.MARK} modules")[0])


def test_checks_from_a_recorded_a100_document():
    xml = (FIX / "a100-sxm4-v12.xml").read_text()
    checks = probe.checks_for(T, probe.parse_probe(output(xml, 0, "0000:07:00.0 3D controller: NVIDIA Corporation")),
                              Expectations(driver_version="535.54.03"), 1.0)
    by = {c.check: c for c in checks}
    assert by["node.nvidia-smi"].status == "pass" and "driver 535.54.03" in by["node.nvidia-smi"].message
    assert by["node.driver.version"].status == "pass"
    assert all(c.node == "gpu-01" and c.layer == "node" for c in checks)
    assert {c.check for c in checks} >= set(CHECKS) - {"node.driver.not-loaded"}


def test_driver_pin_mismatch_fails():
    xml = (FIX / "a100-sxm4-v12.xml").read_text()
    checks = probe.checks_for(T, probe.parse_probe(output(xml)), Expectations(driver_version="550.144.03"), 1.0)
    bad = [c for c in checks if c.check == "node.driver.version"]
    assert [c.status for c in bad] == ["fail"] and "550.144.03" in bad[0].message and "535.54.03" in bad[0].message


def test_driver_not_loaded_and_not_installed():
    text = (FIX / "corpus" / "driver-not-loaded.txt").read_text()
    checks = probe.checks_for(T, probe.parse_probe(output(text, 9, modules="nouveau")), Expectations(), 1.0)
    by = {c.check: c for c in checks}
    assert by["node.nvidia-smi"].status == "fail" and by["node.driver.not-loaded"].status == "fail"
    assert "nouveau" in by["node.driver.not-loaded"].fix.split(";")[0]
    missing = probe.checks_for(T, probe.parse_probe(output("", 127)), Expectations(), 1.0)
    assert [(c.check, c.status) for c in missing] == [("node.nvidia-smi", "fail")]
    assert "not found" in missing[0].message


def test_unreachable_node_is_reported_not_raised():
    t = probe.Target("gpu9", "gpu9", {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_user": "nobody"})
    checks = probe.run([t], lambda _t: Expectations(), timeout=2)
    assert [(c.check, c.status) for c in checks] == [("node.reachable", "unreachable")]
    assert "127.0.0.1" in checks[0].message and checks[0].fix
