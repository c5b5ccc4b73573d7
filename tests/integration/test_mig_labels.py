"""`gpu-install mig label` against the lab's real kube-apiserver (hollow GPU nodes).

The lab registers its nodes with GFD-style labels (gpu_install_lab/kube/nodes.py node_labels). Here the two nodes are
given the labels GPU Feature Discovery would publish for an A100-SXM4-40GB and an H100-80GB-HBM3 (product,
mig.capable=true) through the API; the original labels are restored afterwards. The real CLI then labels them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]
GPU_INSTALL = Path(sys.executable).parent / "gpu-install"
LABEL = "nvidia.com/mig.config"
GFD = {"node1": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/mig.capable": "true"},
       "node2": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.capable": "true"}}


@pytest.fixture(scope="module")
def k(lab_kubernetes, tmp_path_factory):
    from kubernetes import client, config

    kubeconfig = lab_kubernetes.status["kubernetes"]["kubeconfig"]
    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    saved = {n: dict(api.read_node(n).metadata.labels) for n in GFD}
    for n, labels in GFD.items():
        api.patch_node(n, {"metadata": {"labels": {**labels, LABEL: None}}})
    work = tmp_path_factory.mktemp("mig")
    site = work / "site.yaml"
    site.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                                    "mig": {"strategy": "mixed", "config": "all-1g.10gb"},
                                    "driver": {"customImageOs": LAB_DRIVER_OS}}))
    try:
        yield {"api": api, "kubeconfig": kubeconfig, "site": site, "work": work, "lab": lab_kubernetes}
    finally:
        for n, labels in saved.items():
            now = api.read_node(n).metadata.labels
            api.patch_node(n, {"metadata": {"labels": {**{key: None for key in now if key not in labels}, **labels}}})


def inventory(k, name: str, hosts: dict[str, dict]) -> Path:
    """The lab inventory plus per-host variables (a directory: later files win)."""
    inv = k["work"] / name
    inv.mkdir(exist_ok=True)
    (inv / "hosts.yml").write_text(k["lab"].inventory.read_text())
    (inv / "zz-mig.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    return inv


def gi(k, inv: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPU_INSTALL), "mig", "label", "-s", str(k["site"]), "-i", str(inv),
                           "--kubeconfig", k["kubeconfig"], *extra], capture_output=True, text=True, timeout=120)


def labels(k) -> dict[str, str | None]:
    return {n: (k["api"].read_node(n).metadata.labels or {}).get(LABEL) for n in GFD}


def test_site_default_and_host_override_then_unchanged(k):
    inv = inventory(k, "ok", {"node1": {}, "node2": {"gpu_install_mig_config": "all-3g.40gb"}})
    dry = gi(k, inv, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "2 nodes, 2 would change" in dry.stdout and labels(k) == {"node1": None, "node2": None}
    proc = gi(k, inv)
    assert proc.returncode == 0, proc.stderr
    assert labels(k) == {"node1": "all-1g.10gb", "node2": "all-3g.40gb"}
    assert "node1: nvidia.com/mig.config=all-1g.10gb (site mig.config; NVIDIA-A100-SXM4-40GB) set" in proc.stderr
    assert ("node2: nvidia.com/mig.config=all-3g.40gb (inventory gpu_install_mig_config; NVIDIA-H100-80GB-HBM3) set"
            in proc.stderr)
    assert "mig label: 2 nodes, 2 changed" in proc.stdout
    # the GFD labels are untouched (a merge patch of one label)
    node = k["api"].read_node("node1").metadata.labels
    assert node["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB" and node["gpu-install.lab/hollow-node"] == "true"
    again = gi(k, inv)
    assert again.returncode == 0 and "mig label: 2 nodes, 0 changed" in again.stdout
    assert again.stderr.count(" unchanged") == 2


def test_config_that_does_not_fit_a_gpu_labels_nothing(k):
    before = labels(k)
    assert before["node2"] == "all-3g.40gb"
    # node2's new layout is fine for an H100, node1's is an 80GB profile its A100-40GB does not have
    inv = inventory(k, "bad", {"node1": {"gpu_install_mig_config": "all-3g.40gb"},
                               "node2": {"gpu_install_mig_config": "all-7g.80gb"}})
    proc = gi(k, inv)
    assert proc.returncode == 2, proc.stderr
    assert ("node node1: all-3g.40gb (inventory gpu_install_mig_config) does not apply to its GPU "
            "NVIDIA-A100-SXM4-40GB (A100-40GB)") in proc.stderr
    assert "nothing was labelled" in proc.stderr
    assert labels(k) == before  # node2 was not relabelled either


def test_unknown_name_and_unknown_node_are_config_errors(k):
    before = labels(k)
    proc = gi(k, inventory(k, "typo", {"node1": {"gpu_install_mig_config": "all-1g.5gbb"}, "node2": {}}))
    assert proc.returncode == 2 and "host node1: gpu_install_mig_config: all-1g.5gbb is not in GPU Operator " \
        "v24.9.2's default MIG configs; nearest: all-1g.5gb" in proc.stderr, proc.stderr
    proc = gi(k, inventory(k, "named", {"node1": {"gpu_install_node_name": "gpu-node-7"}, "node2": {}}))
    assert proc.returncode == 2 and "not in the cluster: node gpu-node-7 (inventory host node1)" in proc.stderr
    assert labels(k) == before


def test_mig_capable_false_only_all_disabled(k):
    k["api"].patch_node("node2", {"metadata": {"labels": {"nvidia.com/mig.capable": "false",
                                                          "nvidia.com/gpu.product": "Tesla-T4"}}})
    try:
        proc = gi(k, inventory(k, "t4", {"node1": {}, "node2": {}}))
        assert proc.returncode == 2
        assert "node node2: all-1g.10gb (site mig.config) but the node reports nvidia.com/mig.capable=false " \
               "(Tesla-T4); only all-disabled applies" in proc.stderr, proc.stderr
        proc = gi(k, inventory(k, "t4-off", {"node1": {}, "node2": {"gpu_install_mig_config": "all-disabled"}}))
        assert proc.returncode == 0, proc.stderr
        assert labels(k)["node2"] == "all-disabled"
    finally:
        k["api"].patch_node("node2", {"metadata": {"labels": GFD["node2"]}})
