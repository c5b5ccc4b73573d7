"""`gpu-install upgrade plan` → `upgrade apply` of a host driver change (driver.mode runfile) on two real-kubelet lab
nodes (a lab of its own: test_lab_real_nodes.real_lab, 2 debian12 nodes, 1 STAND-IN GPU each), with the REAL GPU
Operator chart v23.9.2 deployed (its release is what apply upgrades; nothing of it runs on the lab: --no-wait).

The workload: a Deployment of two pods, one per node, each using the node's GPU, and a PodDisruptionBudget
(minAvailable 1) over them. A pod is Ready only once its file /var/lib/gi-upgrade/<pod name> exists on its node
(a readiness probe over a hostPath): the test creates it for the pods it wants Ready, so a replacement pod stays
unready -- and the budget allows no disruption -- until the test lifts it.

GPU Feature Discovery is not on the lab: the test labels the nodes' driver version as GFD would
(nvidia.com/cuda.driver-version.full). The runfile is the lab's STAND-IN (gpu_install_lab.packages.standin_runfile);
the nodes' STAND-IN nvidia-smi (/usr/local/bin, first in PATH) reports driver 535.54.03, so validate's node layer
passes for a runfile of that version and fails for any other.

1. 535.43.02 (GFD) → runfile 535.54.03: the canary node1 (cordon, drain, the runfile role, validate node+smoke,
   uncordon), then node2, whose drain the budget holds (node1's replacement pod unready): apply is killed (-9)
   there; the budget lifted, `--resume` finishes node2 without running node1's batch again.
2. → runfile 550.54.15: the canary's validation fails (nvidia-smi still says 535.54.03): exit 6, node1 left
   cordoned and named, node2 untouched.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS, needs_upstream
from tests.integration.test_driver_toolkit_roles import LAB_VARS, lab_inventory
from tests.integration.test_lab_real_nodes import kubectl, real_lab
from tests.integration.test_operator_crds import EMPTY_STRINGS_FIXED, build_recipe, chart
from tests.integration.test_runtime_roles import VENV_BIN, Applier, _ok, root

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes, needs_upstream]
NODES = ("node1", "node2")
BEFORE, TARGET, BAD = "535.43.02", "535.54.03", "550.54.15"
READY_DIR = "/var/lib/gi-upgrade"
NS = "gpu-operator"
LABEL = "nvidia.com/cuda.driver-version.full"


@pytest.fixture(scope="module")
def rl(tmp_path_factory):
    from tests.conftest import need

    need(build_recipe() >= EMPTY_STRINGS_FIXED,
         f"the real chart's ClusterPolicy carries empty strings, which the lab API server of build recipe "
         f"{build_recipe()} refuses (scripts/build-kubernetes recipe {EMPTY_STRINGS_FIXED} fixes it)")
    yield from real_lab(tmp_path_factory, "upgrade", len(NODES))


def site(rl, runfile_version: str) -> Path:
    from gpu_install_lab import packages

    h, work = rl["h"], rl["work"]
    runfile = packages.standin_runfile(runfile_version)
    path = work / f"site-{runfile_version}.yaml"
    path.write_text(yaml.safe_dump({
        "operator": {"version": "v23.9.2", "namespace": NS, "releaseName": "gpu-operator",
                     "chart": str(chart("v23.9.2"))},
        "registry": {"host": h.status["registry"], "ca": str(h.ca)},
        "runtime": "containerd", "toolkit": {"mode": "operator"},
        "driver": {"mode": "runfile", "runfile": str(runfile), "version": runfile_version, "rebootPolicy": "never"},
    }))
    return path


def gi(rl, *args: str, **kw) -> subprocess.CompletedProcess:
    env = {**rl["apply"].env()}
    return subprocess.run([str(VENV_BIN / "gpu-install"), *args], capture_output=True, text=True, env=env,
                          timeout=600, **kw)


def upgrade(rl, verb: str, site_file: Path, *extra: str) -> list[str]:
    return [str(VENV_BIN / "gpu-install"), "upgrade", verb, "-s", str(site_file), "-i", str(rl["inv"]),
            "--kubeconfig", rl["kubeconfig"], *extra]


def apply_args(rl, site_file: Path, plan: Path, *extra: str) -> list[str]:
    return upgrade(rl, "apply", site_file, "--plan", str(plan), "--yes", "--no-wait", "--skip-mirror-check",
                   "--validate-only", "node,smoke", "--validate-timeout", "120", "--drain-timeout", "120",
                   "--state", str(rl["state"]), "--json", str(rl["work"] / "apply.json"), *extra)


def node_obj(rl, n: str) -> dict:
    return json.loads(kubectl(rl, "get", "node", n, "-o", "json").stdout)


def trainers(rl) -> dict[str, dict]:
    pods = json.loads(kubectl(rl, "get", "pods", "-n", "default", "-l", "app=trainer", "-o", "json").stdout)
    return {p["metadata"]["name"]: p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")}


def make_ready(rl, pod: dict) -> None:
    root(rl["h"], pod["spec"]["nodeName"], f"mkdir -p {READY_DIR} && touch {READY_DIR}/{pod['metadata']['name']}")


def wait_for(what: str, cond, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)
    return got


def ready_on(rl, node: str) -> dict | None:
    """The trainer pod Running and Ready on node, if any."""
    for p in trainers(rl).values():
        conds = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}
        if p["spec"].get("nodeName") == node and conds.get("Ready") == "True":
            return p
    return None


def runfile_installs(rl, node: str) -> int:
    log = root(rl["h"], node, "cat /var/log/nvidia-installer.log 2>/dev/null", check=False).stdout
    return log.count("installed")


def gfd(rl, version: str) -> None:
    for n in NODES:
        kubectl(rl, "label", "node", n, f"{LABEL}={version}", "--overwrite")


@pytest.fixture(scope="module")
def env(rl):
    h, work = rl["h"], rl["work"]
    rl["inv"] = lab_inventory(h, work, LAB_VARS)
    rl["apply"] = Applier(rl["inv"], work / "state")
    rl["kubeconfig"] = str(h.dir / "kube" / "kubeconfig")
    rl["state"] = work / "upgrade-state.json"
    # the nodes trust the lab registry (registry_trust: the pods pull from it), nothing else: driver and toolkit are
    # the operator's in this first site
    prep = work / "site-prep.yaml"
    prep.write_text(yaml.safe_dump({"operator": {"version": "v23.9.2"}, "runtime": "containerd",
                                    "registry": {"host": h.status["registry"], "ca": str(h.ca)},
                                    "toolkit": {"mode": "operator"},
                                    "driver": {"mode": "operator", "customImageOs": LAB_DRIVER_OS}}))
    t0 = time.monotonic()
    _ok(rl["apply"](prep))
    # the release the upgrade starts from: the real chart, the runfile site (driver.enabled false)
    proc = gi(rl, "operator", "install", "-s", str(site(rl, TARGET)), "--kubeconfig", rl["kubeconfig"],
              "--no-wait", "--timeout", "120")
    assert proc.returncode == 0 and "revision 1 deployed" in proc.stdout, proc.stdout + proc.stderr
    # the workload: one GPU pod per node, Ready once its file exists; a budget of minAvailable 1 over both
    kubectl(rl, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "trainer"}}, "template": {
            "metadata": {"labels": {"app": "trainer"}},
            "spec": {"terminationGracePeriodSeconds": 0, "dnsPolicy": "Default",
                     "volumes": [{"name": "ready", "hostPath": {"path": READY_DIR, "type": "DirectoryOrCreate"}}],
                     "containers": [{
                         "name": "c", "image": f"{h.status['registry']}/gpu-install-lab/pause:3.6",
                         "resources": {"limits": {"nvidia.com/gpu": "1"}},
                         "volumeMounts": [{"name": "ready", "mountPath": "/ready"}],
                         "readinessProbe": {"exec": {"command": ["/bin/sh", "-c", 'test -f "/ready/$HOSTNAME"']},
                                            "periodSeconds": 1}}]}}}}))
    kubectl(rl, "apply", "-f", "-", input=json.dumps({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "trainer",
                                                                                    "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}}))
    pods = wait_for("two trainer pods scheduled", lambda: (len(p := trainers(rl)) == 2 and all(
        x["spec"].get("nodeName") for x in p.values())) and p)
    assert sorted(p["spec"]["nodeName"] for p in pods.values()) == list(NODES)
    for p in pods.values():
        make_ready(rl, p)
    for n in NODES:
        wait_for(f"the trainer pod on {n} Ready", lambda n=n: ready_on(rl, n))
    wait_for("the budget allowing 1", lambda: json.loads(kubectl(
        rl, "get", "pdb", "trainer", "-n", "default", "-o", "json").stdout).get("status", {}).get(
        "disruptionsAllowed") == 1)
    gfd(rl, BEFORE)
    print(f"upgrade lab prepared in {time.monotonic() - t0:.1f}s", flush=True)
    return rl


def test_canary_then_node2_held_by_the_pdb_killed_then_resumed(env):
    rl = env
    target = site(rl, TARGET)
    plan = rl["work"] / "plan.json"
    t0 = time.monotonic()
    proc = subprocess.run(upgrade(rl, "plan", target, "-o", str(plan), "--max-unavailable", "1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(plan.read_text())
    assert [(n["name"], n["action"]) for n in doc["nodes"]] == [("node1", "driver-reload"),
                                                               ("node2", "driver-reload")]
    assert [b["nodes"] for b in doc["batches"]] == [["node1"], ["node2"]] and doc["batches"][0]["canary"]
    print(f"upgrade plan {time.monotonic() - t0:.1f}s", flush=True)
    node2_pod = ready_on(rl, "node2")
    assert node2_pod is not None

    # apply, read line by line: node1's batch finishes; node2's drain is refused by the budget (node1's
    # replacement pod is not Ready), and apply is killed there
    t0 = time.monotonic()
    run = subprocess.Popen(apply_args(rl, target, plan), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=rl["apply"].env())
    seen: list[str] = []
    assert run.stdout is not None
    for line in run.stdout:
        seen.append(line)
        if line.startswith("node2: eviction of default/") and "refused for now" in line:
            break
    else:
        pytest.fail("apply ended before node2's drain was held:\n" + "".join(seen[-60:]))
    text = "".join(seen)
    assert "batch 1/2 (canary): node1" in text and "validate node1: node, smoke" in text
    assert text.index("node1: uncordoned") < text.index("batch 2/2: node2"), text
    assert node_obj(rl, "node2")["spec"].get("unschedulable") is True
    assert node2_pod["metadata"]["name"] in trainers(rl)  # held: still there
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    print(f"upgrade apply to the hold in batch 2 {time.monotonic() - t0:.1f}s", flush=True)
    state = json.loads(rl["state"].read_text())
    assert [b["status"] for b in state["batches"]] == ["done", "in-progress"]
    assert state["inProgress"] == {"batch": 2, "node": "node2", "step": "drain"}
    assert state["release"]["previous"] == {"revision": 1, "chart": "v23.9.2"}
    # the same chart and values (the driver is the nodes'): helm leaves the release at its revision
    assert state["release"]["applied"] == {"revision": 1, "chart": "v23.9.2"}
    assert not node_obj(rl, "node1")["spec"].get("unschedulable") and runfile_installs(rl, "node1") == 1

    # the budget lifted: node1's replacement Ready; --resume runs node2's batch only
    replacement = wait_for("node1's replacement pod", lambda: next(
        (p for p in trainers(rl).values() if p["spec"].get("nodeName") == "node1"), None))
    make_ready(rl, replacement)
    t0 = time.monotonic()
    proc = subprocess.run(apply_args(rl, target, plan, "--resume"), capture_output=True, text=True,
                          env=rl["apply"].env(), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    print(f"upgrade apply --resume {time.monotonic() - t0:.1f}s", flush=True)
    assert "resuming plan" in proc.stderr and "batch 1/2" not in proc.stderr
    assert f"node2: evicting default/{node2_pod['metadata']['name']}" in proc.stderr, proc.stderr
    assert "check(s) passed" in proc.stderr and "batch 2/2 done" in proc.stderr, proc.stderr
    assert runfile_installs(rl, "node1") == 1 and runfile_installs(rl, "node2") == 1
    for n in NODES:
        assert not node_obj(rl, n)["spec"].get("unschedulable")
    out = json.loads((rl["work"] / "apply.json").read_text())
    assert out["exitCode"] == 0 and out["resumed"] is True and out["phase"] == "done"
    assert [b["status"] for b in out["batches"]] == ["done", "done"]
    state = json.loads(rl["state"].read_text())
    assert state["phase"] == "done" and state["inProgress"] is None


def test_a_failing_canary_stops_with_node2_untouched(env):
    rl = env
    gfd(rl, TARGET)  # GFD after the first upgrade
    for n in NODES:  # both pods Ready again (node2's replacement came after the resume)
        pod = wait_for(f"a trainer pod on {n}", lambda n=n: next(
            (p for p in trainers(rl).values() if p["spec"].get("nodeName") == n), None))
        make_ready(rl, pod)
        wait_for(f"the trainer pod on {n} Ready", lambda n=n: ready_on(rl, n))
    bad = site(rl, BAD)
    plan = rl["work"] / "plan-bad.json"
    proc = subprocess.run(upgrade(rl, "plan", bad, "-o", str(plan), "--max-unavailable", "1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    node2_pod = ready_on(rl, "node2")
    t0 = time.monotonic()
    proc = subprocess.run(apply_args(rl, bad, plan), capture_output=True, text=True, env=rl["apply"].env(),
                          timeout=600)
    print(f"upgrade apply, failing canary {time.monotonic() - t0:.1f}s", flush=True)
    assert proc.returncode == 6, proc.stdout + proc.stderr[-5000:]
    assert "validate node1:" in proc.stderr and BAD in proc.stderr and "left cordoned" in proc.stderr
    assert node_obj(rl, "node1")["spec"].get("unschedulable") is True
    assert not node_obj(rl, "node2")["spec"].get("unschedulable")
    assert node2_pod is not None and node2_pod["metadata"]["name"] in trainers(rl)  # node2 untouched
    assert runfile_installs(rl, "node2") == 1  # only the first upgrade's
    out = json.loads((rl["work"] / "apply.json").read_text())
    assert out["exitCode"] == 6 and out["failure"]["nodes"] == ["node1"]
    assert [b["status"] for b in out["batches"]] == ["failed", "pending"]
