"""sharing.mode hami on real lab nodes, with HAMi's real chart: ../shared/upstream/charts/hami-2.10.0.tgz (HAMi v2.10.0,
provenance in that directory's README), or GPU_INSTALL_HAMI_CHART (its charts/hami directory or a .tgz). Without
either the module skips, and in CI that is a failure (tests.conftest.need).

What the lab can show: `gpu-install apply` with the sharing stage installs HAMi's chart with gpu-install's values on
the lab API server; the device plugin DaemonSet lands on both GPU nodes (labelled gpu=on), the scheduler Deployment
runs, every image pulled by the nodes' containerd from the site registry, with the arguments the chart gives and
the device config the site sets; nvidia is containerd's default runtime there; uninstall removes it all. The images
are STAND-INs at the mirrored paths (gpu_install_lab/images.py: scripts under HAMi's executable names that print
their arguments and mounts); the webhook certificate Job's STAND-IN writes no Secret, so the test creates the TLS
Secret the real Job would. No GPU: no vGPU capacity appears.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, need
from tests.integration.test_lab_real_nodes import kubectl, real_lab
from tests.integration.test_runtime_roles import _ok, apply_inventory, root
from tests.integration.test_sharing_gpumanager import CHART, _env, _stages

UPSTREAM_HAMI = ROOT.parent / "shared" / "upstream" / "charts" / "hami-2.10.0.tgz"
CHART_HAMI = os.environ.get("GPU_INSTALL_HAMI_CHART") or str(UPSTREAM_HAMI)
pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]
NODES = ("node1", "node2")
NS = "kube-system"


@pytest.fixture(scope="module")
def hm(tmp_path_factory):
    need(Path(CHART_HAMI).exists(), f"HAMi's chart not found at {CHART_HAMI} (../shared/upstream/charts or "
                                    "GPU_INSTALL_HAMI_CHART)")
    yield from real_lab(tmp_path_factory, "hami", len(NODES))


def _site(hm) -> Path:
    h = hm["h"]
    doc = {"operator": {"version": "v23.9.2"}, "registry": {"host": h.status["registry"], "ca": str(h.ca)},
           "runtime": "containerd", "driver": {"mode": "operator", "customImageOs": ["debian12"]},
           "toolkit": {"mode": "host", "version": "1.17.4"}, "components": {"devicePlugin": {"enabled": False}},
           "sharing": {"mode": "hami", "hami": {"kubernetesVersion": "v1.20.2", "chart": CHART_HAMI,
                                                "deviceSplitCount": 4}}}
    path = hm["work"] / "site.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _cli(hm, *args: str) -> subprocess.CompletedProcess:
    from tests.integration.conftest import VENV_BIN

    return subprocess.run([str(VENV_BIN / "gpu-install"), *args], capture_output=True, text=True, env=_env(hm),
                          timeout=900)


def test_hami_on_real_nodes(hm):
    from gpu_install_lab import images
    from installer import kube
    from installer.config import load_site
    from installer.features.hami import FEATURE as sharing
    from tests.conftest import plan_of

    h, work = hm["h"], hm["work"]
    site = _site(hm)
    inv = apply_inventory(h, work)
    kc = h.dir / "kube" / "kubeconfig"
    plan = plan_of(load_site(site), inventory=str(inv))
    for node in NODES:  # the lab's STAND-IN device plugin would advertise the same GPUs (a conflict, exit 3)
        root(h, node, "systemctl stop gpu-install-lab-device-plugin.service")
    client = kube.api_client(kc)
    deadline = time.monotonic() + 60
    while sharing.cluster_conflicts(plan, client, "gpu-operator"):
        assert time.monotonic() < deadline
        time.sleep(1)
    refs = images.push_hami_standins(sharing.destinations(plan.site), h.ca, work)
    reg = h.status["registry"]
    assert refs == {"hami": f"{reg}/projecthami/hami:v2.10.0", "hami.kubeScheduler": f"{reg}/kube-scheduler:v1.20.2",
                    "hami.certgen": f"{reg}/jettech/kube-webhook-certgen:v1.5.2"}
    # what HAMi's certificate Job would have written (its STAND-IN does not): the scheduler mounts it
    kubectl(hm, "-n", NS, "create", "secret", "generic", "hami-scheduler-tls",
            "--from-literal=tls.crt=standin", "--from-literal=tls.key=standin")
    t0 = time.monotonic()
    out = _ok(_cli(hm, "apply", "-s", str(site), "-i", str(inv), "--kubeconfig", str(kc), "--chart", str(CHART),
                   "--no-wait", "--skip-mirror-check", "--skip-validate"))
    print(f"BENCHMARK apply with sharing.mode hami, {len(NODES)} real nodes: {time.monotonic() - t0:.1f}s")
    stages = _stages(out)
    assert stages["sharing"][0] == "changed" and "gpu=on" in stages["sharing"][1], stages
    # not sharing.rollout(): the scheduler's readiness probe is HTTPS /readyz of HAMi's own extender, which the
    # STAND-IN cannot answer -- wait for every container to run instead
    deadline = time.monotonic() + 180
    while True:
        pods = json.loads(kubectl(hm, "-n", NS, "get", "pods", "-o", "json").stdout)["items"]
        ours = [p for p in pods if p["metadata"]["name"].startswith(("hami-device-plugin-", "hami-scheduler-"))]
        running = [p for p in ours if all("running" in (st.get("state") or {})
                                          for st in p["status"].get("containerStatuses") or [{}])]
        if len(ours) == 3 and len(running) == 3:
            break
        assert time.monotonic() < deadline, [
            (p["metadata"]["name"], p["status"].get("phase"), [(st["name"], st.get("state")) for st in
                                                              p["status"].get("containerStatuses") or []],
             [c.get("message") for c in p["status"].get("conditions") or [] if c.get("message")]) for p in pods]
        time.sleep(2)
    dropin = root(h, "node1", "cat /etc/containerd/conf.d/99-nvidia.toml").stdout
    assert 'default_runtime_name = "nvidia"' in dropin, dropin  # HAMi needs nvidia as the default runtime

    pods = json.loads(kubectl(hm, "-n", NS, "get", "pods", "-o", "json").stdout)["items"]
    plugins = {p["spec"]["nodeName"]: p for p in pods if p["metadata"]["name"].startswith("hami-device-plugin-")}
    assert sorted(plugins) == list(NODES)
    for p in plugins.values():
        assert p["spec"]["nodeSelector"] == {"gpu": "on"}
        for st in p["status"]["containerStatuses"]:
            assert st["image"] == refs["hami"] and st["imageID"] and "running" in st["state"], st
        log = kubectl(hm, "-n", NS, "logs", p["metadata"]["name"], "-c", "device-plugin").stdout
        assert f"{images.SHARING_STANDIN_MARK} nvidia-device-plugin: --config-file=/device-config.yaml" in log, log
        assert "mount /var/lib/kubelet/device-plugins" in log and "mount /device-config.yaml" in log, log
    (sched,) = [p for p in pods if p["metadata"]["name"].startswith("hami-scheduler-")]
    got = {st["name"]: st["image"] for st in sched["status"]["containerStatuses"]}
    assert got == {"kube-scheduler": refs["hami.kubeScheduler"], "vgpu-scheduler-extender": refs["hami"]}, got
    log = kubectl(hm, "-n", NS, "logs", sched["metadata"]["name"], "-c", "kube-scheduler").stdout
    assert "kube-scheduler: --scheduler-name=hami-scheduler --policy-config-file=/config/config.json" in log, log
    dev = json.loads(kubectl(hm, "-n", NS, "get", "configmap", "hami-scheduler-device", "-o", "json").stdout)
    assert "deviceSplitCount: 4" in dev["data"]["device-config.yaml"]
    nodes = json.loads(kubectl(hm, "get", "nodes", "-o", "json").stdout)["items"]
    assert all(n["metadata"]["labels"].get("gpu") == "on" for n in nodes)
    stages = _stages(_ok(_cli(hm, "apply", "-s", str(site), "-i", str(inv), "--kubeconfig", str(kc), "--chart",
                              str(CHART), "--no-wait", "--skip-mirror-check", "--skip-validate")))
    assert stages["sharing"][0] == "unchanged", stages

    stages = _stages(_ok(_cli(hm, "uninstall", "-s", str(site), "-i", str(inv), "--yes", "--kubeconfig", str(kc))))
    assert stages["sharing"][0] == "removed" and "Helm release hami in kube-system removed" in stages["sharing"][1]
    nodes = json.loads(kubectl(hm, "get", "nodes", "-o", "json").stdout)["items"]
    assert not any("gpu" in n["metadata"]["labels"] for n in nodes)
