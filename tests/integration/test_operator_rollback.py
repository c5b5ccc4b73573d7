"""docs/upgrade.md "Rolling back", done as the page says, against the lab's real kube-apiserver and real helm with the
REAL GPU Operator charts (../shared/upstream/charts): v22.9.2 installed, upgraded to v23.9.2, then the site file's
previous release and chart given back. The new chart with the old release is refused before anything is touched
(exit 2); the rollback is a new Helm revision with the previous chart, the previous release's CRDs applied
server-side (the ClusterPolicy schema is v22.9.2's again), and a second run changes nothing.

Then a failed v23.9.2 upgrade, gone back from with `operator install`: what the failed revision created is swept
(installer.upgrade.orphans.after_upgrade), since helm's upgrade diffs against the deployed revision only.

The operator stage of `apply` and `operator install` share this path (installer/operator.py); `operator install` is
run here because the lab's hollow nodes have nothing for apply's node stages to do. --no-wait: nothing really runs on
hollow nodes (test_operator_crds.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS, need, needs_upstream
from tests.integration.test_operator_crds import (
    CP,
    EMPTY_STRINGS_FIXED,
    GPU_INSTALL,
    api,
    build_recipe,
    chart,
    cluster_policy,
    crd,
    drop_crds,
)

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes, needs_upstream]

NS = "gpu-op-rollback"


@pytest.fixture(scope="module")
def env(lab_kubernetes, tmp_path_factory):
    need(build_recipe() >= EMPTY_STRINGS_FIXED,
         f"the real chart's ClusterPolicy carries empty strings, which the lab API server of build recipe "
         f"{build_recipe()} refuses (scripts/build-kubernetes recipe {EMPTY_STRINGS_FIXED} fixes it)")
    tmp = tmp_path_factory.mktemp("rollback")
    kubeconfig = lab_kubernetes.status["kubernetes"]["kubeconfig"]
    site = tmp / "site.yaml"
    env = {"kubeconfig": kubeconfig, "site": site}
    drop_crds(api(env), [CP, "nvidiadrivers.nvidia.com"])  # cluster-scoped: start from none, whatever ran before
    yield env
    run(env, "v22.9.2", "uninstall", "--yes", "--purge-crds", "--delete-namespace")
    drop_crds(api(env), [CP, "nvidiadrivers.nvidia.com"])  # v23.9.2's CRD is not v22.9.2's to purge: leave none
    left = drop_annotated(api(env))
    assert not left, f"annotated as the release's after its uninstall: {left}"


#: the cluster-scoped kinds the two charts render, and the namespaced ones (apiVersion, kind)
CLUSTER_KINDS = [("rbac.authorization.k8s.io/v1", "ClusterRole"), ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
                 ("apiextensions.k8s.io/v1", "CustomResourceDefinition"), ("nvidia.com/v1", "ClusterPolicy")]
NAMESPACED_KINDS = [("v1", "ConfigMap"), ("v1", "Service"), ("v1", "ServiceAccount"), ("apps/v1", "Deployment"),
                    ("apps/v1", "DaemonSet"), ("rbac.authorization.k8s.io/v1", "Role"),
                    ("rbac.authorization.k8s.io/v1", "RoleBinding")]


def annotated(client, namespaced: bool = True, delete: bool = False) -> list[str]:
    """Every object of the charts' kinds annotated as this module's release's (meta.helm.sh/release-namespace NS):
    cluster-scoped ones and, with namespaced, those in NS; with delete, each is deleted too."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

    dyn = DynamicClient(client)
    found = []
    kinds = [*((k, None) for k in CLUSTER_KINDS), *((k, NS) for k in NAMESPACED_KINDS if namespaced)]
    for (api_version, kind), namespace in kinds:
        try:
            res = dyn.resources.get(api_version=api_version, kind=kind)
            items = (res.get(namespace=namespace) if namespace else res.get()).items
        except (ResourceNotFoundError, NotFoundError):  # not served (any more: a CRD just deleted)
            continue
        for obj in items:
            if (obj.metadata.annotations or {}).get("meta.helm.sh/release-namespace") == NS:
                found.append(f"{kind} {obj.metadata.name}")
                if delete:
                    res.delete(name=obj.metadata.name, namespace=namespace)
    return found


def drop_annotated(client) -> list[str]:
    """The cluster-scoped objects still annotated as this module's release's after its uninstall, deleted (so that
    the next module's release of the same chart can own them, should a test have failed half-way); the teardown
    asserts that there were none (the namespaced ones go with the namespace)."""
    return annotated(client, namespaced=False, delete=True)


def write_site(env, version: str, chart_path: Path) -> None:
    """The site file as the page has it: operator.version and operator.chart, the previous pair for the rollback."""
    env["site"].write_text(yaml.safe_dump({
        "operator": {"version": version, "namespace": NS, "releaseName": "gpu-operator", "chart": str(chart_path)},
        "registry": {"host": "registry.lab:5000", "prefix": "mirror"},
    }))


def run(env, version: str, *args: str, chart_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    write_site(env, version, chart_path or chart(version))
    command = ["config", "check"] if args[0] == "check" else ["operator", *args]
    kube = [] if args[0] == "check" else ["--kubeconfig", env["kubeconfig"]]
    return subprocess.run([str(GPU_INSTALL), *command, "-s", str(env["site"]), *kube], capture_output=True, text=True,
                          timeout=600)


def cp_schema_has_cdi(env) -> bool:
    obj = json.loads(crd(env, CP).data)
    v1 = next(v for v in obj["spec"]["versions"] if v["name"] == "v1")
    return "cdi" in v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def test_rollback_to_the_previous_release_and_chart(env):
    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0 and "revision 1 deployed" in proc.stdout, proc.stdout + proc.stderr
    proc = run(env, "v23.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0 and "revision 2 deployed" in proc.stdout, proc.stdout + proc.stderr
    assert cp_schema_has_cdi(env) and "cdi" in cluster_policy(env, "cluster-policy")["spec"]

    # the previous release with the new chart still in operator.chart: refused, offline and before anything is touched
    for args in (("check",), ("install", "--no-wait", "--timeout", "120")):
        proc = run(env, "v22.9.2", *args, chart_path=chart("v23.9.2"))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "is GPU Operator v23.9.2 but operator.version is v22.9.2" in proc.stderr, proc.stderr
    assert "revision 2 deployed (gpu-operator-v23.9.2)" in run(env, "v23.9.2", "status").stdout

    # the rollback: the previous operator.version and its chart
    assert run(env, "v22.9.2", "check").returncode == 0
    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"CRD {CP}: updated" in proc.stdout and "revision 3 deployed" in proc.stdout, proc.stdout
    status = run(env, "v22.9.2", "status")
    assert status.returncode == 0 and "revision 3 deployed (gpu-operator-v22.9.2)" in status.stdout, status.stdout
    assert not cp_schema_has_cdi(env)  # the previous release's CRD schema again
    assert "cdi" not in cluster_policy(env, "cluster-policy")["spec"]  # helm's upgrade took the new field out

    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0 and "unchanged at revision 3" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------- `gpu-install upgrade plan` on the same release


def upgrade_plan(env, inventory: Path, version: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`upgrade plan` with the site at `version` (and its chart), against the lab (whose nodes' OSes the site builds
    driver images for: driver.customImageOs, which changes no Helm value)."""
    write_site(env, version, chart(version))
    site = yaml.safe_load(env["site"].read_text())
    env["site"].write_text(yaml.safe_dump({**site, "driver": {"customImageOs": LAB_DRIVER_OS}}))
    return subprocess.run([str(GPU_INSTALL), "upgrade", "plan", "-s", str(env["site"]), "-i", str(inventory),
                           "--kubeconfig", env["kubeconfig"], *extra], capture_output=True, text=True, timeout=300)


def cordon(env, node: str, on: bool) -> None:
    from kubernetes import client

    client.CoreV1Api(api(env)).patch_node(node, {"spec": {"unschedulable": True if on else None}})


WORKLOADS = "upgrade-plan-workloads"


def workloads(env) -> bool:
    """On node1: a GPU pod (evicted) whose PodDisruptionBudget allows no disruption, and a pod that uses the GPU only
    through runtimeClassName: nvidia (never evicted) -- bound to the node directly (spec.nodeName)."""
    import time

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api(env))
    try:
        client.NodeV1Api(api(env)).create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                         "metadata": {"name": "nvidia"}, "handler": "nvidia"})
        made = True
    except ApiException as exc:
        assert exc.status == 409, exc  # there already
        made = False
    core.create_namespace({"metadata": {"name": WORKLOADS}})
    deadline = time.monotonic() + 60
    while not core.list_namespaced_service_account(WORKLOADS, field_selector="metadata.name=default").items:
        assert time.monotonic() < deadline, f"no default service account in {WORKLOADS}"
        time.sleep(0.5)

    def pod(name: str, **spec) -> None:
        core.create_namespaced_pod(WORKLOADS, {"metadata": {"name": name, "labels": {"app": name}}, "spec": {
            "nodeName": "node1", "automountServiceAccountToken": False, "tolerations": [{"operator": "Exists"}],
            **spec}})

    pause = "registry.lab:5000/gpu-install-lab/pause:3.6"
    pod("train-0", containers=[{"name": "c", "image": pause, "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    pod("rc-only", runtimeClassName="nvidia", containers=[{"name": "c", "image": pause}])
    from installer import kube

    kube.apply_object(api(env), {  # policy/v1beta1: the lab's API server is 1.20
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "train", "namespace": WORKLOADS},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train-0"}}}})
    return made


def test_upgrade_plan_from_the_deployed_release_then_nothing_to_do(env, lab_kubernetes, tmp_path):
    """The real v22.9.2 release, planned to v23.9.2 (--to, --chart): the component table, the hop policy's blocker
    (v23.3 and v23.6 are skipped majors), every lab node reloading its driver, the node an admin cordoned named as a
    blocker with its fix; after the upgrade a second plan says there is nothing to do (exit 0), the cordoned node
    still shown as such. Each plan is timed (target: 10 s on the lab)."""
    import time

    inventory = lab_kubernetes.inventory
    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")  # deployed whatever ran before
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cordon(env, "node2", True)
    made_runtime_class = workloads(env)
    try:
        t0 = time.monotonic()
        proc = upgrade_plan(env, inventory, "v22.9.2", "--to", "v23.9.2", "--chart", str(chart("v23.9.2")),
                            "-o", str(tmp_path / "plan.json"))
        seconds = time.monotonic() - t0
        print(f"upgrade plan v22.9.2 -> v23.9.2 on the lab: {seconds:.2f} s")
        out = proc.stdout
        assert proc.returncode == 3, out + proc.stderr
        assert "GPU Operator release gpu-operator (namespace gpu-op-rollback)" in out, out
        assert re.search(r"(?m)^\s*COMPONENT\s+CURRENT\s+TARGET$", out), out
        assert re.search(r"(?m)^\s*chart\s+gpu-operator-v22\.9\.2\s+gpu-operator-v23\.9\.2$", out), out
        assert re.search(r"(?m)^\s*node1\s+driver-reload\s", out), out
        assert re.search(r"(?m)^\s*node2 \(cordoned\)\s+driver-reload\s", out), out
        assert "skips the major releases v23.3, v23.6" in out, out
        assert "node2: the node was cordoned before the upgrade" in out and "kubectl uncordon node2" in out, out
        assert "Rollback (helm revision" in out and "CRDs: never downgraded" in out, out
        node1 = re.search(r"(?m)^\s*node1\s+driver-reload\s+(\S+)\s", out)
        assert node1 and node1.group(1) == f"{WORKLOADS}/train-0", out  # rc-only is not evicted
        assert f"node1: pod {WORKLOADS}/rc-only uses the GPU only through runtimeClassName: nvidia" in out, out
        assert f"node1: PodDisruptionBudget {WORKLOADS}/train allows no disruption now and selects " \
               f"{WORKLOADS}/train-0" in out, out
        doc = json.loads((tmp_path / "plan.json").read_text())
        assert doc["schema"] == "gpu-install.upgrade-plan/v1" and doc["exitCode"] == 3
        assert doc["release"]["chart"] == "v22.9.2" and doc["targetVersion"] == "v23.9.2"
        assert {n["name"]: n["cordoned"] for n in doc["nodes"]} == {"node1": False, "node2": True}
        assert doc["planHash"].startswith("sha256:") and doc["planHash"] in out
        assert seconds < 30, f"upgrade plan took {seconds:.1f} s"

        proc = run(env, "v23.9.2", "install", "--no-wait", "--timeout", "120")
        assert proc.returncode == 0 and "deployed" in proc.stdout, proc.stdout + proc.stderr
        t0 = time.monotonic()
        proc = upgrade_plan(env, inventory, "v23.9.2", "--format", "json")
        seconds = time.monotonic() - t0
        print(f"upgrade plan v23.9.2 -> v23.9.2 on the lab: {seconds:.2f} s")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["nothingToDo"] is True and doc["blockers"] == [], doc
        assert [(n["name"], n["action"], n["cordoned"]) for n in doc["nodes"]] == [
            ("node1", "none", False), ("node2", "none", True)]
        proc = upgrade_plan(env, inventory, "v23.9.2")
        assert proc.returncode == 0 and "Nothing to do: the release is at v23.9.2" in proc.stdout, proc.stdout
        assert re.search(r"(?m)^\s*node2 \(cordoned\)\s+none\s", proc.stdout), proc.stdout
    finally:
        cordon(env, "node2", False)
        from kubernetes import client

        client.CoreV1Api(api(env)).delete_namespace(WORKLOADS)
        if made_runtime_class:
            client.NodeV1Api(api(env)).delete_runtime_class("nvidia")


def test_upgrade_plan_release_side_against_the_deployed_release(env):
    """The release side of `upgrade plan` (installer.upgrade.release) and `apply --check`'s values diff, read from
    the real v22.9.2 release: its deployed values and CRDs against the v23.9.2 chart rendered for the lab's
    Kubernetes; a field the real ClusterPolicy sets that the v23.9.2 CRD drops (env[].valueFrom) is a blocker."""
    from kubernetes import client as k

    from installer import kube, operator
    from installer.config import load_site
    from installer.plan import resolve
    from installer.upgrade import cluster
    from installer.upgrade.release import release_report

    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    write_site(env, "v23.9.2", chart("v23.9.2"))
    plan = resolve(load_site(env["site"]))
    c = api(env)
    current, _ = cluster.read_release(plan, Path(env["kubeconfig"]), c)
    assert current is not None and current.chart_version == "v22.9.2" and CP in current.crds
    custom = k.CustomObjectsApi(c)
    custom.patch_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy", {"spec": {"driver": {
        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}}})
    try:
        r = release_report(plan, current, kube.server_version(c), c, chart=str(chart("v23.9.2")))
        assert "~ driver.version: 525.60.13 -> 550.54.14 (release default)" in r.values_diff, r.values_diff
        assert not [line for line in r.values_diff if "(site" in line], r.values_diff  # the same site file
        cp = [line for line in r.crd_changes if line.startswith(f"~ CRD {CP}")]
        assert any("fields added" in x and "spec.cdi" in x for x in cp), r.crd_changes
        lost = [b for b in r.blockers if b.what.startswith("ClusterPolicy cluster-policy: the target CRD")]
        assert len(lost) == 1 and "spec.driver.env[].valueFrom" in lost[0].what, r.blockers
        assert any("rendered objects checked against the Kubernetes" in f for f in r.findings), r.findings
        assert not [b for b in r.blockers if "API schema" in b.what or "not served" in b.what], r.blockers

        report = operator.preview(plan, operator.prepare(plan, env["kubeconfig"], chart("v23.9.2")))
        lines = report.lines()
        assert any("would upgrade" in x and "values deployed → rendered" in x for x in lines), lines
        assert "  ~ driver.version: 525.60.13 -> 550.54.14 (release default)" in lines, lines
    finally:
        custom.patch_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy",
                                           {"spec": {"driver": {"env": None}}})


# ---------------------------------------------------------------- `gpu-install upgrade rollback` of a real-chart upgrade


#: v23.9.2's NFD garbage collector (ClusterRole, ClusterRoleBinding, Deployment): v22.9.2 has none
GC = "gpu-operator-node-feature-discovery-gc"
#: a ConfigMap only v23.9.2 renders
FOREIGN = "gpu-operator-node-feature-discovery-topology-updater-conf"


def upgrade_rollback(env, inventory: Path, state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    write_site(env, "v23.9.2", chart("v23.9.2"))
    site = yaml.safe_load(env["site"].read_text())
    env["site"].write_text(yaml.safe_dump({**site, "driver": {"customImageOs": LAB_DRIVER_OS}}))
    return subprocess.run([str(GPU_INSTALL), "upgrade", "rollback", "-s", str(env["site"]), "-i", str(inventory),
                           "--kubeconfig", env["kubeconfig"], "--state", str(state), *extra], capture_output=True,
                          text=True, timeout=600)


def test_upgrade_rollback_of_a_real_chart_upgrade(env, lab_kubernetes, tmp_path):
    """v22.9.2 then v23.9.2 (real charts): `upgrade rollback` without --yes previews (the revisions, the values that
    go back, the CRD caveat) and changes nothing; with --yes helm rolls back to the v22.9.2 revision: a new revision
    with v22.9.2's chart and exactly its values, while the CRDs stay v23.9.2's (never downgraded). A revision helm
    does not have is refused (exit 2). What only v23.9.2 rendered is deleted after the refused helm rollback's
    --chart fallback (helm's own diff, against the failed revision, misses it) -- but not an object another release
    owns -- and the uninstall leaves nothing annotated with the release."""
    from installer import helm

    inventory, state = lab_kubernetes.inventory, tmp_path / "none.json"
    kubeconfig = Path(env["kubeconfig"])
    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    before = helm.release_values("gpu-operator", NS, kubeconfig)
    assert before is not None and before[0].chart == "gpu-operator-v22.9.2"
    old_rev, old_values = before[0].revision, before[1]
    proc = run(env, "v23.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    up = helm.release_values("gpu-operator", NS, kubeconfig)
    assert up is not None and up[0].chart == "gpu-operator-v23.9.2" and up[1] != old_values
    new_rev = up[0].revision
    assert cp_schema_has_cdi(env)
    # what only v23.9.2 renders, in the cluster and annotated with the release; one of them re-annotated as another
    # release's (an object the release does not own: the rollback must leave it)
    from kubernetes import client as k

    rbac, core = k.RbacAuthorizationV1Api(api(env)), k.CoreV1Api(api(env))
    assert rbac.read_cluster_role(GC).metadata.annotations["meta.helm.sh/release-namespace"] == NS
    assert rbac.read_cluster_role_binding(GC).metadata.annotations["meta.helm.sh/release-name"] == "gpu-operator"
    core.patch_namespaced_config_map(FOREIGN, NS, {"metadata": {"annotations": {
        "meta.helm.sh/release-name": "someone-else", "meta.helm.sh/release-namespace": "elsewhere"}}})

    proc = upgrade_rollback(env, inventory, state, "--to-revision", "999")
    assert proc.returncode == 2 and "--to-revision 999: the release has no such revision" in proc.stderr, proc.stderr

    proc = upgrade_rollback(env, inventory, state)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"revision {new_rev} (gpu-operator-v23.9.2, deployed) -> helm rollback to revision {old_rev} " \
           f"(gpu-operator-v22.9.2) [the previous revision]" in out, out
    assert "~ driver.version: 550.54.14 -> 525.60.13" in out, out
    assert "cannot undo: CRDs: never downgraded" in out and "preview only, nothing changed" in out, out
    assert f"\n  ClusterRole {GC}: to be deleted\n" in out and f"\n  Deployment {NS}/{GC}: to be deleted\n" in out, out
    assert f"\n  ConfigMap {NS}/{FOREIGN}: left: not the release's" in out, out
    assert rbac.read_cluster_role(GC) is not None  # the preview deletes nothing
    assert helm.release_state("gpu-operator", NS, kubeconfig).revision == new_rev  # type: ignore[union-attr]

    # helm rollback itself refuses this hop: v22.9.2's NFD rendered its NodeFeatureRule CRD from a template, v23.9.2
    # carries it in crds/ (applied by gpu-install, kept): in the cluster, not in revision 2's manifest
    proc = upgrade_rollback(env, inventory, state, "--yes", "--no-wait")
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert 'no CustomResourceDefinition with the name "nodefeaturerules.nfd.k8s-sigs.io" found' in proc.stderr
    assert "helm rollback does not adopt it" in proc.stderr and "--chart" in proc.stderr, proc.stderr

    # with revision 1's chart: helm upgrade with that chart and exactly revision 1's values
    doc_path = tmp_path / "rollback.json"
    proc = upgrade_rollback(env, inventory, state, "--yes", "--no-wait", "--to-revision", str(old_rev), "--chart",
                            str(chart("v22.9.2")), "--json", str(doc_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = helm.release_values("gpu-operator", NS, kubeconfig)
    assert after is not None
    assert (after[0].chart, after[0].status) == ("gpu-operator-v22.9.2", "deployed") and after[0].revision > new_rev
    assert after[1] == old_values  # the previous revision's values, exactly
    assert f"upgrade rollback ok: release gpu-operator at revision {after[0].revision} (gpu-operator-v22.9.2)" \
        in proc.stdout
    assert cp_schema_has_cdi(env)  # the CRDs stay v23.9.2's: never downgraded
    doc = json.loads(doc_path.read_text())
    assert doc["schema"] == "gpu-install.upgrade-rollback/v1" and doc["exitCode"] == 0 and doc["applied"] is True
    assert doc["release"]["toRevision"] == old_rev and doc["release"]["newRevision"] == after[0].revision
    assert doc["nodes"] == [] and doc["driverMode"] == "operator"
    print("rollback JSON:", json.dumps(doc))

    # v23.9.2's own resources are gone (the NFD gc's ClusterRole/Binding and Deployment, ...), said and in the JSON;
    # the one annotated for another release is left
    from kubernetes.client.exceptions import ApiException

    for read in (rbac.read_cluster_role, rbac.read_cluster_role_binding):
        with pytest.raises(ApiException) as gone:
            read(GC)
        assert gone.value.status == 404
    orphans = {(o["kind"], o["name"], o["namespace"]): o["action"] for o in doc["orphans"]}
    assert orphans[("ClusterRole", GC, None)] == "deleted" and orphans[("ClusterRoleBinding", GC, None)] == "deleted"
    assert orphans[("Deployment", GC, NS)] == "deleted", orphans
    assert orphans[("ConfigMap", FOREIGN, NS)] == \
        "left: not the release's (meta.helm.sh/release-name/meta.helm.sh/release-namespace: elsewhere/someone-else)"
    assert f"not in the release's revision any more: ClusterRole {GC}: deleted" in proc.stdout + proc.stderr
    assert core.read_namespaced_config_map(FOREIGN, NS).metadata.annotations["meta.helm.sh/release-name"] == \
        "someone-else"
    assert not [k for k, v in orphans.items() if v != "deleted" and k != ("ConfigMap", FOREIGN, NS)], orphans

    # and the uninstall leaves nothing annotated with the release (namespace kept here: its objects are looked at)
    import time

    t0 = time.monotonic()
    proc = run(env, "v22.9.2", "uninstall", "--yes")
    print(f"operator uninstall after the rollback: {time.monotonic() - t0:.2f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert annotated(api(env)) == [], annotated(api(env))


# ---------------------------------------------------------------- back from a failed upgrade with `operator install`


def test_operator_install_back_after_a_failed_upgrade_sweeps_what_it_left(env):
    """v22.9.2 deployed, the upgrade to v23.9.2 fails (helm's --wait runs out: its resources, the NFD gc's ClusterRole
    and ClusterRoleBinding among them, were created) and the site goes back to v22.9.2 with `operator install` (apply's
    operator stage, the same path): helm's upgrade diffs against the deployed revision 1 only, so what the failed
    revision 2 made stays -- unless gpu-install sweeps it. It does: deleted, said, in the stage's report line; the one
    annotated for another release is left; and the uninstall then leaves nothing annotated with the release."""
    import time

    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    from installer import helm, kube, operator
    from installer.config import load_site
    from installer.errors import ClusterError
    from installer.plan import resolve

    kubeconfig = Path(env["kubeconfig"])
    rbac, core = k.RbacAuthorizationV1Api(api(env)), k.CoreV1Api(api(env))
    try:  # the rollback test's ConfigMap annotated for another release: helm's upgrade to v23.9.2 would refuse it
        core.delete_namespaced_config_map(FOREIGN, NS)
    except ApiException as exc:
        assert exc.status == 404, exc
    t0 = time.monotonic()
    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    base = helm.release_state("gpu-operator", NS, kubeconfig)
    assert base is not None and base.chart == "gpu-operator-v22.9.2"

    # the failed upgrade: operator.install's steps, the operator's pod held off every node (a nodeSelector no node
    # has) and a 1 s --wait: helm creates the chart's resources, then its wait runs out
    write_site(env, "v23.9.2", chart("v23.9.2"))
    plan = resolve(load_site(env["site"]))
    prepared = operator.prepare(plan, kubeconfig, chart("v23.9.2"))
    kube.apply_crds(api(env), operator.chart_crds(plan, prepared.chart))
    values = {**prepared.values, "operator": {**prepared.values.get("operator", {}),
                                              "nodeSelector": {"gpu-install.test/no-such-node": "true"}}}
    with pytest.raises(ClusterError) as failed:
        helm.install_or_upgrade(prepared.chart, "gpu-operator", NS, values, kubeconfig, timeout=1)
    print("the failed upgrade:", failed.value.message)
    history = helm.release_history("gpu-operator", NS, kubeconfig)
    print("history after the failed upgrade:", history)
    assert history is not None and [(h.revision, h.status) for h in history][-2:] == [
        (base.revision, "deployed"), (base.revision + 1, "failed")], history
    assert rbac.read_cluster_role(GC).metadata.annotations["meta.helm.sh/release-namespace"] == NS
    assert rbac.read_cluster_role_binding(GC).metadata.annotations["meta.helm.sh/release-name"] == "gpu-operator"
    core.patch_namespaced_config_map(FOREIGN, NS, {"metadata": {"annotations": {
        "meta.helm.sh/release-name": "someone-else", "meta.helm.sh/release-namespace": "elsewhere"}}})

    # back to v22.9.2
    t1 = time.monotonic()
    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")
    print(f"operator install back to v22.9.2 (with the sweep): {time.monotonic() - t1:.2f} s")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    new = base.revision + 2
    assert f"helm upgrade diffed revision {new} against the deployed revision {base.revision}, not against " \
           f"revision(s) {base.revision + 1} (failed)" in out, out
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        assert f"not in the release's revision any more: {kind} {GC}: deleted" in out, out
    assert f"not in the release's revision any more: Deployment {NS}/{GC}: deleted" in out, out
    assert f"not in the release's revision any more: ConfigMap {NS}/{FOREIGN}: left: not the release's " \
           "(meta.helm.sh/release-name/meta.helm.sh/release-namespace: elsewhere/someone-else)" in out, out
    assert re.search(rf"(?m)^release gpu-operator \(gpu-operator-v22\.9\.2\): revision {new} deployed; \d+ "
                     rf"leftover\(s\) of failed revision {base.revision + 1} deleted, 1 left$", proc.stdout), out
    for read in (rbac.read_cluster_role, rbac.read_cluster_role_binding):
        with pytest.raises(ApiException) as gone:
            read(GC)
        assert gone.value.status == 404
    assert core.read_namespaced_config_map(FOREIGN, NS).metadata.annotations["meta.helm.sh/release-name"] == \
        "someone-else"

    # a second run: no new revision, no sweep, no change
    proc = run(env, "v22.9.2", "install", "--no-wait", "--timeout", "120")
    assert proc.returncode == 0 and f"unchanged at revision {new}" in proc.stdout, proc.stdout + proc.stderr
    assert "not in the release's revision" not in proc.stdout + proc.stderr

    proc = run(env, "v22.9.2", "uninstall", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert annotated(api(env)) == [], annotated(api(env))
    print(f"failed upgrade, install back, uninstall: {time.monotonic() - t0:.2f} s")
