"""Real Kubernetes nodes (`gpu-install lab up --kubernetes --kubelet real`): the real kubelet 1.20.2 (from the
scripts/build-kubernetes cache, copied into the node) with the node's own containerd (Debian's 1.6, installed from
the lab repo), CNI bridge + host-local (Debian's containernetworking-plugins, in the node rootfs), cgroupfs as the
cgroup driver of both, joined to the lab control plane with the node's own client certificate
(CN=system:node:<name>, O=system:nodes; Node authorizer + NodeRestriction stay on).

What a kubelet needs inside a systemd-nspawn node, and how the lab gives it (measured; see docs/lab.md):
  * its own cgroups: the node's nspawn joins a cgroup of its own in EVERY v1 controller (nodes.cgroup_create with
    all controllers), so the node's cgroup namespace root is that cgroup and kubepods/ of two nodes never meet;
    nspawn mounts the controllers read-only: the node-prep unit remounts them rw inside the node;
  * oom_score_adj: the kubelet gives every pod sandbox -998, which runc's nsexec may only set with
    CAP_SYS_RESOURCE (`failed to update /proc/self/oom_score_adj: Permission denied` -> `can't get final child's
    PID from pipe: EOF`); this machine's root lacks it in its bounding set, so no node can have it: the node's
    containerd config sets CRI's `restrict_oom_score_adj = true` (containerd's own option for this case);
  * the session keyring: `--system-call-filter=@keyring` on the node (runc joins a new session keyring);
  * CNI: `--capability=CAP_NET_ADMIN` (veth, bridge). Egress denial stays OUTSIDE the node: the node's only link
    is its veth to the bastion bridge, whose host side forwards nothing (net.py); nothing the node does inside its
    namespace (iptables -F, routes) changes that;
  * /dev/kmsg (the kubelet's OOM watcher): a link to /dev/console, as kind does;
  * kernel tunables the kubelet insists on (vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1) are
    host-wide: the lab never changes the host's; node-prep bind-mounts files with the kubelet's values over those
    /proc/sys entries inside the node (a lab shim, only what the kubelet reads);
  * the apiserver: a forwarder of ours listens on 127.0.0.1:6443 inside each node's namespace and connects to the
    apiserver on the host's loopback (as for the hollow nodes);
  * containerd's overlayfs snapshots: /var/lib/containerd is bound from a host directory (an overlay's upper dir
    cannot live on the node's overlay root: `failed to mount rootfs component ... invalid argument`);
  * runc's stdin: containerd runs as a systemd service (stdin /dev/null), never from the node's console.
The node does NOT trust the lab CA (no system trust store entry, no certs.d): its containerd can pull from the lab
registry only after gpu-install's registry_trust role installed the CA (`gpu-install apply`).

`--runtime docker` (one runtime per lab): the node runs dockerd 20.10 (Debian's docker.io from the lab repo, with the
system containerd it brings) and the kubelet uses its built-in dockershim (`--container-runtime=docker
--network-plugin=cni`, the same CNI config and Debian's plugins in /usr/lib/cni, the STAND-IN pause image as
`--pod-infra-container-image`), as sites on CentOS 7 + docker 20.10 run it. On top of the above:
  * daemon.json before gpu-install: no iptables/ip-forward/bridge of docker's own (pods get the CNI bridge),
    `native.cgroupdriver=cgroupfs` as the kubelet's; no certs.d: `apply` (docker_runtime + registry_trust) adds it;
  * docker's overlay2: /var/lib/docker is bound from a host directory (node_dir/docker), as /var/lib/containerd;
  * oom_score_adj: docker has no option like restrict_oom_score_adj, the kubelet has none to change -998, so the
    node gets a LAB SHIM (RUNC_SHIM_SH, /usr/local/sbin/runc, first in the services' PATH, so dockerd's default
    runtime and the nvidia runtime STAND-IN, which both exec `runc`, reach it): it clamps `process.oomScoreAdj` in
    the OCI bundle's config.json to its caller's own value (containerd's option does the same), logs that to
    /run/gpu-install-lab/runc-shim.log, and execs Debian's /usr/sbin/runc with the same arguments. Image pulls,
    daemon.json, the runtimes and certs.d stay docker's own: only the number runc is asked to write changes;
  * runc's stdin: dockerd runs as its systemd service (stdin /dev/null); the keyring, cgroups and CAP_NET_ADMIN
    are the node's as above (tested: pod sandboxes and containers run).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from installer.errors import EnvironmentProblem
from installer.util import atomic_write


def nspawn_args(node_dir: Path, runtime: str = "containerd") -> list[str]:
    """The node's extra systemd-nspawn options. /var/lib/containerd (and with docker /var/lib/docker) is a host
    directory (node_dir/containerd, node_dir/docker): the overlayfs snapshotter (docker's overlay2 driver) cannot put
    an overlay's upper dir on the node's own overlay root."""
    binds = ["containerd", "docker"] if runtime == "docker" else ["containerd"]
    for d in binds:
        (node_dir / d).mkdir(mode=0o700, exist_ok=True)
    return ["--capability=CAP_NET_ADMIN", "--system-call-filter=@keyring",
            *(f"--bind={node_dir / d}:/var/lib/{d}" for d in binds)]

POD_NET = "10.244.{index}.0/24"  # per node, inside the node's own network namespace only
PAUSE_REPO = "gpu-install-lab/pause"  # STAND-IN pause image (busybox sleep), pushed by images.py
PAUSE_TAG = "3.6"
KUBELET_PATH = "/usr/local/bin/kubelet"
APISERVER = "https://127.0.0.1:6443"
# value the kubelet wants -> it leaves the entry alone when it reads this value (setupKernelTunables)
KERNEL_TUNABLES = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1"}

NODE_PREP = """#!/bin/sh
# gpu-install lab: what the real kubelet and containerd need inside a systemd-nspawn node (gpu_install_lab/kubelet.py)
set -eu
# nspawn mounts the cgroup v1 hierarchies read-only
mount -o remount,rw /sys/fs/cgroup
for c in /sys/fs/cgroup/*; do
  [ -d "$c" ] && mountpoint -q "$c" || continue
  mount -o remount,bind,rw "$c" 2>/dev/null || true
done
# the kubelet's OOM watcher reads /dev/kmsg (absent in a container): as kind does
[ -e /dev/kmsg ] || ln -s /dev/console /dev/kmsg
# host-wide kernel tunables: shown with the kubelet's values inside this node only, the host's stay as they are
for f in /etc/gpu-install-lab/sysctl/*; do
  p=/proc/sys/$(basename "$f" | tr . /)
  mountpoint -q "$p" || mount --bind "$f" "$p"
done
# Debian installs the CNI plugins under /usr/lib/cni; containerd looks in /opt/cni/bin
mkdir -p /opt/cni
[ -e /opt/cni/bin ] || ln -s /usr/lib/cni /opt/cni/bin
"""

NODE_PREP_UNIT = """[Unit]
Description=gpu-install lab: prepare the node for the kubelet (cgroups rw, /dev/kmsg, CNI path)
DefaultDependencies=no
After=local-fs.target
Before=containerd.service docker.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/gpu-install-lab-node-prep

[Install]
WantedBy=multi-user.target
"""

KUBELET_UNIT = """[Unit]
Description=kubelet {version} (gpu-install lab real node)
After=gpu-install-lab-node-prep.service {runtime_unit}.service
Wants=gpu-install-lab-node-prep.service

[Service]
ExecStart={kubelet} --config=/var/lib/kubelet/config.yaml --kubeconfig=/etc/kubernetes/kubelet.conf \\
  {runtime_flags} \\
  --runtime-request-timeout=5m --node-ip={ip} --hostname-override={name} \\
  --node-labels=gpu-install.lab/kubelet=real --v=1
Restart=always
RestartSec=1
StandardInput=null

[Install]
WantedBy=multi-user.target
"""


def containerd_config(registry: str) -> str:
    """The node's containerd config before gpu-install runs (a site's nodes have one): the STAND-IN pause
    image from the lab registry, cgroupfs (runc's default, as the kubelet's), CNI plugins where Debian puts them.
    No registry config_path and no CA: `apply` (containerd_runtime + registry_trust roles) adds those."""
    return (
        "# gpu-install lab: the node's containerd config as a site would have it before gpu-install runs\n"
        "version = 2\n\n"
        '[plugins."io.containerd.grpc.v1.cri"]\n'
        f'  sandbox_image = "{registry}/{PAUSE_REPO}:{PAUSE_TAG}"\n'
        "  # this machine has no CAP_SYS_RESOURCE (not even the host root): the kubelet's oom_score_adj -998 for\n"
        "  # pod sandboxes cannot be set; containerd clamps it to its own value instead\n"
        "  restrict_oom_score_adj = true\n\n"
        '[plugins."io.containerd.grpc.v1.cri".cni]\n'
        '  bin_dir = "/usr/lib/cni"\n'
        '  conf_dir = "/etc/cni/net.d"\n\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '  runtime_type = "io.containerd.runc.v2"\n\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "  SystemdCgroup = false\n"
    )


# ------------------------------------------------------------ the node's container runtime (`--runtime`)
RUNTIMES = ("containerd", "docker")
# what `lab status` asks each real node over SSH: the runtime's unit, and its version
RUNTIME_PROBE = {
    "containerd": ("containerd", "containerd --version 2>/dev/null | cut -d' ' -f3"),
    "docker": ("docker", "dockerd --version 2>/dev/null | cut -d' ' -f3 | tr -d ,"),
}
# the Debian package `lab up` installs from the lab repo (docker.io brings containerd, runc and tini)
RUNTIME_DEB = {"containerd": "containerd", "docker": "docker.io"}
# dockerd inside a lab node: no iptables/bridge of its own (the CNI bridge plugin gives pods their network), and
# cgroupfs as the kubelet's cgroupDriver (the kubelet refuses to start when `docker info` says otherwise)
DOCKER_DAEMON_JSON = {"iptables": False, "ip-forward": False, "bridge": "none",
                      "exec-opts": ["native.cgroupdriver=cgroupfs"]}
REAL_RUNC = "/usr/sbin/runc"  # Debian's runc package
RUNC_SHIM = "/usr/local/sbin/runc"  # first in PATH of every systemd service: found before the real one
RUNC_SHIM_LOG = "/run/gpu-install-lab/runc-shim.log"
RUNC_SHIM_SH = r"""#!/bin/sh
# gpu-install lab SHIM (gpu_install_lab/kubelet.py): in lab nodes only, never on a site's node.
# runc may not set a process's oom_score_adj below its own without CAP_SYS_RESOURCE, which no lab node has (the
# host's root lacks it). The kubelet's dockershim asks -998 for every pod sandbox (and Guaranteed containers), and
# docker has no option like containerd's restrict_oom_score_adj; so this does what that option does: it clamps
# process.oomScoreAdj in the OCI bundle to the caller's own value, then runs the real runc with the same arguments.
bundle=
prev=
for a in "$@"; do
  case $prev in --bundle|-b) bundle=$a ;; esac
  case $a in --bundle=*) bundle=${a#--bundle=} ;; esac
  prev=$a
done
cfg=$bundle/config.json
if [ -n "$bundle" ] && [ -f "$cfg" ]; then
  own=$(cat /proc/self/oom_score_adj)
  want=$(sed -n 's/.*"oomScoreAdj"[[:space:]]*:[[:space:]]*\(-\{0,1\}[0-9]\{1,\}\).*/\1/p' "$cfg")
  if [ -n "$want" ] && [ "$want" -lt "$own" ]; then
    sed -i "s/\"oomScoreAdj\"[[:space:]]*:[[:space:]]*$want\([^0-9]\)/\"oomScoreAdj\":$own\1/" "$cfg"
    mkdir -p @LOG_DIR@
    echo "$(date -u +%FT%TZ) $cfg: oomScoreAdj $want -> $own" >> @LOG@
  fi
fi
exec @REAL_RUNC@ "$@"
""".replace("@LOG_DIR@", RUNC_SHIM_LOG.rsplit("/", 1)[0]).replace("@LOG@", RUNC_SHIM_LOG).replace("@REAL_RUNC@", REAL_RUNC)


def kubelet_runtime(runtime: str, registry: str) -> dict[str, str]:
    """The kubelet unit's runtime part: containerd through CRI, or docker through the kubelet's built-in dockershim
    (with the same CNI config and Debian's plugins, and the lab's STAND-IN pause image as the pod infra image)."""
    if runtime == "docker":
        return {"runtime_unit": "docker", "runtime_flags": (
            "--container-runtime=docker --docker-endpoint=unix:///run/docker.sock \\\n"
            "  --network-plugin=cni --cni-bin-dir=/usr/lib/cni --cni-conf-dir=/etc/cni/net.d \\\n"
            f"  --pod-infra-container-image={registry}/{PAUSE_REPO}:{PAUSE_TAG}")}
    if runtime != "containerd":
        raise ValueError(f"unknown node runtime {runtime!r}")
    return {"runtime_unit": "containerd", "runtime_flags": (
        "--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock")}


def install_command(runtime: str) -> str:
    """What `lab up` runs on a real node over SSH: the runtime from the lab repo (idempotent), active."""
    deb, unit = RUNTIME_DEB[runtime], RUNTIME_PROBE[runtime][0]
    binary = "dockerd" if runtime == "docker" else "containerd"
    return (f"command -v {binary} >/dev/null || {{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive "
            "apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confold "
            f"{deb} >/dev/null; }}; systemctl is-active -q {unit} || systemctl restart {unit}")


def docker_node_files(merged: Path) -> None:
    """A docker node before gpu-install runs: daemon.json (kept by the package install: --force-confold; `apply`'s
    docker_runtime role merges into it) and the lab's runc shim. No CA, no certs.d: `apply` adds those."""
    cfg = merged / "etc/docker/daemon.json"
    if not cfg.exists():
        atomic_write(cfg, json.dumps(DOCKER_DAEMON_JSON, indent=2) + "\n")
    atomic_write(merged / RUNC_SHIM.lstrip("/"), RUNC_SHIM_SH, mode=0o755)


def cni_conflist(index: int) -> str:
    return json.dumps({
        "cniVersion": "0.4.0",
        "name": "gpu-install-lab",
        "plugins": [
            # no gateway: the bridge plugin would turn on IPv4 forwarding in the node's namespace (read-only
            # /proc/sys there) and pods would send packets with their 10.244/16 source to the bastion, whose replies
            # follow the host's default route. Pods on one node reach each other on the bridge; nothing else.
            {"type": "bridge", "bridge": "cni0", "isGateway": False, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_NET.format(index=index)}]]}},
            {"type": "loopback"},
        ],
    }, indent=2) + "\n"


def kubelet_config() -> str:
    import yaml

    cfg: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"}},
        "authorization": {"mode": "Webhook"},
        "readOnlyPort": 0,
        "clusterDomain": "cluster.local",
        "resolvConf": "",
        "serializeImagePulls": False,
        # a loaded 2-core CI machine with a nearly full disk must not evict the lab's pods
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusReportFrequency": "10s",
    }
    return "# gpu-install lab real node (gpu_install_lab/kubelet.py)\n" + yaml.safe_dump(cfg, sort_keys=False)


def kubeconfig(ca_pem: str, cert: str, key: str, user: str) -> str:
    import base64

    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "gpu-install-lab", "cluster": {"server": APISERVER, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "gpu-install-lab", "context": {"cluster": "gpu-install-lab", "user": user}}],
        "current-context": "gpu-install-lab",
    }, indent=2) + "\n"


def customise(merged: Path, node: dict[str, Any], kube_pki: Path, kubelet_bin: Path, registry: str,
              runtime: str = "containerd") -> None:
    """Everything the real kubelet needs in the node's overlay, written before the node boots."""
    from gpu_install_lab import pki
    from gpu_install_lab.kube.binaries import KUBE_VERSION

    if not (merged / "usr/lib/cni/bridge").exists() or not (merged / "usr/lib/cni/host-local").exists():
        raise EnvironmentProblem(f"{merged}: no CNI bridge/host-local plugins in the node rootfs",
                                 hint="the debian12 rootfs has Debian's containernetworking-plugins (a dependency "
                                      "of skopeo); rebuild the rootfs cache")
    name = node["name"]
    dest = merged / KUBELET_PATH.lstrip("/")
    if not dest.exists() or dest.stat().st_size != kubelet_bin.stat().st_size:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(".kubelet.tmp")
        shutil.copyfile(kubelet_bin, tmp)
        tmp.chmod(0o755)
        tmp.replace(dest)
    atomic_write(merged / "usr/local/sbin/gpu-install-lab-node-prep", NODE_PREP, mode=0o755)
    for key, value in KERNEL_TUNABLES.items():
        atomic_write(merged / "etc/gpu-install-lab/sysctl" / key.replace("/", "."), value + "\n")
    units = merged / "etc/systemd/system"
    atomic_write(units / "gpu-install-lab-node-prep.service", NODE_PREP_UNIT)
    atomic_write(units / "kubelet.service", KUBELET_UNIT.format(version=KUBE_VERSION, kubelet=KUBELET_PATH,
                                                                ip=node["ip"], name=name,
                                                                **kubelet_runtime(runtime, registry)))
    wants = units / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in ("gpu-install-lab-node-prep.service", "kubelet.service"):
        link = wants / unit
        if not link.is_symlink():
            link.symlink_to(f"/etc/systemd/system/{unit}")
    ca_pem = (kube_pki / "ca.crt").read_text()
    kdir = merged / "etc/kubernetes"
    atomic_write(kdir / "pki" / "ca.crt", ca_pem)
    if not (kdir / "kubelet.conf").exists():
        cert, key = pki.client_cert(kube_pki, f"system:node:{name}", "system:nodes")
        atomic_write(kdir / "kubelet.conf", kubeconfig(ca_pem, cert, key, f"system:node:{name}"), mode=0o600)
    atomic_write(merged / "var/lib/kubelet/config.yaml", kubelet_config())
    atomic_write(merged / "etc/cni/net.d/10-gpu-install-lab.conflist", cni_conflist(node["index"]))
    if runtime == "docker":
        docker_node_files(merged)
        return
    cfg = merged / "etc/containerd/config.toml"
    if not cfg.exists():
        atomic_write(cfg, containerd_config(registry))
