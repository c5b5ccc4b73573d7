"""The control plane's nodes: kubemark hollow kubelets in a network namespace of their own, registered
with GFD-style labels and GPU capacity (nvidia.com/gpu, nvidia.com/mig-*) on their Node objects."""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_install_lab import pki
from gpu_install_lab.kube.state import PYTHONPATH, ControlPlaneState
from installer.errors import ConfigError, EnvironmentProblem
from installer.util import atomic_write

if TYPE_CHECKING:
    from kubernetes import client

FAKE_NODE_NET = ipaddress.ip_network("198.51.100.0/24")  # TEST-NET-2 (RFC 5737): never routed
FAKE_NODE_FIRST = 10
NETNS_APISERVER_PORT = 6443  # where the forwarder listens inside the nodes' namespace
KUBELET_PORT_BASE = 10250  # inside the nodes' namespace (ours alone), one port per node
DEFAULT_GPU_PRODUCT = "NVIDIA-A100-SXM4-40GB"


_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)\Z")
_DNS_SUB = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_MIG_COUNT = re.compile(r"^nvidia\.com/(mig-[0-9a-z.+-]+)\.count\Z")


def _check_label(key: str, value: str, where: str) -> None:
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not _DNS_SUB.match(prefix))) or not _LABEL_NAME.match(name):
        raise ConfigError(f"{where}: invalid label key {key!r}", hint="use [prefix/]name, name <= 63 chars")
    if value and not _LABEL_NAME.match(value):
        raise ConfigError(
            f"{where}: invalid value {value!r} for label {key!r}",
            hint="label values are <= 63 chars of [A-Za-z0-9-_.], starting and ending alphanumeric",
        )


def node_labels(node: dict[str, Any]) -> dict[str, str]:
    """GFD-style labels for a lab node (caller's labels win over the defaults)."""
    gpus = int(node.get("gpus") or 0)
    labels: dict[str, str] = {"gpu-install.lab/hollow-node": "true"}
    if gpus > 0:
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.product": DEFAULT_GPU_PRODUCT,
                "nvidia.com/gpu.memory": "40960",
                "nvidia.com/gpu.family": "ampere",
                "nvidia.com/gpu.compute.major": "8",
                "nvidia.com/gpu.compute.minor": "0",
                "nvidia.com/gpu.machine": "lab-hollow-node",
                "nvidia.com/cuda.driver.major": "535",
                "nvidia.com/cuda.driver.minor": "216",
                "nvidia.com/cuda.driver.rev": "03",
                "nvidia.com/cuda.runtime.major": "12",
                "nvidia.com/cuda.runtime.minor": "2",
                "nvidia.com/mig.capable": "false",
                "nvidia.com/gfd.timestamp": str(int(time.time())),
            }
        )
    given = node.get("labels") or {}
    if gpus > 0 and any(_MIG_COUNT.match(str(k)) for k in given):
        labels["nvidia.com/mig.capable"] = "true"
    for k, v in given.items():
        labels[str(k)] = "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
    for k, v in labels.items():
        _check_label(k, v, f"node {node.get('name')!r}")
    return labels


def node_resources(node: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """Extended resources: nvidia.com/gpu from "gpus", nvidia.com/mig-<profile> from GFD mixed-strategy
    labels `nvidia.com/mig-<profile>.count` and from an optional "extra"/"resources" mapping."""
    res: dict[str, str] = {}
    gpus = int(node.get("gpus") or 0)
    if gpus < 0:
        raise ConfigError(f"node {node.get('name')!r}: gpus must be >= 0, got {gpus}")
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
    for k, v in labels.items():
        m = _MIG_COUNT.match(k)
        if m:
            res[f"nvidia.com/{m.group(1)}"] = str(int(v))
    for key in ("extra", "resources"):
        for k, v in (node.get(key) or {}).items():
            if "/" not in k or k.startswith("kubernetes.io/") or not _DNS_SUB.match(k.split("/")[0]):
                raise ConfigError(
                    f"node {node.get('name')!r}: {k!r} is not an extended resource name",
                    hint="use a domain-prefixed name such as nvidia.com/mig-1g.5gb",
                )
            res[str(k)] = str(int(v))
    return res


class HollowNodes(ControlPlaneState):
    """The nodes part of ControlPlane (its base): register_nodes() and what it needs."""

    def _ensure_netns(self) -> None:
        """The hollow kubelets' network namespace (only `lo`), and our forwarder into it."""
        ns = self.netns
        if not Path(f"/run/netns/{ns}").exists():
            self.state["netns"] = ns  # recorded before it exists
            self._save()
            self._ip("netns", "add", ns)
        elif self.state.get("netns") != ns:
            raise EnvironmentProblem(
                f"network namespace {ns} exists but is not recorded in {self.state_path}",
                hint=f"it is left from another run of this lab dir; remove it with `ip netns del {ns}`",
            )
        self._ip("-n", ns, "link", "set", "lo", "up")
        if not self._running("apiserver-forwarder"):
            self._spawn(
                "apiserver-forwarder",
                [
                    sys.executable,
                    "-m",
                    "gpu_install_lab.kube",
                    "_forward",
                    f"/run/netns/{ns}",
                    str(NETNS_APISERVER_PORT),
                    str(self.state["ports"]["kube-apiserver"]),
                ],
                env=dict(os.environ, PYTHONPATH=PYTHONPATH),
            )

            def listening() -> bool:
                out = self._ip_out("netns", "exec", ns, "cat", "/proc/net/tcp")
                return f":{NETNS_APISERVER_PORT:04X} 00000000:0000 0A" in out

            self._wait("the apiserver forwarder", listening, 20, "apiserver-forwarder")

    def _ip(self, *args: str) -> None:
        res = subprocess.run(["ip", *args], capture_output=True, text=True)
        if res.returncode != 0:
            raise EnvironmentProblem(f"`ip {' '.join(args)}` failed: {res.stderr.strip()}")

    def _ip_out(self, *args: str) -> str:
        return subprocess.run(["ip", *args], capture_output=True, text=True).stdout

    def _api(self) -> client.CoreV1Api:
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))

    def register_nodes(self, nodes: list[dict[str, Any]]) -> None:
        """Start a hollow kubelet per node (if not running), then label it GFD-style and give it
        its GPU capacity; wait until every node is Ready with that capacity. Idempotent, additive."""
        if not self.kubeconfig.exists() or not self._running("kube-apiserver"):
            raise EnvironmentProblem("the lab control plane is not up", hint="call ControlPlane.up() first")
        specs = []
        for node in nodes:
            name = str(node.get("name", ""))
            if not _DNS_SUB.match(name) or len(name) > 63:
                raise ConfigError(f"node name {name!r} is not a valid Kubernetes node name",
                                  hint="lowercase letters, digits, '-' and '.'")
            labels = node_labels(node)
            specs.append((name, node, labels, node_resources(node, labels)))
        bins = Path(self.state["bin_dir"])
        self._ensure_netns()
        ns = self.netns
        for name, node, _labels, _ in specs:
            rec = self.state["nodes"].get(name)
            if rec is None:
                index = len(self.state["nodes"])
                if FAKE_NODE_FIRST + index >= FAKE_NODE_NET.num_addresses - 1:
                    raise ConfigError(f"too many lab nodes ({index + 1}): the fake node network "
                                      f"{FAKE_NODE_NET} holds {FAKE_NODE_NET.num_addresses - 1 - FAKE_NODE_FIRST}")
                rec = {
                    "index": index,
                    "fake_ip": str(FAKE_NODE_NET[FAKE_NODE_FIRST + index]),
                    "kubelet_port": KUBELET_PORT_BASE + 2 * index,
                }
                self.state["nodes"][name] = rec
            rec["spec"] = {k: v for k, v in node.items() if k in ("name", "ip", "gpus", "labels", "extra", "resources")}
            self._save()
        for name, node, _labels, _ in specs:
            rec = self.state["nodes"][name]
            if self._running(f"node-{name}"):
                continue
            ndir = self.dir / "nodes" / name
            for sub in ("tmp", "log"):
                (ndir / sub).mkdir(parents=True, exist_ok=True)
            atomic_write(ndir / "hosts", f"127.0.0.1\tlocalhost\n{rec['fake_ip']}\t{name}\n")
            atomic_write(ndir / "resolv.conf", "# lab hollow node: no DNS\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
            cert, key = pki.client_cert(self.dir / "pki", f"system:node:{name}", "system:nodes")
            self._write_kubeconfig(ndir / "kubeconfig", f"https://127.0.0.1:{NETNS_APISERVER_PORT}",
                                   f"system:node:{name}", cert=cert, key=key)
            if rec["fake_ip"] + "/32" not in self._ip_out("-n", ns, "-4", "addr", "show", "dev", "lo"):
                self._ip("-n", ns, "addr", "add", rec["fake_ip"] + "/32", "dev", "lo")
            self.progress(f"kube: starting hollow kubelet {name} (fake IP {rec['fake_ip']}, {node.get('gpus', 0)} GPUs)")
            (ndir / "bin").mkdir(exist_ok=True)
            # Private mounts. Work relative to the node dir (the cwd keeps it reachable even when the
            # lab dir lives under /tmp), bind the binaries in, and shadow /tmp last.
            script = (
                'set -e; cd "$1"; mount --bind "$2" ./bin; shift 2; '
                "mount --bind ./log /var/log; mount --bind ./hosts /etc/hosts; "
                "mount --bind ./resolv.conf /etc/resolv.conf; mount --bind ./tmp /tmp; "
                'exec ./bin/kubemark "$@"'
            )
            self._spawn(
                f"node-{name}",
                [
                    "nsenter", f"--net=/run/netns/{ns}", "--",
                    "unshare", "--mount", "--propagation", "private", "--",
                    "sh", "-c", script, "sh", str(ndir), str(bins),
                    "--morph=kubelet",
                    f"--name={name}",
                    "--kubeconfig=./kubeconfig",
                    f"--kubelet-port={rec['kubelet_port']}",
                    "--kubelet-read-only-port=0",
                    "--kube-api-content-type=application/vnd.kubernetes.protobuf",
                ],
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": "/tmp", "HOME": "/tmp"},
            )
        api = self._api()
        deadline = time.monotonic() + 120
        for name, node, labels, resources in specs:
            rec = self.state["nodes"][name]
            self._wait(f"node {name} to register", functools.partial(self._node_exists, api, name), max(5, deadline - time.monotonic()), f"node-{name}")
            annotations = {
                "gpu-install.lab/node-ip": str(node.get("ip", "")),
                "gpu-install.lab/hollow": "kubemark hollow kubelet: runs no containers; its IP is fake",
            }
            current = api.read_node(name)
            # re-registration with other GPUs: drop nvidia.com/* labels and resources no longer wanted
            stale = {k: None for k in ((current.metadata and current.metadata.labels) or {}) if k.startswith("nvidia.com/") and k not in labels}
            api.patch_node(name, {"metadata": {"labels": {**labels, **stale}, "annotations": annotations}})
            gone = [k for k in ((current.status and current.status.capacity) or {}) if k.startswith("nvidia.com/") and k not in resources]
            if gone:
                api.patch_node_status(name, {"status": {"capacity": {k: None for k in gone},
                                                        "allocatable": {k: None for k in gone}}})
            self._patch_capacity(api, name, resources)
        for name, _node, _labels, resources in specs:
            self._wait(
                f"node {name} Ready with its GPU capacity",
                functools.partial(self._node_ready, api, name, resources),
                max(5, deadline - time.monotonic()),
                f"node-{name}",
            )
        self.progress(f"kube: {len(specs)} node(s) Ready: {', '.join(s[0] for s in specs)}")

    @staticmethod
    def _node_exists(api: client.CoreV1Api, name: str) -> bool:
        api.read_node(name)
        return True

    @staticmethod
    def _patch_capacity(api: client.CoreV1Api, name: str, resources: dict[str, str]) -> None:
        if not resources:
            return
        body = {"status": {"capacity": dict(resources), "allocatable": dict(resources)}}
        api.patch_node_status(name, body)

    @staticmethod
    def _node_ready(api: client.CoreV1Api, name: str, resources: dict[str, str]) -> bool:
        node = api.read_node(name)
        status, spec = node.status, node.spec
        if status is None or spec is None:  # not reported by the kubelet yet
            return False
        ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
        alloc = status.allocatable or {}
        if any(str(alloc.get(k)) != v for k, v in resources.items()):
            # A kubelet restart zeroes extended resources it does not manage: put them back.
            HollowNodes._patch_capacity(api, name, resources)
            return False
        taints = [t.key for t in spec.taints or []]
        return ready and "node.kubernetes.io/not-ready" not in taints and not spec.unschedulable
