"""docs/upgrade.md "Rolling back", done as the page says, against the lab's real kube-apiserver and real helm with the
REAL GPU Operator charts (../shared/upstream/charts): v22.9.2 installed, upgraded to v23.9.2, then the site file's
previous release and chart given back. The new chart with the old release is refused before anything is touched
(exit 2); the rollback is a new Helm revision with the previous chart, the previous release's CRDs applied
server-side (the ClusterPolicy schema is v22.9.2's again), and a second run changes nothing.

The operator stage of `apply` and `operator install` share this path (installer/operator.py); `operator install` is
run here because the lab's hollow nodes have nothing for apply's node stages to do. --no-wait: nothing really runs on
hollow nodes (test_operator_crds.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import need, needs_upstream
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
