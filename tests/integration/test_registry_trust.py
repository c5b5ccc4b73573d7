"""registry_trust against a real TLS registry: the lab's (docker-registry, certificate from the lab CA).

A lab of its own (1 debian12 node with containerd + docker.io from the lab repo, see
test_runtime_roles.py). The lab puts its CA into every node's trust store at `lab up`; this test
takes it OUT first and proves the node then cannot verify the registry, so what makes the pulls
work afterwards is the role: the site's `registry.ca` (the lab CA on the controller) into the OS
store, containerd's hosts.toml and Docker's certs.d.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.test_lab import MAKE_OCI
from tests.integration.test_runtime_roles import Applier, _ok, apply_inventory, root, runtime_lab, write_site

pytestmark = pytest.mark.lab
NODE = "node1"
IMAGE = "gpu-install/trust-test:v1"
UNTRUST = ("rm -f /usr/local/share/ca-certificates/gpu-install-lab-ca.crt && update-ca-certificates --fresh >/dev/null"
           " && rm -rf /etc/containers/certs.d")


@pytest.fixture(scope="module")
def tl(tmp_path_factory):
    handle, the_lab = runtime_lab(tmp_path_factory, count=1)
    work = tmp_path_factory.mktemp("trust")
    try:
        reg = handle.status["registry"]
        # an image in the registry, pushed from the bastion with the lab CA
        oci = subprocess.run([sys.executable, "-c", MAKE_OCI.replace('"/tmp/oci-src"', repr(str(work / "oci")))],
                             capture_output=True, text=True, check=True)
        assert oci.stdout.startswith("sha256:")
        certs = work / "certs"
        certs.mkdir()
        (certs / "ca.crt").write_text(handle.ca.read_text())
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-cert-dir", str(certs), f"oci:{work / 'oci'}:v1",
                        f"docker://{reg}/{IMAGE}"], check=True, capture_output=True, text=True, timeout=120)
        # dockerd needs these keys to start inside a node: in place before the package starts it
        root(handle, NODE, "mkdir -p /etc/docker && cat > /etc/docker/daemon.json",
             input='{"iptables": false, "ip-forward": false, "bridge": "none"}\n')
        root(handle, NODE, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q containerd "
                           "docker.io gpu-install-standin-nvidia-container-runtime")
        root(handle, NODE, UNTRUST)
        yield handle, Applier(apply_inventory(handle, work), work / "state"), work, reg
    finally:
        the_lab.down()


def pull(handle, reg: str):
    return root(handle, NODE, f"ctr -n k8s.io content fetch --hosts-dir /etc/containerd/certs.d {reg}/{IMAGE}",
                check=False)


def test_untrusted_before_then_trusted_after_then_changed_0(tl):
    handle, apply, work, reg = tl
    site = write_site(work, "containerd", host=reg, ca=str(handle.ca))
    # without the CA the node cannot verify the registry: the test can fail
    before = pull(handle, reg)
    assert before.returncode != 0 and "certificate" in (before.stderr + before.stdout), before
    assert root(handle, NODE, f"curl -sS https://{reg}/v2/", check=False).returncode != 0

    # check mode: reports, writes nothing
    _ok(apply(site, "--check"))
    assert apply.site_stats()[NODE]["changed"] >= 1
    assert root(handle, NODE, f"test -e /etc/containerd/certs.d/{reg}", check=False).returncode != 0
    assert root(handle, NODE, "ls /usr/local/share/ca-certificates/").stdout.strip() == ""

    _ok(apply(site))
    hosts = root(handle, NODE, f"cat /etc/containerd/certs.d/{reg}/hosts.toml").stdout
    assert f'[host."https://{reg}"]' in hosts and f'ca = "/etc/containerd/certs.d/{reg}/ca.crt"' in hosts
    after = pull(handle, reg)
    assert after.returncode == 0, after
    # the OS store verifies it too (curl without --cacert), and the CA there is the site's file
    root(handle, NODE, f"curl -sSf https://{reg}/v2/")
    store = root(handle, NODE, "cat /usr/local/share/ca-certificates/gpu-install-registry-*.crt").stdout
    assert store == handle.ca.read_text()
    # containerd itself is configured with the hosts dir (containerd_runtime), so the CRI pulls use it
    assert 'config_path = "/etc/containerd/certs.d"' in root(handle, NODE, "containerd config dump").stdout

    _ok(apply(site))
    assert apply.site_stats()[NODE]["changed"] == 0


def test_docker_certs_d(tl):
    handle, apply, work, reg = tl
    site = write_site(work, "docker", host=reg, ca=str(handle.ca))
    _ok(apply(site))
    assert root(handle, NODE, f"cat /etc/docker/certs.d/{reg}/ca.crt").stdout == handle.ca.read_text()
    _ok(apply(site))
    assert apply.site_stats()[NODE]["changed"] == 0
