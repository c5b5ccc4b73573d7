"""`gpu-install operator install|status|uninstall` against the lab's real kube-apiserver and real helm.

The chart is tests/fixtures/charts/gpu-operator-fixture (a STAND-IN with the GPU Operator's values
shape and a minimal ClusterPolicy CRD), packaged to a .tgz with the real helm. The lab's nodes are
kubemark hollow nodes: pods are admitted and reported Running/Ready without running anything, so
helm's --wait returns once the Deployment/DaemonSet are reported available -- the same condition it
checks on a real cluster.

The CLI runs as a subprocess (the installed `gpu-install` entry point); its stdout/stderr, the
release as Helm stored it and the control plane's logs are searched for the registry password.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]

CHART = ROOT / "tests" / "fixtures" / "charts" / "gpu-operator-fixture"
GPU_INSTALL = Path(sys.executable).parent / "gpu-install"
REGISTRY = "registry.lab:5000"


@pytest.fixture(scope="module")
def env(lab_kubernetes, tmp_path_factory):
    """kubeconfig, packaged chart, site file, and an environment holding the registry credentials."""
    from installer.tools import ensure_helm

    tmp = tmp_path_factory.mktemp("operator")
    kubeconfig = lab_kubernetes.status["kubernetes"]["kubeconfig"]
    # scripts/build-kubernetes vendors reflect2 1.0.2 (recipe 3), so the lab apiserver stores custom
    # resources (with 1.0.1 under Go >= 1.18 it died on the first one), and patches the validator that
    # read "" as null (recipe 4): the whole chart is installed.
    subprocess.run([str(ensure_helm()), "package", str(CHART), "-d", str(tmp)], capture_output=True, check=True)
    tgz = next(tmp.glob("gpu-operator-fixture-*.tgz"))
    site = tmp / "site.yaml"
    site.write_text(yaml.safe_dump({
        "operator": {"version": "v23.9.2", "namespace": "gpu-op-test", "releaseName": "gpu-operator"},
        "registry": {"host": REGISTRY, "prefix": "mirror",
                     "pullSecret": {"name": "gpu-registry", "usernameEnv": "T_GI_REG_USER",
                                    "passwordEnv": "T_GI_REG_PASSWORD"}},
    }))
    password = "pw-" + secrets.token_hex(12)
    run_env = {**os.environ, "T_GI_REG_USER": "mirror-user", "T_GI_REG_PASSWORD": password,
               "KUBECONFIG": kubeconfig, "GPU_INSTALL_CHART": str(tgz)}
    return {"kubeconfig": kubeconfig, "chart": tgz, "site": site, "password": password, "env": run_env,
            "lab_dir": lab_kubernetes.dir}


def gi(env, *args, **overrides):
    e = {**env["env"], **overrides}
    proc = subprocess.run([str(GPU_INSTALL), "operator", *args, "-s", str(env["site"])],
                          capture_output=True, text=True, env=e, timeout=600)
    env.setdefault("captured", []).append(proc.stdout + proc.stderr)
    return proc


def api(env):
    from kubernetes import config

    return config.new_client_from_config(config_file=env["kubeconfig"])


def helm_get_all(env) -> str:
    from installer.tools import ensure_helm

    proc = subprocess.run([str(ensure_helm()), "get", "all", "gpu-operator", "-n", "gpu-op-test",
                           "--kubeconfig", env["kubeconfig"]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_missing_credentials_change_nothing(env):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    proc = gi(env, "install", "--set", "operator.namespace=gpu-op-nocreds", T_GI_REG_PASSWORD="")
    assert proc.returncode == 2, proc.stderr
    assert "registry.pullSecret.passwordEnv: the environment variable it names is not set" in proc.stderr
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api(env)).read_namespace("gpu-op-nocreds")
    assert err.value.status == 404


def test_a_release_the_cluster_cannot_run_is_refused_before_anything_changes(env):
    """The lab's API server is Kubernetes 1.20; from v24.9 the chart's node-feature-discovery objects use gRPC
    probes, which it refuses: exit 3 saying that no catalog release is validated on 1.20, nothing created."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    proc = gi(env, "install", "--set", "operator.version=v24.9.2", "--set", "operator.namespace=gpu-op-k8s")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Kubernetes 1.20 cannot run GPU Operator v24.9.2" in proc.stderr, proc.stderr
    assert "no catalog release is validated by NVIDIA on Kubernetes 1.20" in proc.stderr, proc.stderr
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(api(env)).read_namespace("gpu-op-k8s")
    assert err.value.status == 404


@pytest.mark.parametrize("command", [["apply"], ["preflight"]])
def test_apply_and_preflight_check_the_cluster_before_any_host(env, tmp_path, command):
    """The host is TEST-NET (192.0.2.1): were it contacted, the run would end unreachable (exit 5), not 3."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n"
                   "        gpu1: {ansible_host: 192.0.2.1, gpu_install_os: ubuntu22.04}\n")
    proc = subprocess.run([str(GPU_INSTALL), *command, "-s", str(env["site"]), "-i", str(inv), "--kubeconfig",
                           env["kubeconfig"], "--set", "operator.version=v24.9.2"],
                          capture_output=True, text=True, env=env["env"], timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Kubernetes 1.20 cannot run GPU Operator v24.9.2" in proc.stderr, proc.stderr
    assert "192.0.2.1" not in proc.stdout + proc.stderr and "UNREACHABLE" not in proc.stdout + proc.stderr


def test_install_status_reinstall_uninstall(env):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    k = api(env)
    core, apps = client.CoreV1Api(k), client.AppsV1Api(k)

    # status before: not installed -> exit 6
    proc = gi(env, "status")
    assert proc.returncode == 6, proc.stdout + proc.stderr

    proc = gi(env, "install", "--timeout", "180")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "namespace gpu-op-test: created" in proc.stdout
    assert "pull secret gpu-op-test/gpu-registry: created" in proc.stdout
    assert "release gpu-operator (gpu-operator-fixture-0.1.0): revision 1 deployed" in proc.stdout

    # the namespace and the pull Secret
    assert core.read_namespace("gpu-op-test").status.phase == "Active"
    secret = core.read_namespaced_secret("gpu-registry", "gpu-op-test")
    assert secret.type == "kubernetes.io/dockerconfigjson"
    auths = json.loads(base64.b64decode(secret.data[".dockerconfigjson"]))["auths"]
    assert list(auths) == [REGISTRY]
    assert auths[REGISTRY]["username"] == "mirror-user"
    assert auths[REGISTRY]["password"] == env["password"]  # it reached the API server, and only there

    # the operator Deployment: image in the private registry, pull secret, reported available by the
    # hollow kubelet (helm --wait returned only after that)
    dep = apps.read_namespaced_deployment("gpu-operator", "gpu-op-test")
    spec = dep.spec.template.spec
    assert spec.containers[0].image == f"{REGISTRY}/mirror/nvidia/gpu-operator:v23.9.2"
    assert [s.name for s in spec.image_pull_secrets] == ["gpu-registry"]
    assert dep.status.available_replicas == 1
    ds = apps.read_namespaced_daemon_set("nfd-worker", "gpu-op-test")
    assert ds.spec.template.spec.containers[0].image.startswith(f"{REGISTRY}/mirror/")
    # one pod per lab node; helm's DaemonSet wait tolerates maxUnavailable (1) pods not yet ready
    assert ds.status.desired_number_scheduled == ds.status.current_number_scheduled == 2
    assert ds.status.number_ready >= 1

    # the CRD from the chart's crds/ (stand-in) and the ClusterPolicy rendered from our values
    ext = client.ApiextensionsV1Api(k)
    assert ext.read_custom_resource_definition("clusterpolicies.nvidia.com").spec.scope == "Cluster"
    cp = client.CustomObjectsApi(k).get_cluster_custom_object("nvidia.com", "v1", "clusterpolicies",
                                                              "cluster-policy")
    assert len(cp["spec"]) >= 10
    for name, entry in cp["spec"].items():
        assert entry["image"].startswith(f"{REGISTRY}/mirror/"), name
        assert entry["imagePullSecrets"] == ["gpu-registry"], name

    proc = gi(env, "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"kubernetes.io/dockerconfigjson, registries {REGISTRY}" in proc.stdout
    assert "release gpu-operator: revision 1 deployed (gpu-operator-fixture-0.1.0)" in proc.stdout

    # second install, same chart and values: nothing changes
    rv = secret.metadata.resource_version
    proc = gi(env, "install", "--timeout", "180")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unchanged at revision 1" in proc.stdout and "no change" in proc.stdout, proc.stdout
    assert "pull secret gpu-op-test/gpu-registry: unchanged" in proc.stdout
    assert core.read_namespaced_secret("gpu-registry", "gpu-op-test").metadata.resource_version == rv

    # a changed credential is an update of the Secret, not of the release
    proc = gi(env, "install", T_GI_REG_USER="other-user")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pull secret gpu-op-test/gpu-registry: updated" in proc.stdout
    assert "unchanged at revision 1" in proc.stdout
    proc = gi(env, "install")  # and back
    assert "pull secret gpu-op-test/gpu-registry: updated" in proc.stdout

    stored = helm_get_all(env)
    assert "gpu-registry" in stored  # the secret's name is in the values ...
    env["captured"].append(stored)

    # uninstall without --yes: exit 2, nothing removed
    proc = gi(env, "uninstall")
    assert proc.returncode == 2
    assert "--yes" in proc.stderr
    assert apps.read_namespaced_deployment("gpu-operator", "gpu-op-test")
    assert core.read_namespaced_secret("gpu-registry", "gpu-op-test")
    assert "revision 1 deployed" in gi(env, "status").stdout

    proc = gi(env, "uninstall", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "release gpu-operator: uninstalled" in proc.stdout
    proc = gi(env, "status")
    assert proc.returncode == 6 and "release gpu-operator: not installed" in proc.stdout
    for read in (lambda: apps.read_namespaced_deployment("gpu-operator", "gpu-op-test"),
                 lambda: core.read_namespaced_secret("gpu-registry", "gpu-op-test")):
        with pytest.raises(ApiException) as err:
            read()
        assert err.value.status == 404
    assert core.read_namespace("gpu-op-test").status.phase == "Active"  # kept unless asked

    proc = gi(env, "uninstall", "--yes", "--delete-namespace")
    assert proc.returncode == 0 and "release gpu-operator: was not installed" in proc.stdout
    assert "namespace gpu-op-test: deletion started" in proc.stdout

    # ... and the password in none of what was printed, stored by Helm, or logged by the control plane
    logs = [p.read_text(errors="replace") for p in (Path(env["lab_dir"]) / "kube" / "logs").glob("*.log")]
    assert logs
    for text in env["captured"] + logs:
        assert env["password"] not in text
        assert base64.b64encode(f"mirror-user:{env['password']}".encode()).decode() not in text



def _helm_revisions(core, ns: str, release: str = "gpu-operator") -> dict[int, str]:
    """{revision: status} of a release, read from the Secrets helm stores it in (sh.helm.release.v1.<name>.v<N>,
    labelled owner=helm, name, status, version)."""
    secrets_ = core.list_namespaced_secret(ns, label_selector=f"owner=helm,name={release}").items
    return {int(s.metadata.labels["version"]): s.metadata.labels["status"] for s in secrets_}


def test_api_server_killed_during_helm_upgrade_then_the_rerun_recovers_the_pending_release(env):
    """Fault: the API server dies (SIGKILL) while `helm upgrade --wait` of the operator stage runs -- killed as soon
    as helm has stored the new revision as pending-upgrade, kept down until gpu-install has exited, then restarted
    with the lab's own up(). The run ends with exit 5 naming the API server, the release and how to resume, no
    traceback; the release is left pending-upgrade (helm could not record the failure). The same command again
    rolls the pending revision back and upgrades: exit 0, deployed at a new revision with the new values; a third
    run changes nothing."""
    from kubernetes import client, watch

    from gpu_install_lab import proc as labproc
    from gpu_install_lab.kube.controlplane import ControlPlane

    ns = "gpu-op-fault"
    base = ["--set", f"operator.namespace={ns}", "--timeout", "30"]
    k = api(env)
    core, apps, custom = client.CoreV1Api(k), client.AppsV1Api(k), client.CustomObjectsApi(k)
    proc = gi(env, "install", *base)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _helm_revisions(core, ns) == {1: "deployed"}

    # the upgrade: another registry prefix, so every image changes and helm waits for the new rollout
    upgrade = ["install", *base, "--set", "registry.prefix=mirror-b"]
    cp = ControlPlane(Path(env["lab_dir"]), progress=lambda m: None)
    apiserver = cp.state["processes"]["kube-apiserver"]
    assert labproc.alive(apiserver)
    run = subprocess.Popen([str(GPU_INSTALL), "operator", *upgrade, "-s", str(env["site"])], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env["env"])
    try:
        # helm has stored revision 2 as pending-upgrade and updated the release's resources -- the ClusterPolicy,
        # a custom resource, is the last it updates -- and now waits for the new rollout
        updated = False
        while not updated and run.poll() is None:
            w = watch.Watch()
            for ev in w.stream(custom.list_cluster_custom_object, "nvidia.com", "v1", "clusterpolicies",
                               field_selector="metadata.name=cluster-policy", timeout_seconds=5):
                if any("/mirror-b/" in str(e.get("image")) for e in ev["object"]["spec"].values()
                       if isinstance(e, dict)):
                    updated = True
                    w.stop()
        assert updated, f"helm never updated the ClusterPolicy: {run.communicate(timeout=300)}"
        assert _helm_revisions(core, ns) == {1: "deployed", 2: "pending-upgrade"}
        labproc.send(apiserver, signal.SIGKILL)  # no graceful shutdown
        t0 = time.monotonic()
        assert not labproc.wait_gone([apiserver], 10), "kube-apiserver did not die"
        out, err = run.communicate(timeout=300)  # the API server stays down until gpu-install has exited
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if not labproc.alive(cp.state["processes"]["kube-apiserver"]):
            cp.up()  # idempotent: restarts what is not running

    env["captured"].append(out + err)
    print(f"faulted run: exit {run.returncode}, {time.monotonic() - t0:.1f}s after the kill\n{err}")
    assert run.returncode == 5, out + err
    assert "Traceback" not in out + err
    assert "the Kubernetes API server cannot be reached" in err, err
    assert "helm upgrade --install gpu-operator" in err, err
    assert "the API server still cannot be reached" in err and "connection refused" in err, err
    assert "re-running is safe -- a revision left pending-upgrade is rolled back" in err, err
    # helm could not record the failure: the new revision is still pending-upgrade, the deployed one intact, the
    # release's objects and the pull Secret still there
    assert _helm_revisions(core, ns) == {1: "deployed", 2: "pending-upgrade"}
    assert apps.read_namespaced_deployment("gpu-operator", ns)
    assert core.read_namespaced_secret("gpu-registry", ns).type == "kubernetes.io/dockerconfigjson"

    # the same command again, with room to wait: the API server is back, but the controller manager's, the
    # scheduler's and the kubelets' watches come back on client-go's backoff (up to 30 s after a 40 s outage), so the
    # rollback's rollout alone can outlast the faulted run's 30 s (seen on a loaded CI machine)
    rerun = [*upgrade[:-4], "--timeout", "300", *upgrade[-2:]]
    assert rerun[-2:] == ["--set", "registry.prefix=mirror-b"] and rerun.count("--timeout") == 1, rerun
    t0 = time.monotonic()
    proc = gi(env, *rerun)
    print(f"re-run: exit {proc.returncode} in {time.monotonic() - t0:.1f}s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert ("release gpu-operator: revision 2 was left pending-upgrade by an interrupted run: rolled back to "
            "revision 1 as revision 3 before upgrading") in proc.stdout, proc.stdout
    # helm's rollback records revision 3 (revision 1's chart and values) and the upgrade revision 4; it does not
    # relabel revision 2, which stays pending-upgrade in the history -- helm only looks at the latest revision
    revs = _helm_revisions(core, ns)
    assert revs == {1: "superseded", 2: "pending-upgrade", 3: "superseded", 4: "deployed"}, revs
    assert "release gpu-operator (gpu-operator-fixture-0.1.0): revision 4 deployed" in proc.stdout, proc.stdout
    image = apps.read_namespaced_deployment("gpu-operator", ns).spec.template.spec.containers[0].image
    assert image == f"{REGISTRY}/mirror-b/nvidia/gpu-operator:v23.9.2"

    proc = gi(env, *rerun)  # converged: nothing to do
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unchanged at revision 4" in proc.stdout and "no change" in proc.stdout, proc.stdout
    assert _helm_revisions(core, ns) == revs

    proc = gi(env, "uninstall", "--yes", "--delete-namespace", *base[:2])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for text in env["captured"]:
        assert env["password"] not in text
