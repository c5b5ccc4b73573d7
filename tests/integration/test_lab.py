"""The lab for real: SSH + Ansible on every node, systemd, registry push/pull with the lab CA from
a node, apt/dnf installs from the lab repo, egress denied, idempotent up, status and inventory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab
VENV_BIN = Path(sys.executable).parent

# Runs on a node: writes a one-layer OCI image layout (a text file) to /tmp/oci-src, no network.
MAKE_OCI = r'''
import gzip, hashlib, io, json, os, tarfile, time
root = "/tmp/oci-src"; blobs = os.path.join(root, "blobs", "sha256"); os.makedirs(blobs, exist_ok=True)
def put(data):
    d = hashlib.sha256(data).hexdigest(); open(os.path.join(blobs, d), "wb").write(data); return d
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w") as t:
    body = b"gpu-install lab registry test\n"; info = tarfile.TarInfo("hello.txt"); info.size = len(body)
    t.addfile(info, io.BytesIO(body))
diff_id = hashlib.sha256(raw.getvalue()).hexdigest()
layer = gzip.compress(raw.getvalue(), mtime=0)
ld = put(layer)
cfg = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]}}).encode()
cd = put(cfg)
man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + cd, "size": len(cfg)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + ld, "size": len(layer)}]}).encode()
md = put(man)
json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
    "digest": "sha256:" + md, "size": len(man), "annotations": {"org.opencontainers.image.ref.name": "v1"}}]},
    open(os.path.join(root, "index.json"), "w"))
open(os.path.join(root, "oci-layout"), "w").write('{"imageLayoutVersion": "1.0.0"}')
print("sha256:" + ld)
'''


def test_ssh_and_ansible_ping_every_node(lab):
    for name in lab.nodes:
        assert lab.ssh(name, "hostname").stdout.strip() == name
        assert lab.ssh(name, "id -un", user="root").stdout.strip() == "root"
    out = lab.ansible("gpu_nodes", "ansible.builtin.ping").stdout
    for name in lab.nodes:
        assert f"{name} | SUCCESS" in out, out


def test_systemd_is_pid1_and_running(lab):
    for name in lab.nodes:
        # --wait: a freshly booted node may still be "starting"
        state = lab.ssh(name, "systemctl is-system-running --wait", check=False).stdout.strip()
        assert state == "running", f"{name}: {state}\n" + lab.ssh(name, "systemctl --failed --no-legend", check=False).stdout
        assert lab.ssh(name, "cat /proc/1/comm").stdout.strip() == "systemd"
        lab.ssh(name, "sudo systemctl restart ssh.service && systemctl is-active ssh.service")


def test_flavour_facts(lab):
    out = lab.ansible("gpu_nodes", "ansible.builtin.setup",
                      "filter=ansible_os_family,ansible_distribution,ansible_pkg_mgr,ansible_service_mgr").stdout
    facts = {line.split(" | ")[0]: json.loads(line.split(" => ", 1)[1])["ansible_facts"] for line in out.splitlines()
             if " => " in line}
    deb, rhel = lab.node_of("debian12")["name"], lab.node_of("rhel9")["name"]
    assert facts[deb]["ansible_os_family"] == "Debian" and facts[deb]["ansible_pkg_mgr"] == "apt"
    assert facts[rhel]["ansible_os_family"] == "RedHat" and facts[rhel]["ansible_distribution"] == "Rocky"
    assert facts[rhel]["ansible_pkg_mgr"] == "dnf"
    assert all(f["ansible_service_mgr"] == "systemd" for f in facts.values())


def test_registry_push_pull_with_lab_ca_from_node(lab):
    node = lab.node_of("debian12")["name"]
    reg = lab.status["registry"]
    layer = lab.ssh(node, "python3 -", input=MAKE_OCI).stdout.strip()
    # skopeo verifies TLS against the system trust store, which holds the lab CA
    lab.ssh(node, f"skopeo copy --quiet oci:/tmp/oci-src:v1 docker://{reg}/lab/hello:v1")
    info = json.loads(lab.ssh(node, f"skopeo inspect docker://{reg}/lab/hello:v1").stdout)
    assert info["Layers"] == [layer]
    lab.ssh(node, f"rm -rf /tmp/oci-dst && skopeo copy --quiet docker://{reg}/lab/hello:v1 oci:/tmp/oci-dst:v1 "
                  f"&& test -s /tmp/oci-dst/blobs/sha256/{layer.split(':')[1]}")
    # The certificate is really verified: the system store (with the lab CA) passes, a public root fails.
    probe = ("import ssl, sys, urllib.request\n"
             "ctx = ssl.create_default_context(cafile=sys.argv[1])\n"
             "try:\n    urllib.request.urlopen(sys.argv[2], context=ctx, timeout=10); print('verified')\n"
             "except Exception as e:\n    print(type(getattr(e, 'reason', e)).__name__)\n")
    url = f"https://{reg}/v2/"
    ok = lab.ssh(node, f"python3 - /etc/ssl/certs/ca-certificates.crt {url}", input=probe).stdout.strip()
    bad = lab.ssh(node, f"python3 - /usr/share/ca-certificates/mozilla/ISRG_Root_X1.crt {url}", input=probe).stdout.strip()
    assert (ok, bad) == ("verified", "SSLCertVerificationError")


def test_apt_install_from_lab_repo(lab):
    node = lab.node_of("debian12")["name"]
    lab.ansible(node, "ansible.builtin.apt", "name=gpu-install-lab-standin state=present update_cache=true")
    out = lab.ssh(node, "dpkg-query -W -f='${Status} ${Version}' gpu-install-lab-standin").stdout
    assert out == "install ok installed 1.0"
    policy = lab.ssh(node, "apt-cache policy gpu-install-lab-standin").stdout
    assert f"{lab.status['repo_url']}/apt lab/main" in policy


def test_dnf_install_from_lab_repo(lab):
    node = lab.node_of("rhel9")["name"]
    lab.ansible(node, "ansible.builtin.dnf", "name=gpu-install-lab-standin state=present")
    assert lab.ssh(node, "rpm -q gpu-install-lab-standin").stdout.strip() == "gpu-install-lab-standin-1.0-1.noarch"
    assert "gpu-install-lab" in lab.ssh(node, "dnf -q repolist").stdout


EGRESS_PROBE = r'''
import errno, socket, sys
# Addresses outside the lab (TEST-NET-2/3 documentation ranges and a public resolver). With no
# route the kernel fails connect() locally with ENETUNREACH: no packet is sent anywhere.
for addr in ("198.51.100.7", "203.0.113.9", "8.8.8.8"):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((addr, 443)); print("REACHED", addr); sys.exit(1)
    except OSError as e:
        assert e.errno == errno.ENETUNREACH, (addr, e)
s = socket.create_connection((sys.argv[1], 5000), timeout=5); s.close()  # the bastion: reachable
print("ok")
'''


def test_egress_denied(lab):
    bastion = lab.status["bastion_ip"]
    subnet = lab.status["subnet"]
    for name in lab.nodes:
        routes = json.loads(lab.ssh(name, "ip -j -4 route show table all").stdout)
        unicast = [(r["dst"], r["dev"]) for r in routes if r.get("type", "unicast") == "unicast"]
        assert unicast == [(subnet, "eth0")], routes  # no default route, no other network
        assert lab.ssh(name, "ip -6 route show").stdout.strip() == ""
        assert "Network is unreachable" in lab.ssh(name, "ip route get 198.51.100.7", check=False).stderr
        links = [link["ifname"] for link in json.loads(lab.ssh(name, "ip -j link").stdout)]
        assert sorted(links) == ["eth0", "lo"]
        assert lab.ssh(name, f"python3 - {bastion}", input=EGRESS_PROBE).stdout.strip() == "ok"
    # bastion side: packets arriving from the lab are never forwarded, and no IPv6 there
    bridge = lab.lab.state().settings["bridge"]
    assert Path(f"/proc/sys/net/ipv4/conf/{bridge}/forwarding").read_text().strip() == "0"
    assert Path(f"/proc/sys/net/ipv6/conf/{bridge}/disable_ipv6").read_text().strip() == "1"


def test_nodes_reach_each_other_by_name(lab):
    a, b = list(lab.nodes)
    lab.ssh(a, f"python3 -c \"import socket; socket.create_connection(('{b}', 22), timeout=5)\"")


def test_up_is_idempotent(lab):
    before = lab.lab.state().resources
    status = lab.lab.up(count=2, flavours=["debian12", "rhel9"])
    after = lab.lab.state().resources
    assert after == before  # same resources, same pids/start times: nothing restarted or duplicated
    assert all(n["running"] and n["ssh"] for n in status["nodes"])


def test_status_and_inventory_cli(lab):
    gi = [str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(lab.dir)]
    st = subprocess.run([*gi, "status", "--json"], capture_output=True, text=True)
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["registry_running"] and status["repo_running"] and len(status["nodes"]) == 2
    inv = subprocess.run([*gi, "inventory"], capture_output=True, text=True, check=True).stdout
    assert yaml.safe_load(inv)["all"]["children"]["gpu_nodes"]["hosts"]["node2"]["lab_flavour"] == "rhel9"
    parsed = json.loads(subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(lab.inventory), "--list"],
                                       capture_output=True, text=True, check=True).stdout)
    assert set(parsed["lab_rhel9"]["hosts"]) == {lab.node_of("rhel9")["name"]}
    assert set(parsed["gpu_nodes"]["hosts"]) == set(lab.nodes)
    assert set(parsed["lab_debian12"]["hosts"]) == {lab.node_of("debian12")["name"]}


@pytest.mark.helm
def test_helm_from_lab_tools_through_pyhelm3(lab, tmp_path):
    import asyncio

    from pyhelm3 import Client

    helm = lab.dir / "tools" / "helm"
    assert helm.is_file()
    chart = tmp_path / "lab-standin-chart"  # stand-in chart, for this test only
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: lab-standin-chart\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: standin}\ndata: {registry: {{ .Values.registry | quote }}}\n")
    client = Client(executable=str(helm))

    async def template():
        loaded = await client.get_chart(str(chart))
        return list(await client.template_resources(loaded, "standin", {"registry": lab.status["registry"]}))

    resources = asyncio.run(template())
    assert resources[0]["data"]["registry"] == lab.status["registry"]
    # and helm pushes the chart to the lab registry over TLS verified with the lab CA
    subprocess.run([str(helm), "package", str(chart), "-d", str(tmp_path)], check=True, capture_output=True)
    push = subprocess.run([str(helm), "push", str(tmp_path / "lab-standin-chart-0.1.0.tgz"),
                           f"oci://{lab.status['registry']}/charts", "--ca-file", str(lab.ca)],
                          capture_output=True, text=True, env={"HOME": str(tmp_path)})
    assert push.returncode == 0, push.stderr
    assert "Digest: sha256:" in push.stdout + push.stderr
