"""Real kubelet nodes (gpu_install_lab/kubelet.py): the files written into a node and the CLI's checks
(no lab is brought up here; tests/integration/test_lab_real_nodes.py runs them)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from gpu_install_lab import kubelet

GI = str(Path(sys.executable).parent / "gpu-install")


def test_containerd_base_config_has_no_registry_trust():
    cfg = tomllib.loads(kubelet.containerd_config("10.250.0.1:5000"))
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "10.250.0.1:5000/gpu-install-lab/pause:3.6"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False  # cgroupfs, as the kubelet
    assert "registry" not in cri  # config_path and the CA come from `gpu-install apply` only


def test_kubelet_config_cgroupfs_and_no_anonymous_access():
    cfg = yaml.safe_load(kubelet.kubelet_config())
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authentication"]["x509"]["clientCAFile"] == "/etc/kubernetes/pki/ca.crt"
    assert cfg["authorization"]["mode"] == "Webhook"


def test_cni_bridge_without_gateway_per_node_subnet():
    a, b = json.loads(kubelet.cni_conflist(1)), json.loads(kubelet.cni_conflist(2))
    bridge = a["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert bridge["ipam"]["type"] == "host-local" and "routes" not in bridge["ipam"]
    assert bridge["ipam"]["ranges"] != b["plugins"][0]["ipam"]["ranges"]


def test_nspawn_args_keep_egress_outside(tmp_path):
    args = kubelet.nspawn_args(tmp_path)
    assert "--capability=CAP_NET_ADMIN" in args and "--system-call-filter=@keyring" in args
    assert not any("private-network" in a or "--network-veth" in a for a in args)
    assert f"--bind={tmp_path / 'containerd'}:/var/lib/containerd" in args and (tmp_path / "containerd").is_dir()


def test_real_kubelet_needs_kubernetes_and_debian12(tmp_path):
    p = subprocess.run([GI, "lab", "--lab-dir", str(tmp_path), "up", "--kubelet", "real"], capture_output=True, text=True)
    assert p.returncode == 2 and "--kubelet real needs --kubernetes" in p.stderr
    p = subprocess.run([GI, "lab", "--lab-dir", str(tmp_path), "up", "--kubernetes", "--kubelet", "real",
                        "--os", "debian12,rhel9"], capture_output=True, text=True)
    assert p.returncode == 2 and "only debian12 nodes" in p.stderr
    helptext = subprocess.run([GI, "lab", "up", "--help"], capture_output=True, text=True).stdout
    assert "hollow (default)" in helptext
