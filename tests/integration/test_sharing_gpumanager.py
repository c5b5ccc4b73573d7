"""sharing.mode gpumanager on real lab nodes (`lab up --kubernetes --kubelet real`, 2 debian12 nodes).

What the lab can show without GPUs: the conflict preflights refuse the bad combinations with exit 3 and change
nothing; the cluster check sees GPUs already advertised by the lab's STAND-IN device plugin (a systemd unit, no pod);
then the sharing stage installs charts/gpu-manager: the objects apply to the real API server, gpu-manager lands on
the labelled nodes and gpu-quota-admission on one, both pulled from the site registry by the nodes' containerd, with
the environment and host mounts gpu-install renders. The images are STAND-INs at the pinned paths
(gpu_install_lab/images.py: busybox printing what it got); no GPU code runs and no vGPU capacity appears. The
extender's behaviour in kube-scheduler is tested in test_scheduler_policy.py. Tests run in file order.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.integration.conftest import VENV_BIN
from tests.integration.test_lab_real_nodes import kubectl, real_lab
from tests.integration.test_runtime_roles import Applier, _ok, apply_inventory, root

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]
NODES = ("node1", "node2")
NS = "kube-system"
CHART = ROOT / "tests" / "fixtures" / "charts" / "gpu-operator-fixture"  # STAND-IN operator chart
MOUNTS = ("/var/lib/kubelet/device-plugins", "/etc/gpu-manager/vdriver", "/etc/gpu-manager/vm",
          "/etc/gpu-manager/checkpoint", "/var/log/gpu-manager", "/var/run", "/sys/fs/cgroup", "/usr/local/host")


@pytest.fixture(scope="module")
def gm(tmp_path_factory):
    yield from real_lab(tmp_path_factory, "gm", len(NODES))


def _site(gm, **extra) -> Path:
    h, work = gm["h"], gm["work"]
    # v23.9.2: the newest line the lab's Kubernetes 1.20 runs (v24.3-v25.10 need 1.24)
    doc = {"operator": {"version": "v23.9.2"},
           "registry": {"host": h.status["registry"], "ca": str(h.ca)}, "runtime": "containerd",
           "driver": {"mode": "operator", "customImageOs": ["debian12"]},
           "sharing": {"mode": "gpumanager"}, **extra}
    path = work / "site.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# what gpumanager needs: no operator device plugin; the toolkit from the roles, runc staying the default runtime
GOOD = {"toolkit": {"mode": "host", "version": "1.17.4"},  # the lab repo's STAND-IN toolkit chain
        "components": {"devicePlugin": {"enabled": False}}}


def _env(gm) -> dict[str, str]:
    state = gm["work"] / "state"
    return {**os.environ, "GPU_INSTALL_STATE": str(state), "ANSIBLE_LOCAL_TEMP": str(state / "tmp")}


def apply_cli(gm, site: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "gpu-install"), "apply", "-s", str(site), "-i",
                           str(apply_inventory(gm["h"], gm["work"])), "--chart", str(CHART), "--no-wait",
                           "--skip-mirror-check", "--skip-validate", *extra],
                          capture_output=True, text=True, env=_env(gm), timeout=900)


def _stages(out: str) -> dict[str, tuple[str, str]]:
    """The stage table apply/uninstall print: stage -> (outcome, detail)."""
    rows = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if parts and parts[0] in ("preflight", "nodes", "operator", "sharing", "mig", "validate", "packages"):
            rows[parts[0]] = (parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else "")
    return rows


def _plan(gm, site):
    from installer.config import load_site
    from tests.conftest import plan_of

    return plan_of(load_site(site), inventory=str(apply_inventory(gm["h"], gm["work"])))


def _client(gm):
    from installer import kube

    return kube.api_client(gm["h"].dir / "kube" / "kubeconfig")


def test_site_conflicts_are_refused_with_exit_3_before_any_host(gm):
    h, work = gm["h"], gm["work"]
    site = _site(gm, devicePlugin={"timeSlicing": {"replicas": 4}})  # the operator's toolkit and device plugin: on
    apply = Applier(apply_inventory(h, work), work / "state-conflict")
    proc = apply(site)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr
    assert "sharing.mode gpumanager conflicts with the site" in err, err
    assert "components.devicePlugin.enabled: false" in err and "toolkit.mode operator" in err, err
    assert "devicePlugin.timeSlicing.replicas 4" in err, err
    assert "nothing was changed on any host" in err, err
    assert not (work / "state-conflict" / "runs").exists() or not list((work / "state-conflict" / "runs").iterdir())
    assert root(h, "node1", "test -e /etc/containerd/certs.d", check=False).returncode != 0


def test_cluster_conflict_names_the_nodes_advertising_gpus(gm):
    from installer import features
    from installer.errors import PreflightError
    from installer.features.gpumanager import FEATURE as sharing

    plan = _plan(gm, _site(gm, **GOOD))
    assert features.conflicts(plan) == []
    client = _client(gm)
    with pytest.raises(PreflightError) as exc:
        sharing.check_cluster(plan, client, print)
    msg = exc.value.message
    assert exc.value.exit_code == 3
    for node in NODES:  # the lab's STAND-IN device plugin is a systemd unit: no pod of it on the node
        assert f"node {node} already advertises 1 nvidia.com/gpu, by a device plugin outside Kubernetes" in msg, msg
    for node in NODES:
        root(gm["h"], node, "systemctl stop gpu-install-lab-device-plugin.service")
    deadline = time.monotonic() + 60
    while (left := sharing.cluster_conflicts(plan, client, "gpu-operator")):
        assert time.monotonic() < deadline, left
        time.sleep(1)


def test_gpumanager_runs_on_the_labelled_real_nodes(gm):
    from gpu_install_lab import images
    from installer.features.gpumanager import FEATURE as sharing

    h, work = gm["h"], gm["work"]
    site = _site(gm, **GOOD)
    plan = _plan(gm, site)
    refs = sharing.destinations(plan.site)
    reg = h.status["registry"]
    assert refs == {"gpuManager": f"{reg}/tkestack/gpu-manager:v1.1.5",
                    "gpuQuotaAdmission": f"{reg}/tkestack/gpu-quota-admission:v1.0.0"}
    images.push_sharing_standins(refs, h.ca, work)
    kc = h.dir / "kube" / "kubeconfig"
    # the whole apply: preflight (site + cluster conflicts, node cgroup check), nodes, operator (the STAND-IN fixture
    # chart, not waited for: its images are not in the lab registry), sharing, no validate (no vGPU capacity here)
    t0 = time.monotonic()
    out = _ok(apply_cli(gm, site, "--kubeconfig", str(kc)))
    print(f"BENCHMARK apply with sharing.mode gpumanager, {len(NODES)} real nodes: {time.monotonic() - t0:.1f}s")
    stages = _stages(out)
    assert stages["sharing"][0] == "changed" and "node1, node2" in stages["sharing"][1], stages
    # the toolkit's runtime is there, but runc stays containerd's default (gpu-manager's isolation needs it)
    dropin = root(h, "node1", "cat /etc/containerd/conf.d/99-nvidia.toml").stdout
    assert "runtimes.nvidia" in dropin and "default_runtime_name" not in dropin, dropin
    sharing.rollout(_client(gm), plan.site, list(NODES), timeout=180, progress=print)
    nodes = json.loads(kubectl(gm, "get", "nodes", "-o", "json").stdout)["items"]
    assert all(n["metadata"]["labels"].get("nvidia-device-enable") == "enable" for n in nodes)

    pods = json.loads(kubectl(gm, "-n", NS, "get", "pods", "-l", "app.kubernetes.io/part-of=gpu-install-sharing",
                              "-o", "json").stdout)["items"]
    managers = {p["spec"]["nodeName"]: p for p in pods if p["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-manager"}
    assert sorted(managers) == list(NODES), list(managers)
    for node, p in managers.items():
        assert p["status"]["phase"] == "Running", p["status"]
        spec = p["spec"]
        assert spec["hostPID"] is True and spec["containers"][0]["securityContext"]["privileged"] is True
        st = p["status"]["containerStatuses"][0]
        assert st["image"] == refs["gpuManager"] and st["imageID"], st  # pulled by the node from the site registry
        log = kubectl(gm, "-n", NS, "logs", p["metadata"]["name"]).stdout
        assert images.SHARING_STANDIN_MARK in log, log
        assert ("EXTRA_FLAGS=--logtostderr=true --container-runtime-endpoint=/var/run/containerd/containerd.sock "
                "--cgroup-driver=cgroupfs") in log, log
        assert f"NODE_NAME={node}" in log and "LOG_LEVEL=4" in log, log
        mounted = {line.split(" ", 1)[1] for line in log.splitlines() if line.startswith("mount ")}
        assert set(MOUNTS) <= mounted, sorted(mounted)
        # DirectoryOrCreate: the kubelet made gpu-manager's state and log directories on the node
        assert root(h, node, "test -d /etc/gpu-manager/vm && test -d /var/log/gpu-manager", check=False).returncode == 0
    (adm,) = [p for p in pods if p["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-quota-admission"]
    assert adm["status"]["phase"] == "Running" and adm["spec"]["nodeName"] in NODES
    assert adm["status"]["containerStatuses"][0]["image"] == refs["gpuQuotaAdmission"]
    log = kubectl(gm, "-n", NS, "logs", adm["metadata"]["name"]).stdout
    assert "EXTRA_FLAGS=--incluster-mode=true --logtostderr --config=/etc/kubernetes/gpu-quota-admission.config" in log
    config = json.loads(log.split("config ", 1)[1].splitlines()[0])
    assert config == {"QuotaConfigMapName": "gpuquota", "QuotaConfigMapNamespace": "kube-system",
                      "GPUModelLabel": "gaia.tencent.com/gpu-model", "GPUPoolLabel": "gaia.tencent.com/gpu-pool"}
    svc = json.loads(kubectl(gm, "-n", NS, "get", "service", "gpu-quota-admission", "-o", "json").stdout)
    assert [p["port"] for p in svc["spec"]["ports"]] == [3456]
    # a second run changes nothing
    stages = _stages(_ok(apply_cli(gm, site, "--kubeconfig", str(kc))))
    assert stages["sharing"][0] == "unchanged" and stages["nodes"][0] == "unchanged", stages
    again = sharing.install(plan, kc, timeout=120)
    assert not again.changed and again.labelled == [], again
    changed, what = sharing.preview(plan, kc)
    assert not changed, what


def test_uninstall_removes_release_and_labels(gm):
    from installer.features.gpumanager import FEATURE as sharing

    site = _site(gm, **GOOD)
    plan = _plan(gm, site)
    kc = gm["h"].dir / "kube" / "kubeconfig"
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "uninstall", "-s", str(site), "-i",
                           str(apply_inventory(gm["h"], gm["work"])), "--yes", "--kubeconfig", str(kc)],
                          capture_output=True, text=True, env=_env(gm), timeout=900)
    stages = _stages(_ok(proc))
    assert stages["sharing"][0] == "removed", stages
    assert "Helm release gpu-manager in kube-system removed" in stages["sharing"][1], stages
    assert "label nvidia-device-enable removed from node1, node2" in stages["sharing"][1], stages
    nodes = json.loads(kubectl(gm, "get", "nodes", "-o", "json").stdout)["items"]
    assert not any("nvidia-device-enable" in n["metadata"]["labels"] for n in nodes)
    deadline = time.monotonic() + 90
    while kubectl(gm, "-n", NS, "get", "pods", "-l", "app.kubernetes.io/part-of=gpu-install-sharing",
                  "-o", "name").stdout.strip():
        assert time.monotonic() < deadline
        time.sleep(1)
    assert sharing.uninstall(plan, kc, timeout=60) == []  # nothing left: a second removal does nothing
    changed, what = sharing.preview(plan, kc)
    assert changed and "would install" in what, what


# ---------------------------------------------------------------- mig.dynamic nos on the same lab (after gpumanager)
# The lab's GPUs are STAND-IN A100s; the node's STAND-IN nvidia-smi plays the driver's MIG mode protocol (its state
# in /var/lib/gpu-install-lab/mig-mode.json; "busy" makes a GPU refuse to switch and to reset, as a GPU a process holds).

SMI_STATE = "/var/lib/gpu-install-lab/mig-mode.json"


def _nos_site(gm, **extra) -> Path:
    # driver.mode host: the node's nvidia-smi (the STAND-IN) answers; the driver role is not run (--tags mig_mode),
    # and the lab's inventory sets preflight_require_kernel_headers false (no module can be built here)
    return _site(gm, sharing={"mode": "none"}, driver={"mode": "host"},
                 mig={"dynamic": "nos", "nos": {"chart": "oci://registry.example/charts/nos"}}, **extra)


def _mig_modes(gm, node: str) -> list[tuple[str, str]]:
    out = root(gm["h"], node, "nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader").stdout
    return [tuple(p.strip() for p in line.split(",")) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def _busy(gm, node: str, busy: list[int]) -> None:
    root(gm["h"], node, f"{{ test -e {SMI_STATE} || nvidia-smi -i 0 -mig 0 >/dev/null; }} && python3 -c 'import json; "
                        f"p=\"{SMI_STATE}\"; d=json.load(open(p)); d[\"busy\"]={busy!r}; json.dump(d, open(p, \"w\"))'")


def test_nos_mig_mode_role_reports_a_refused_reset_then_turns_mig_mode_on(gm):
    h, work = gm["h"], gm["work"]
    site = _nos_site(gm)
    apply = Applier(apply_inventory(h, work), work / "state-nos")
    assert _mig_modes(gm, "node1") == [("Disabled", "Disabled")]
    _busy(gm, "node2", [0])
    proc = apply(site, "--tags", "mig_mode")
    assert proc.returncode == 4, (proc.returncode, proc.stdout, proc.stderr)
    text = proc.stdout + proc.stderr
    assert "MIG mode is still pending on 1 GPU(s) of node2" in text, text
    assert "pending enable state" in text and "GPU reset refused: Unable to reset GPU" in text, text
    assert "set mig.nos.reboot: true" in text, text
    assert _mig_modes(gm, "node1") == [("Enabled", "Enabled")]
    assert _mig_modes(gm, "node2") == [("Disabled", "Enabled")]  # pending, as the driver leaves it
    # the process lets go of the GPU: the next apply finishes the switch (nvidia-smi -mig 1 again)
    _busy(gm, "node2", [])
    _ok(apply(site, "--tags", "mig_mode"))
    for node in NODES:
        assert _mig_modes(gm, node) == [("Enabled", "Enabled")]
        record = json.loads(root(h, node, "cat /var/lib/gpu-install/mig_mode.json").stdout)
        assert len(record["switched"]) == 1, record
    _ok(apply(site, "--tags", "mig_mode"))
    stats = apply.site_stats()
    assert all(s["changed"] == 0 for s in stats.values()), stats  # a second run changes nothing


def test_nos_cluster_check_refuses_this_cluster_with_every_reason(gm):
    from installer import features, kube
    from installer.errors import PreflightError
    from installer.features.nos import FEATURE as sharing

    site = _nos_site(gm)
    plan = _plan(gm, site)
    assert features.conflicts(plan) == []
    client = _client(gm)
    kube.set_node_label(client, "node1", "nvidia.com/mig.config", "all-1g.10gb")
    try:
        with pytest.raises(PreflightError) as exc:
            sharing.check_cluster(plan, client, print)
    finally:
        kube.set_node_label(client, "node1", "nvidia.com/mig.config", None)
    msg = exc.value.message
    assert exc.value.exit_code == 3 and msg.startswith("mig.dynamic nos conflicts with the cluster:"), msg
    assert "the cluster runs Kubernetes v1.20.2, and nos needs 1.23 or newer" in msg, msg
    assert "no cert-manager.io/v1 API" in msg, msg
    assert "node node1 carries nvidia.com/mig.config=all-1g.10gb" in msg and "node node2" not in msg, msg
    # the CLI: exit 3 before any host, nothing changed
    kc = gm["h"].dir / "kube" / "kubeconfig"
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "apply", "-s", str(site), "-i",
                           str(apply_inventory(gm["h"], gm["work"])), "--chart", str(CHART), "--kubeconfig", str(kc),
                           "--skip-mirror-check", "--skip-validate"],
                          capture_output=True, text=True, env=_env(gm), timeout=600)
    assert proc.returncode == 3 and "nos needs 1.23 or newer" in proc.stderr, (proc.returncode, proc.stderr)


def test_nos_uninstall_turns_mig_mode_off_where_gpu_install_turned_it_on(gm):
    h = gm["h"]
    site = _nos_site(gm)
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "uninstall", "-s", str(site), "-i",
                           str(apply_inventory(h, gm["work"])), "--yes", "--skip-operator", "--tags", "mig_mode"],
                          capture_output=True, text=True, env=_env(gm), timeout=600)
    _ok(proc)
    for node in NODES:
        assert _mig_modes(gm, node) == [("Disabled", "Disabled")]
        assert root(h, node, "test -e /var/lib/gpu-install/mig_mode.json", check=False).returncode != 0
