"""`lab up --kubernetes`: the lab's nodes become Ready Kubernetes nodes with GPU capacity."""

from __future__ import annotations

import pytest
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]


def test_lab_nodes_registered_with_gpus(lab_kubernetes):
    from kubernetes import client, config

    inv = yaml.safe_load(lab_kubernetes.inventory.read_text())
    kubeconfig = inv["all"]["children"]["gpu_nodes"]["vars"]["lab_kubeconfig"]
    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    nodes = {n.metadata.name: n for n in api.list_node().items}
    assert set(lab_kubernetes.nodes) <= set(nodes)
    for name, spec in lab_kubernetes.nodes.items():
        node = nodes[name]
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "True", name
        assert node.status.allocatable["nvidia.com/gpu"] == "1"
        assert node.metadata.labels["gpu-install.lab/flavour"] == spec["flavour"]
    assert lab_kubernetes.status["kubernetes"]["kubeconfig"] == kubeconfig
