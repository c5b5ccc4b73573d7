"""The real DKMS signed build, read back: the lab's STAND-IN nvidia module (gpu_install_lab/standin_kmod.py) built by
Debian 12's dkms against the real Debian headers of a kernel this machine does not run, signed by DKMS with a site key
made here (mok_signing_key / mok_certificate in /etc/dkms/framework.conf, inside a private mount namespace), and
`modinfo -F signer` / `-F sig_key` read the site certificate back. Nothing is loaded.

Runs without a lab: needs root (the mount namespace), dkms, gcc, make, libelf-dev, kmod (scripts/apt-packages.txt) and
the Debian mirror the first time (the header .debs are cached)."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from gpu_install_lab import standin_kmod
from installer.validate.node import signer_check, site_certificate


def site_key(d: Path, cn: str) -> tuple[Path, Path]:
    """An RSA key and self-signed certificate made like Ubuntu's shim-signed MOK (update-secureboot-policy
    --new-key): extended key usage codeSigning + 1.3.6.1.4.1.2312.16.1.2 (module signing)."""
    d.mkdir()
    key, cert = d / "site.key", d / "site.der"
    subprocess.run(["openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                    "-subj", f"/CN={cn}/", "-addext", "extendedKeyUsage=codeSigning,1.3.6.1.4.1.2312.16.1.2",
                    "-keyout", str(key), "-outform", "DER", "-out", str(cert)], check=True, capture_output=True)
    return key, cert


def modinfo(ko: Path, field: str) -> str:
    return subprocess.run(["modinfo", "-F", field, str(ko)], check=True, capture_output=True, text=True).stdout.strip()


def _host_state() -> dict[str, str]:
    conf = Path("/etc/dkms/framework.conf")
    return {"framework.conf": hashlib.sha256(conf.read_bytes()).hexdigest() if conf.exists() else "absent",
            "mounts": Path("/proc/self/mountinfo").read_text()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[standin_kmod.Built, Path, Path, dict[str, str]]:
    work = tmp_path_factory.mktemp("kmod")
    key, cert = site_key(work / "key", "Example Site Module Signing")
    before = _host_state()
    return standin_kmod.build_signed(work / "build", key, cert), cert, key, before


def test_dkms_signs_the_standin_with_the_site_key(built: tuple[standin_kmod.Built, Path, Path, dict[str, str]]) -> None:
    b, cert, _, _ = built
    assert "Signing module" in b.log and "Sign command: /usr/lib/linux-kbuild-6.1/scripts/sign-file" in b.log
    assert modinfo(b.ko, "name") == "nvidia"
    assert modinfo(b.ko, "license") == "Dual MIT/GPL"
    assert "STAND-IN" in modinfo(b.ko, "description")
    assert modinfo(b.ko, "vermagic").startswith(b.kernel + " ")
    site = site_certificate(cert.read_bytes())
    assert modinfo(b.ko, "signer") == "Example Site Module Signing"
    assert modinfo(b.ko, "sig_key") in site.serial  # sign-file's PKCS#7 signer id: issuer and serial number
    [f] = signer_check("lab-node", modinfo(b.ko, "signer"), modinfo(b.ko, "sig_key"), site, True)
    assert f.severity == "info", f.message


def test_another_certificate_refuses_the_module(built: tuple[standin_kmod.Built, Path, Path, dict[str, str]],
                                                 tmp_path: Path) -> None:
    b, _, _, _ = built
    _, other = site_key(tmp_path / "other", "Example Site Module Signing")  # same CN, another key
    [f] = signer_check("lab-node", modinfo(b.ko, "signer"), modinfo(b.ko, "sig_key"),
                       site_certificate(other.read_bytes()), True)
    assert f.severity == "error", f.message


def test_the_machine_is_untouched(built: tuple[standin_kmod.Built, Path, Path, dict[str, str]]) -> None:
    b, _, _, before = built
    assert _host_state() == before  # /etc/dkms/framework.conf and the mounts: the namespace's went with it
    assert not Path("/lib/modules", b.kernel).exists()
    assert not Path("/var/lib/dkms/nvidia").exists()


def test_validate_probe_reads_the_signer_of_the_module_on_disk(
        built: tuple[standin_kmod.Built, Path, Path, dict[str, str]], tmp_path: Path) -> None:
    """validate's real node probe (the same sh script it runs over SSH), with the signed module where DKMS installs it
    for the running kernel (/lib/modules/<uname -r>/updates/dkms, indexed by the real depmod), layered over /usr in a
    private mount namespace: node.driver.signer reads the site signer back, and says the module is not loaded."""
    from installer.validate import probe
    from installer.validate.node import SIGNER, Expectations, SignerExpectation

    b, cert, _, _ = built
    release = subprocess.run(["uname", "-r"], check=True, capture_output=True, text=True).stdout.strip()
    mods = tmp_path / "usr" / "lib" / "modules" / release
    (mods / "updates" / "dkms").mkdir(parents=True)
    (mods / "updates" / "dkms" / "nvidia.ko").write_bytes(b.ko.read_bytes())
    subprocess.run(["depmod", "-b", str(tmp_path / "usr"), release], check=True, capture_output=True)
    script = tmp_path / "probe.sh"
    script.write_text(probe.PROBE)

    def run_probe(loaded: bool) -> str:
        # loaded: a tmpfs on /sys/module with an empty nvidia/ in it, in the namespace only (nothing is loaded)
        fake = "mount -t tmpfs tmpfs /sys/module && mkdir /sys/module/nvidia && " if loaded else ""
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                               f"mount -t overlay overlay -o lowerdir={tmp_path / 'usr'}:/usr /usr && {fake}"
                               f"exec sh {script}"], capture_output=True, text=True, timeout=120, check=True).stdout

    out = run_probe(False)
    p = probe.parse_probe(out)
    assert p.sections["signer"].strip() == "Example Site Module Signing"
    site = site_certificate(cert.read_bytes())
    assert p.sections["sig_key"].strip() in site.serial
    # the probe's text as validate reads it from a node with nvidia-smi (here: none, so the driver-not-loaded shape)
    m = probe.MARK
    text = re.sub(rf"{m} nvidia-smi\n.*?{m} rc \d+\n", f"{m} nvidia-smi\nNVIDIA-SMI has failed because it couldn't "
                  f"communicate with the NVIDIA driver.\n{m} rc 9\n", out, count=1, flags=re.S)
    checks = probe.checks_for(probe.Target("lab-node", "lab-node", {}), probe.parse_probe(text),
                              Expectations(signer=SignerExpectation(site)), 1.0)
    [c] = [c for c in checks if c.check == SIGNER]
    assert c.status == "fail" and "not loaded" in c.message and "'Example Site Module Signing'" in c.message
    text = re.sub(rf"{m} nvidia-smi\n.*?{m} rc \d+\n", f"{m} nvidia-smi\nNVIDIA-SMI has failed because it couldn't "
                  f"communicate with the NVIDIA driver.\n{m} rc 9\n", run_probe(True), count=1, flags=re.S)
    checks = probe.checks_for(probe.Target("lab-node", "lab-node", {}), probe.parse_probe(text),
                              Expectations(signer=SignerExpectation(site)), 1.0)
    [c] = [c for c in checks if c.check == SIGNER]
    assert c.status == "pass" and "signed by the site certificate" in c.message
