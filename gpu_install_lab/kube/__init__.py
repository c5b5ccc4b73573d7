"""The lab's Kubernetes control plane: etcd + kube-apiserver + kube-scheduler +
kube-controller-manager on 127.0.0.1, and one kubemark hollow kubelet per lab node.

Binaries: kubernetes 1.20.2 built from Debian's `kubernetes` source package by
scripts/build-kubernetes into <cache>/kubernetes/1.20.2/bin (built once, then cached);
etcd 3.4 is Debian's etcd-server. kube-scheduler runs as a kubeadm-like static pod
(<lab_dir>/kube/manifests/kube-scheduler.yaml) under the lab's kubelet stand-in
(gpu_install_lab/staticpods.py, process "kubelet-standin"), so that gpu-install's scheduler_policy role
edits a real static-pod manifest; the stand-in's pods are stopped by recorded identity too.

Nodes are kubemark hollow kubelets (`kubemark --morph=kubelet`): the real kubelet code with a fake
container runtime. They register a Node, renew its lease, report status, admit pods and report
them Running -- but they run no containers. GPU capacity (nvidia.com/gpu, nvidia.com/mig-*) is
patched onto the Node status (the kubelet keeps extended resources it does not manage) and
GFD-style labels onto its metadata, so the scheduler places GPU pods exactly as in a real cluster.

Network (the lab's rule: traffic only on loopback or inside namespaces the lab creates):
  * every control-plane component listens on 127.0.0.1 only (free ports, chosen at first `up`);
  * the hollow kubelets live in one network namespace of ours (`gik-<hash>`) that has nothing but
    `lo`, carrying 127.0.0.1 and one fake address per node from 198.51.100.0/24 (TEST-NET-2,
    never routed). A small forwarder of ours accepts on 127.0.0.1:6443 inside that namespace and
    connects to the apiserver on the host's loopback. Each kubelet also gets a private mount
    namespace: its own /tmp (kubemark's fixed fake-runtime socket), /var/log, /etc/hosts (its name
    -> its fake IP, so no DNS query is ever sent) and /etc/resolv.conf (nameserver 127.0.0.1);
  * the apiserver's "cluster" egress (kubelet logs/exec/port-forward, proxies, webhooks to
    services) goes through an egress selector whose proxy is a Unix socket nobody listens on, so
    the apiserver never opens a connection to a node's (fake) IP: such requests fail at once.

State: everything lives under <lab_dir>/kube (CA and certs, the static token file of the admin,
scheduler and controller-manager, kubeconfigs, etcd data, logs, state.json); kubelets authenticate
with client certificates (CN=system:node:<name>, O=system:nodes) signed by the control plane's CA
(gpu_install_lab/pki.py). Each process is recorded with its identity (gpu_install_lab/proc.py: pid +
start time + boot id) right after it is started, the network namespace before it is created; down()
stops only processes whose identity still matches, deletes the namespace and removes the directory.

Modules:
  binaries.py      the Kubernetes 1.20.2 build (scripts/build-kubernetes) and Debian's etcd
  state.py         <lab_dir>/kube/state.json: ports, recorded processes, tokens, kubeconfigs
  controlplane.py  ControlPlane: etcd, apiserver, controller-manager, the scheduler static pod; up/down/status
  nodes.py         hollow nodes: their namespace, registration, GFD-style labels, GPU capacity
  forward.py       the apiserver forwarder into the hollow nodes' namespace
  __main__.py      manual use

Manual use:  python -m gpu_install_lab.kube up|down|status [--lab-dir DIR] [--nodes N]
"""

from gpu_install_lab.kube.binaries import BINARIES, KUBE_VERSION, bin_dir, ensure_binaries, etcd_binary, find_binaries
from gpu_install_lab.kube.controlplane import COMPONENTS, SCHEDULER_IMAGE, STANDIN, ControlPlane, scheduler_manifest
from gpu_install_lab.kube.nodes import FAKE_NODE_NET, node_labels, node_resources

__all__ = [
    "BINARIES", "COMPONENTS", "FAKE_NODE_NET", "KUBE_VERSION", "SCHEDULER_IMAGE", "STANDIN", "ControlPlane",
    "bin_dir", "ensure_binaries", "etcd_binary", "find_binaries", "node_labels", "node_resources",
    "scheduler_manifest",
]
