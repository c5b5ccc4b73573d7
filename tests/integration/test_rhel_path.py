"""The RedHat-family path and driver.mode runfile, for real, on the session lab (node1 debian12, node2 rhel9 stand-in).

node2 is the rhel9 STAND-IN (Debian userland with Rocky 9.5's os-release, Debian's dnf/rpm and python3-dnf, Ansible
facts os_family RedHat): the roles take their dnf branches and run real dnf transactions against the lab's RPM repo,
which serves (`gpu-install lab repo-add`, gpu_install_lab/packages.py):
  - gpu-install-standin-containerd: Debian's real containerd 1.6.20 + runc binaries repackaged unmodified as an RPM
    (preflight wants a runtime; containerd_runtime restarts it and validates with `containerd config dump`),
  - the runtime and nvidia-container-toolkit STAND-IN RPMs (nvidia-ctk prints the pinned version),
  - STAND-IN NVIDIA driver RPMs under NVIDIA's RHEL 9 names (nvidia-driver, nvidia-driver-cuda, kmod-nvidia-latest-dkms,
    nvidia-persistenced; epoch 3) in TWO versions, so the role's dnf pin `name-<v>*` is what picks the older one.
registry_trust's RHEL branch writes /etc/pki/ca-trust/source/anchors and runs `update-ca-trust extract` (the rhel9
node's STAND-IN, gpu_install_lab/rootfs.py UPDATE_CA_TRUST): TLS to the lab registry fails before and works after.

driver.mode runfile runs the runfile STAND-IN NVIDIA-Linux-x86_64-<v>-STANDIN.run served under the repo's /files/
(a shell script accepting nvidia-installer's unattended flags; it installs an nvidia-smi that exits 9 and an
nvidia-installer whose --driver-info reports the version).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS
from tests.integration.conftest import LabHandle
from tests.integration.test_driver_toolkit_roles import LAB_VARS, lab_inventory, task_messages
from tests.integration.test_runtime_roles import VENV_BIN, Applier, _ok, root

pytestmark = pytest.mark.lab
DEB, RHEL = "node1", "node2"
DRIVER = "535.216.03"  # pinned; the repo also serves NEWER below, which an unpinned install would take
NEWER = "550.54.15"
TOOLKIT = "1.17.4"
UNTRUST_RHEL = ("rm -f /etc/pki/ca-trust/source/anchors/* && update-ca-trust extract && rm -rf /etc/containers/certs.d")


def _site(work: Path, name: str, registry: dict, driver: dict, toolkit: dict | None = None,
          operator: str = "v24.9.2") -> Path:
    site = {"operator": {"version": operator}, "registry": registry, "runtime": "containerd",
            "toolkit": toolkit or {"mode": "operator"}, "driver": {**driver, "customImageOs": LAB_DRIVER_OS}}
    path = work / f"site-{name}.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


@pytest.fixture(scope="module")
def rp(lab: LabHandle, tmp_path_factory):
    from gpu_install_lab import packages

    t0 = time.monotonic()
    files = [*packages.rhel_rpms(), *packages.standin_nvidia_driver_rpms(NEWER), *packages.runtime_debs(),
             packages.standin_runfile(DRIVER), packages.standin_runfile(NEWER)]
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(lab.dir), "repo-add", *map(str, files)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    print(f"{len(files)} packages/files into the lab repo in {time.monotonic() - t0:.1f}s", flush=True)
    # a container runtime on each node first (preflight), as a site's image or admin would have it
    root(lab, RHEL, "dnf -y -q makecache && dnf -y -q install gpu-install-standin-containerd "
                    "&& systemctl enable --now containerd")
    root(lab, DEB, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q containerd")
    work = tmp_path_factory.mktemp("rhel")
    repo_url = lab.status["repo_url"]
    yield lab, Applier(lab_inventory(lab, work, LAB_VARS), work / "state"), work, repo_url


def rpm_q(lab: LabHandle, pkg: str) -> str:
    return root(lab, RHEL, f"rpm -q --qf '%{{EPOCH}}:%{{VERSION}}-%{{RELEASE}}' {pkg}", check=False).stdout


def test_rhel9_apply_host_mode_dnf_pins_trust_store_then_changed_0(rp):
    lab, apply, work, _ = rp
    reg = lab.status["registry"]
    # the repo offers both driver versions: only the pin keeps dnf off the newer one
    avail = root(lab, RHEL, "dnf -q list --showduplicates --available nvidia-driver").stdout
    assert DRIVER in avail and NEWER in avail, avail
    assert "is not installed" in rpm_q(lab, "nvidia-driver")
    # the RHEL trust store without the lab CA: TLS to the registry fails (curl and Python), so the role's work shows
    root(lab, RHEL, UNTRUST_RHEL)
    before = root(lab, RHEL, f"curl -sS https://{reg}/v2/", check=False)
    assert before.returncode != 0 and "certificate" in before.stderr, before
    py = f"python3 -c \"import urllib.request; urllib.request.urlopen('https://{reg}/v2/')\""
    assert "CERTIFICATE_VERIFY_FAILED" in root(lab, RHEL, py, check=False).stderr

    site = _site(work, "rhel-host", {"host": reg, "ca": str(lab.ca)}, {"mode": "host", "version": DRIVER},
                 {"mode": "host", "version": TOOLKIT})
    # check mode: reports the changes, installs and writes nothing
    _ok(apply(site, "--limit", RHEL, "--check"))
    assert apply.site_stats()[RHEL]["changed"] >= 3
    assert "is not installed" in rpm_q(lab, "nvidia-driver")
    assert root(lab, RHEL, "ls /etc/pki/ca-trust/source/anchors/").stdout.strip() == ""
    t0 = time.monotonic()
    out = _ok(apply(site, "--limit", RHEL))
    print(f"rhel9 first apply {time.monotonic() - t0:.1f}s", flush=True)
    assert "apply ok" in out
    # dnf installed the pinned version of every driver package (epoch 3 as NVIDIA's), not the newer one
    for pkg in ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-latest-dkms"):
        assert rpm_q(lab, pkg).startswith(f"3:{DRIVER}-"), (pkg, rpm_q(lab, pkg))
    assert rpm_q(lab, "nvidia-persistenced").startswith(f"3:{NEWER}-")  # companion package: unpinned, newest
    assert rpm_q(lab, "nvidia-container-toolkit").startswith(f"(none):{TOOLKIT}-")
    assert "STAND-IN" in root(lab, RHEL, "rpm -q --qf '%{SUMMARY}' nvidia-container-toolkit").stdout
    assert f"version {TOOLKIT}" in root(lab, RHEL, "nvidia-ctk --version").stdout
    smi = root(lab, RHEL, "nvidia-smi", check=False)
    assert smi.returncode == 9 and "couldn't communicate with the NVIDIA driver" in smi.stdout
    assert root(lab, RHEL, "systemctl is-enabled nvidia-persistenced").stdout.strip() == "enabled"
    report = task_messages(apply)["Driver | Report"]
    assert f"driver {DRIVER} (pinned {DRIVER})" in report and "REBOOT REQUIRED" in report, report
    # containerd took the runtime the toolkit's package provides
    assert "nvidia-container-runtime" in root(lab, RHEL, "containerd config dump").stdout
    # registry_trust's RHEL branch: the anchor, then `update-ca-trust extract` built the bundle RHEL's tools read
    anchor = root(lab, RHEL, "cat /etc/pki/ca-trust/source/anchors/gpu-install-registry-*.crt").stdout
    assert anchor == lab.ca.read_text()
    bundle = root(lab, RHEL, "cat /etc/pki/tls/certs/ca-bundle.crt").stdout
    assert lab.ca.read_text().strip() in bundle
    root(lab, RHEL, f"curl -sSf https://{reg}/v2/")
    root(lab, RHEL, py)

    _ok(apply(site, "--limit", RHEL))
    stats = apply.site_stats()
    assert stats[RHEL]["changed"] == 0 and stats[RHEL]["ok"] > 20, stats


def test_runfile_installs_then_changed_0(rp):
    lab, apply, work, repo_url = rp
    runfile = f"NVIDIA-Linux-x86_64-{DRIVER}-STANDIN.run"
    sha = hashlib.sha256((lab.dir / "repo" / "files" / runfile).read_bytes()).hexdigest()
    assert root(lab, DEB, "command -v nvidia-smi", check=False).returncode != 0
    site = _site(work, "runfile", {"host": "registry.example.internal:5000"},
                 {"mode": "runfile", "runfile": f"{repo_url}/files/{runfile}", "runfileSha256": sha})
    _ok(apply(site, "--limit", DEB, "--check"))  # check mode: nothing fetched, nothing run
    assert root(lab, DEB, "ls /var/cache/gpu-install/nvidia-driver/ 2>/dev/null; command -v nvidia-installer",
                check=False).stdout.strip() == ""
    _ok(apply(site, "--limit", DEB))
    info = root(lab, DEB, "nvidia-installer --driver-info").stdout
    assert f"(version: {DRIVER})" in info and "STAND-IN" in info, info
    smi = root(lab, DEB, "nvidia-smi", check=False)
    assert smi.returncode == 9, smi
    assert root(lab, DEB, f"sha256sum /var/cache/gpu-install/nvidia-driver/{runfile}").stdout.startswith(sha)
    assert "blacklist nouveau" in root(lab, DEB, "cat /etc/modprobe.d/blacklist-nouveau.conf").stdout
    log = root(lab, DEB, "cat /var/log/nvidia-installer.log").stdout
    assert log.count("installed") == 1 and "dkms=yes" in log, log  # the role passed --dkms
    msgs = task_messages(apply)
    assert f"driver {DRIVER} (pinned {DRIVER})" in msgs["Driver | Report"]
    assert "REBOOT REQUIRED (no NVIDIA kernel module is loaded)" in msgs["Driver | Report"]
    _ok(apply(site, "--limit", DEB))
    assert apply.site_stats()[DEB]["changed"] == 0
    assert root(lab, DEB, "cat /var/log/nvidia-installer.log").stdout.count("installed") == 1  # not run again


def test_runfile_checksum_mismatch_exit_4_nothing_run(rp):
    lab, apply, work, repo_url = rp
    runfile = f"NVIDIA-Linux-x86_64-{NEWER}-STANDIN.run"
    wrong = hashlib.sha256(b"not the runfile").hexdigest()
    for where in (f"{repo_url}/files/{runfile}", str(lab.dir / "repo" / "files" / runfile)):  # mirror URL, controller path
        site = _site(work, "runfile-bad", {"host": "registry.example.internal:5000"},
                     {"mode": "runfile", "runfile": where, "runfileSha256": wrong})
        proc = apply(site, "--limit", DEB)
        assert proc.returncode == 4, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
        err = proc.stderr
        assert f"{DEB}: driver.runfile {where}:" in err and wrong in err and "Nothing was run" in err, err
        assert f"(version: {DRIVER})" in root(lab, DEB, "nvidia-installer --driver-info").stdout  # the old one stays


def test_runfile_refuses_distro_driver_packages(rp):
    """node2 has the driver RPMs from the host-mode test: the runfile would overwrite their files."""
    lab, apply, work, repo_url = rp
    assert rpm_q(lab, "nvidia-driver").startswith("3:")
    runfile = f"NVIDIA-Linux-x86_64-{NEWER}-STANDIN.run"
    sha = hashlib.sha256((lab.dir / "repo" / "files" / runfile).read_bytes()).hexdigest()
    site = _site(work, "runfile-rhel", {"host": "registry.example.internal:5000"},
                 {"mode": "runfile", "runfile": f"{repo_url}/files/{runfile}", "runfileSha256": sha})
    proc = apply(site, "--limit", RHEL)
    assert proc.returncode == 4, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    err = proc.stderr
    assert f"{RHEL}: driver.mode is runfile but distro NVIDIA driver packages are installed" in err, err
    assert f"kmod-nvidia-latest-dkms {DRIVER}" in err and f"nvidia-driver {DRIVER}" in err, err
    assert root(lab, RHEL, "command -v nvidia-installer", check=False).returncode != 0  # nothing was run


def test_host_mode_refuses_a_runfile_driver(rp):
    """node1 has the runfile's driver from test_runfile_installs_then_changed_0: packages would overwrite its files."""
    lab, apply, work, _ = rp
    assert root(lab, DEB, "test -e /usr/bin/nvidia-uninstall", check=False).returncode == 0
    site = _site(work, "host-deb", {"host": "registry.example.internal:5000"}, {"mode": "host", "version": "535.309.01"})
    proc = apply(site, "--limit", DEB)
    assert proc.returncode == 4, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert (f"{DEB}: driver.mode is host but an NVIDIA driver installed by a runfile is present "
            "(/usr/bin/nvidia-uninstall)") in proc.stderr, proc.stderr
    assert root(lab, DEB, "dpkg-query -W nvidia-driver", check=False).returncode != 0  # nothing installed


def test_uninstall_dnf_packages_and_the_runfile_driver(rp):
    """Last (the tests above need the drivers in place): uninstall reverses the records on both nodes -- on rhel9 the
    RPMs gpu-install installed go through dnf (the containerd stand-in installed before stays), on debian12 the runfile
    driver gpu-install ran is uninstalled with nvidia-installer --uninstall and its cached runfile goes, the site CA
    leaves the RHEL anchors; a second uninstall changes nothing."""
    lab, apply, work, _ = rp
    # the rhel9 apply's site (the driver role's removal follows each node's record, whatever driver.mode says; the
    # toolkit and trust removals need toolkit.mode host and the CA, as apply did)
    reg = lab.status["registry"]
    site = _site(work, "rhel-uninstall", {"host": reg, "ca": str(lab.ca)}, {"mode": "host", "version": DRIVER},
                 {"mode": "host", "version": TOOLKIT})
    rec = root(lab, RHEL, "cat /var/lib/gpu-install/nvidia_driver.json").stdout
    for pkg in ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-latest-dkms", "nvidia-persistenced"):
        assert f'"{pkg}"' in rec, rec
    assert "runfile" in root(lab, DEB, "cat /var/lib/gpu-install/nvidia_driver.json").stdout
    argv = [str(VENV_BIN / "gpu-install"), "uninstall", "-s", str(site), "-i", str(apply.inventory), "--skip-operator",
            "--yes"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=apply.env(), timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    print(f"uninstall (2 nodes) {time.monotonic() - t0:.1f}s", flush=True)
    for pkg in ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-latest-dkms", "nvidia-persistenced",
                "nvidia-container-toolkit"):
        assert "is not installed" in rpm_q(lab, pkg), (pkg, rpm_q(lab, pkg))
    assert rpm_q(lab, "gpu-install-standin-containerd").startswith("(none):")  # there before apply: stays
    assert root(lab, RHEL, "ls /etc/pki/ca-trust/source/anchors/").stdout.strip() == ""
    assert "no NVIDIA driver" in root(lab, DEB, "nvidia-installer --driver-info 2>&1 || true").stdout \
        or root(lab, DEB, "command -v nvidia-installer", check=False).returncode != 0
    assert root(lab, DEB, "test -e /usr/bin/nvidia-smi", check=False).returncode != 0
    assert root(lab, DEB, "test -e /var/cache/gpu-install/nvidia-driver", check=False).returncode != 0
    assert f"runfile driver {DRIVER}: uninstalled (nvidia-installer --uninstall)" in proc.stderr, proc.stderr[-3000:]
    for node in (DEB, RHEL):
        assert root(lab, node, "ls /var/lib/gpu-install/ 2>/dev/null || true").stdout.strip() == ""
    again = subprocess.run(argv, capture_output=True, text=True, env=apply.env(), timeout=600)
    assert again.returncode == 0 and re.search(r"nodes +unchanged", again.stdout), again.stdout + again.stderr[-3000:]


# ---------------------------------------------------------------- RHEL 9 module streams (issue 38 item 5)
# After the tests above (their uninstall left node2 without a driver): a STAND-IN of NVIDIA's RHEL 9 repository
# (gpu_install_lab/standin_modules.py: nvidia-driver:580-open and :580-dkms at 580.82.07 and 580.95.05, default stream
# 580-dkms; real createrepo_c and modifyrepo_c) served by the bastion beside the lab repository and configured on the
# rhel9 node for these tests only.

STREAM_DRIVER = "580.82.07"  # pinned; the stream also holds 580.95.05
STREAM_REPO = "/etc/yum.repos.d/gpu-install-lab-nvidia.repo"
MODULE_FILE = "/etc/dnf/modules.d/nvidia-driver.module"


def _enabled_rows(module_list: str) -> list[str]:
    """The rows of `dnf module list nvidia-driver` marked enabled ([e]); not its hint line."""
    return [ln for ln in module_list.splitlines() if ln.startswith("nvidia-driver ") and "[e]" in ln]


@pytest.fixture(scope="module")
def streams(rp):
    from gpu_install_lab import standin_modules

    lab, apply, work, repo_url = rp
    standin_modules.module_repository(lab.dir / "repo" / "nvidia-rhel9")
    root(lab, RHEL, f"printf '[gpu-install-lab-nvidia]\\nname=STAND-IN NVIDIA RHEL 9 repository\\nbaseurl={repo_url}/"
                    f"nvidia-rhel9\\nenabled=1\\ngpgcheck=0\\nmetadata_expire=0\\n' > {STREAM_REPO} && dnf -q makecache")
    yield lab, apply, work
    # leave node2 as the other modules expect it: no module state, no STAND-IN NVIDIA repository
    root(lab, RHEL, f"dnf -y -q module reset nvidia-driver; rm -f {STREAM_REPO} {MODULE_FILE}; dnf -q makecache",
         check=False)


def test_rhel9_host_mode_open_enables_the_exact_stream_then_changed_0(streams):
    """kernelModuleType open on the rhel9 node: the real dnf enables nvidia-driver:580-open (the module's default
    stream is the proprietary 580-dkms, which a plain install would take) and installs only the open packages at the
    pin; the second apply changes nothing."""
    lab, apply, work = streams
    mods = root(lab, RHEL, "dnf -q module list nvidia-driver").stdout
    assert "580-open" in mods and "580-dkms [d]" in mods and not _enabled_rows(mods), mods
    avail = root(lab, RHEL, "dnf -q list --available 'kmod-nvidia-*'").stdout
    assert "kmod-nvidia-latest-dkms" in avail and "kmod-nvidia-open-dkms" not in avail, avail  # the default's
    site = _site(work, "rhel-stream", {"host": "registry.example.internal:5000"},
                 {"mode": "host", "version": STREAM_DRIVER, "kernelModuleType": "open"})
    _ok(apply(site, "--limit", RHEL, "--check"))  # reports the stream and the install, changes nothing
    assert apply.site_stats()[RHEL]["changed"] >= 1
    assert "state=enabled" not in root(lab, RHEL, f"cat {MODULE_FILE} 2>/dev/null || true").stdout
    assert "is not installed" in rpm_q(lab, "nvidia-driver")
    t0 = time.monotonic()
    _ok(apply(site, "--limit", RHEL))
    print(f"rhel9 stream apply {time.monotonic() - t0:.1f}s", flush=True)
    state = root(lab, RHEL, f"cat {MODULE_FILE}").stdout
    assert "stream=580-open" in state and "state=enabled" in state, state
    for pkg in ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-open-dkms"):
        assert rpm_q(lab, pkg).startswith(f"3:{STREAM_DRIVER}-"), (pkg, rpm_q(lab, pkg))
    for pkg in ("kmod-nvidia-latest-dkms", "nvidia-open"):
        assert "is not installed" in rpm_q(lab, pkg), (pkg, rpm_q(lab, pkg))
    assert rpm_q(lab, "nvidia-persistenced").startswith("3:580.95.05-")  # the stream's newest, not the lab repo's
    rec = json.loads(root(lab, RHEL, "cat /var/lib/gpu-install/nvidia_driver.json").stdout)
    assert rec["entries"]["module_stream"] == {"module": "nvidia-driver", "stream": "580-open", "previous_state": "",
                                               "previous_stream": ""}, rec
    # the enabled stream hides the same-named packages of the lab repository's other branches
    branches = root(lab, RHEL, "dnf -q list --showduplicates nvidia-driver", check=False).stdout
    assert STREAM_DRIVER in branches and DRIVER not in branches and NEWER not in branches, branches
    assert f"driver {STREAM_DRIVER} (pinned {STREAM_DRIVER})" in task_messages(apply)["Driver | Report"]
    _ok(apply(site, "--limit", RHEL))
    assert apply.site_stats()[RHEL]["changed"] == 0, apply.site_stats()


def test_rhel9_uninstall_puts_the_stream_back(streams):
    """uninstall removes the stream's packages and resets the stream gpu-install enabled (nothing was enabled
    before); a second uninstall changes nothing."""
    lab, apply, work = streams
    site = work / "site-rhel-stream.yaml"
    argv = [str(VENV_BIN / "gpu-install"), "uninstall", "-s", str(site), "-i", str(apply.inventory), "--skip-operator",
            "--yes"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=apply.env(), timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "nvidia-driver: stream 580-open put back (dnf module reset nvidia-driver)" in proc.stderr, proc.stderr[-3000:]
    for pkg in ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-open-dkms", "nvidia-persistenced"):
        assert "is not installed" in rpm_q(lab, pkg), (pkg, rpm_q(lab, pkg))
    assert "state=enabled" not in root(lab, RHEL, f"cat {MODULE_FILE}").stdout
    assert not _enabled_rows(root(lab, RHEL, "dnf -q module list nvidia-driver").stdout)
    again = subprocess.run(argv, capture_output=True, text=True, env=apply.env(), timeout=600)
    assert again.returncode == 0 and re.search(r"nodes +unchanged", again.stdout), again.stdout + again.stderr[-3000:]


def test_rhel9_without_driver_version_the_release_branch_open_only(streams):
    """No driver.version: host mode installs the branch of the driver the release pins (v25.10.1: 580.105.08, branch
    580), kernelModuleType open: the stream 580-open and its newest version (580.95.05: the pin is the branch prefix),
    no proprietary package; uninstall puts the stream back."""
    lab, apply, work = streams
    site = _site(work, "rhel-release-branch", {"host": "registry.example.internal:5000"},
                 {"mode": "host", "kernelModuleType": "open"}, operator="v25.10.1")
    _ok(apply(site, "--limit", RHEL))
    state = root(lab, RHEL, f"cat {MODULE_FILE}").stdout
    assert "stream=580-open" in state and "state=enabled" in state, state
    for pkg in ("nvidia-driver", "nvidia-driver-cuda", "kmod-nvidia-open-dkms"):
        assert rpm_q(lab, pkg).startswith("3:580.95.05-"), (pkg, rpm_q(lab, pkg))
    assert "is not installed" in rpm_q(lab, "kmod-nvidia-latest-dkms")
    assert "driver 580.95.05 (pinned 580)" in task_messages(apply)["Driver | Report"]
    argv = [str(VENV_BIN / "gpu-install"), "uninstall", "-s", str(site), "-i", str(apply.inventory), "--skip-operator",
            "--yes"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=apply.env(), timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert not _enabled_rows(root(lab, RHEL, "dnf -q module list nvidia-driver").stdout)
    assert "is not installed" in rpm_q(lab, "nvidia-driver")
