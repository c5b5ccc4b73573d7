"""The site's signed package repository on the session lab's egress-denied nodes (node1 debian12, node2 the rhel9
STAND-IN with Debian's real dnf): `mirror pull` from STAND-IN upstream apt/rpm repositories on 127.0.0.1
(tests/integration/package_upstreams.py), `mirror push --repo-dir` into the bastion's web server, then `apply` with
packages.url/packages.key: the package_repo role adds the repository with the site key (apt signed-by; dnf gpgcheck and
repo_gpgcheck, every gpgkey a file:// of a key copied from the controller) and the toolkit role installs NVIDIA's toolkit chain (STAND-INs under the real names) at 1.17.5, a
version only that repository has (the lab's own repository serves 1.17.4). A second apply changes nothing; apply's
package check refuses a site whose repository lacks the pinned version before any host is touched; uninstall takes
the packages, the repository and its key away.
"""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml

from gpu_install_lab.upstream import UPSTREAM_KEY_NAME
from tests.conftest import LAB_DRIVER_OS
from tests.integration import package_upstreams
from tests.integration.conftest import VENV_BIN, LabHandle
from tests.integration.test_driver_toolkit_roles import LAB_VARS, lab_inventory
from tests.integration.test_runtime_roles import Applier, _ok, root

pytestmark = pytest.mark.lab
DEB, RHEL = "node1", "node2"
TOOLKIT = "1.17.5"
BUILD = f"{TOOLKIT}-1gpuinstall.upstream.standin"
CHAIN = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
         "libnvidia-container1")


@pytest.fixture(scope="module")
def sr(lab: LabHandle, tmp_path_factory):
    from gpu_install_lab import packages as lab_packages
    from installer.config import load_site
    from installer.mirror import bundle as lockfile
    from installer.mirror import images, packages
    from installer.plan import Options, resolve
    from installer.signing import load_or_create

    work = tmp_path_factory.mktemp("site-repo")
    # a container runtime on each node first (preflight wants one), as test_rhel_path has it
    files = [*lab_packages.rhel_rpms(), *lab_packages.runtime_debs()]
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(lab.dir), "repo-add", *map(str, files)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    root(lab, RHEL, "dnf -y -q makecache && dnf -y -q install gpu-install-standin-containerd "
                    "&& systemctl enable --now containerd")
    root(lab, DEB, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q containerd")
    up = package_upstreams.start(work / "upstream", ("1.17.4", TOOLKIT))
    try:
        site_repo = lab.dir / "repo" / "site"  # the bastion serves lab/repo/ at repo_url
        site_data = {"operator": {"version": "v24.9.2"}, "registry": {"host": "127.0.0.1:9"}, "runtime": "containerd",
                     "driver": {"mode": "operator", "customImageOs": LAB_DRIVER_OS},
                     "toolkit": {"mode": "host", "version": TOOLKIT},
                     "mirror": {"packageRepositories": {
                         "debian12": [{"url": up.apt, "suite": "stable", "key": str(up.key)}],
                         "rocky9.5": [{"url": up.rpm, "key": str(up.key)}]}},
                     "packages": {"url": f"{lab.status['repo_url']}/site", "key": str(site_repo / packages.SITE_KEY)}}
        site = work / "site.yaml"
        site.write_text(yaml.safe_dump(site_data))
        inventory = lab_inventory(lab, work, LAB_VARS)
        # connected side: the packages of the inventory's node OSes (the image part empty: test_mirror_images)
        plan = resolve(load_site(site), Options(inventory=str(inventory)))
        bundle = work / "bundle"
        images.pull(plan, [], bundle, finish=False)
        packages.pull(plan.site, plan.artifacts(()).packages, bundle)
        assert lockfile.finish(bundle, load_or_create(work / "connected-key"))["complete"] is True  # signs the lock
    finally:
        up.close()  # the connected side is done: nothing reads the upstream from here on
    # air-gapped side: the connected side's bundle key pinned with --trusted-key
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "mirror", "push", str(bundle), "-s", str(site), "--repo-dir",
                           str(site_repo), "--signing-home", str(work / "signing"), "--trusted-key",
                           str(work / "connected-key" / "signing-key.pub.pem")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield lab, Applier(inventory, work / "state"), work, site
    # leave the nodes as the other modules expect them: no site repository, no 1.17.5 toolkit
    for node, cmd in ((DEB, "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q " + " ".join(CHAIN)),
                      (RHEL, "dnf -y -q remove " + " ".join(CHAIN))):
        root(lab, node, f"{cmd} >/dev/null 2>&1; rm -f /etc/apt/sources.list.d/gpu-install.list "
                        "/etc/apt/keyrings/gpu-install.asc /etc/yum.repos.d/gpu-install.repo "
                        "/etc/pki/rpm-gpg/RPM-GPG-KEY-gpu-install /etc/pki/rpm-gpg/RPM-GPG-KEYS-gpu-install-upstream "
                        "/var/lib/gpu-install/nvidia_container_toolkit.json",
             check=False)


def test_nodes_install_the_toolkit_from_the_signed_site_repository(sr):
    lab, apply, work, site = sr
    t0 = time.monotonic()
    out = _ok(apply(site, "--limit", f"{DEB},{RHEL}", "--tags", "toolkit"))
    print(f"apply (package_repo + toolkit, 2 nodes) {time.monotonic() - t0:.1f}s", flush=True)
    assert "apply ok" in out
    # debian12: the repository with the site key, never trusted=yes; the chain at the version only it has
    listed = root(lab, DEB, "cat /etc/apt/sources.list.d/gpu-install.list").stdout
    assert "[signed-by=/etc/apt/keyrings/gpu-install.asc]" in listed and "trusted=yes" not in listed, listed
    assert "/site/packages/debian12 gpu-install main" in listed, listed
    for name in CHAIN:
        got = root(lab, DEB, f"dpkg-query -W -f='${{Status}} ${{Version}}' {name}").stdout
        assert got == f"install ok installed {BUILD}", (name, got)
    policy = root(lab, DEB, "apt-cache policy nvidia-container-toolkit").stdout
    assert f"{lab.status['repo_url']}/site/packages/debian12 gpu-install/main" in policy, policy
    # rhel9: gpgcheck and repo_gpgcheck on, the site key and the upstream key imported by dnf itself
    repo = root(lab, RHEL, "cat /etc/yum.repos.d/gpu-install.repo").stdout
    assert "gpgcheck=1" in repo and "repo_gpgcheck=1" in repo and "gpgcheck=0" not in repo, repo
    # every key dnf may import is a file:// of a file copied from the controller, byte for byte: the site key and the
    # upstream keys `mirror push` published beside it -- no key URL, nothing fetched over the network
    site_repo = lab.dir / "repo" / "site"
    (gpgkeys,) = [line.split("=", 1)[1].split() for line in repo.splitlines() if line.startswith("gpgkey")]
    expect = {"/etc/pki/rpm-gpg/RPM-GPG-KEY-gpu-install": site_repo / "gpu-install-site.asc",
              "/etc/pki/rpm-gpg/RPM-GPG-KEYS-gpu-install-upstream":
                  site_repo / "packages" / "rocky9.5" / "RPM-GPG-KEYS-upstream.asc"}
    assert gpgkeys == [f"file://{p}" for p in expect], repo
    for path, src in expect.items():
        assert root(lab, RHEL, f"cat {path}").stdout == src.read_text(), path
        assert "-----BEGIN PGP PUBLIC KEY BLOCK-----" in src.read_text()
    for name in CHAIN:
        got = root(lab, RHEL, f"rpm -q --qf '%{{VERSION}}-%{{RELEASE}}' {name}").stdout
        assert got == BUILD, (name, got)
    keys = root(lab, RHEL, "rpm -q gpg-pubkey --qf '%{SUMMARY}\\n'").stdout
    assert "gpu-install site package repository" in keys and UPSTREAM_KEY_NAME in keys, keys
    for node in (DEB, RHEL):
        assert f"version {TOOLKIT}" in root(lab, node, "nvidia-ctk --version").stdout
    # a second apply changes nothing
    _ok(apply(site, "--limit", f"{DEB},{RHEL}", "--tags", "toolkit"))
    stats = apply.site_stats()
    assert stats[DEB]["changed"] == 0 and stats[RHEL]["changed"] == 0, stats


def test_apply_refuses_a_repository_without_the_pinned_version_before_any_host(sr):
    lab, apply, work, site = sr
    data = yaml.safe_load(site.read_text())
    data["toolkit"]["version"] = "1.17.9"
    other = work / "site-1.17.9.yaml"
    other.write_text(yaml.safe_dump(data))
    runs = set((work / "state" / "runs").glob("*"))
    proc = apply(other, "--limit", f"{DEB},{RHEL}", "--tags", "toolkit")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"debian12/nvidia-container-toolkit=1.17.9*: not in the site repository (it has {BUILD})" in proc.stderr
    assert "rocky9.5/nvidia-container-toolkit-1.17.9*: not in the site repository" in proc.stderr, proc.stderr
    assert set((work / "state" / "runs").glob("*")) == runs  # no playbook ran: no host was contacted


def test_uninstall_takes_the_packages_the_repository_and_its_key_away(sr):
    lab, apply, work, site = sr
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "uninstall", "-s", str(site), "-i", str(apply.inventory),
                           "--limit", f"{DEB},{RHEL}", "--skip-operator", "--yes"], capture_output=True, text=True,
                          env=apply.env(), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for node in (DEB, RHEL):
        left = root(lab, node, "ls /etc/apt/sources.list.d/gpu-install.list /etc/apt/keyrings/gpu-install.asc "
                               "/etc/yum.repos.d/gpu-install.repo /etc/pki/rpm-gpg/RPM-GPG-KEY-gpu-install "
                               "/etc/pki/rpm-gpg/RPM-GPG-KEYS-gpu-install-upstream 2>/dev/null",
                    check=False).stdout
        assert left.strip() == "", (node, left)
        assert root(lab, node, "command -v nvidia-ctk", check=False).returncode != 0
    # the site key dnf imported leaves the rpm database too (the upstream key, imported for the packages, stays)
    keys = root(lab, RHEL, "rpm -q gpg-pubkey --qf '%{SUMMARY}\\n'", check=False).stdout
    assert "gpu-install site package repository" not in keys and UPSTREAM_KEY_NAME in keys, keys
