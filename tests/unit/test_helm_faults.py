"""helm upgrade --install against an API server that is not there (the real helm binary, pyhelm3, a kubeconfig
naming a closed port on 127.0.0.1) and helm's words for an API server lost mid-request: exit 5 with how to resume,
never an internal error. The API server killed during an upgrade, and the re-run that recovers the pending release,
are tested on the lab (tests/integration/test_operator_install.py)."""

from __future__ import annotations

import socket

import pytest
import yaml

from installer import helm
from installer.errors import EXIT_CLUSTER, EXIT_UNREACHABLE, ClusterUnreachable
from installer.tools import find_helm
from tests.conftest import ROOT, need

CHART = ROOT / "tests" / "fixtures" / "charts" / "gpu-operator-fixture"
pytestmark = pytest.mark.helm


@pytest.fixture
def dead_kubeconfig(tmp_path):
    """A kubeconfig whose server is a port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    need(find_helm(), "helm not installed (scripts/bootstrap installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                  "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "u"}}],
    }))
    return kc, port


def test_upgrade_without_an_api_server_is_exit_5_with_how_to_resume(dead_kubeconfig):
    kc, port = dead_kubeconfig
    with pytest.raises(ClusterUnreachable) as err:
        helm.install_or_upgrade(CHART, "gpu-operator", "gpu-operator", {}, kc, timeout=30)
    exc = err.value
    assert exc.exit_code == EXIT_UNREACHABLE == 5
    assert exc.message.startswith("helm upgrade --install gpu-operator failed: the Kubernetes API server cannot be "
                                  "reached"), exc.message
    assert f"127.0.0.1:{port}" in exc.message and "connection refused" in exc.message, exc.message
    assert "the API server still cannot be reached" in exc.message, exc.message
    assert exc.hint and "re-running is safe" in exc.hint and "pending-upgrade is rolled back" in exc.hint
    assert "not-a-secret" not in str(exc)


@pytest.mark.parametrize("said", [
    # what helm 3.18 printed on the lab when kube-apiserver was killed while it stored the new revision
    'Error: UPGRADE FAILED: create: failed to create: Post "https://127.0.0.1:41995/api/v1/namespaces/ns/secrets": '
    "unexpected EOF",
    'Error: UPGRADE FAILED: Get "https://127.0.0.1:6443/apis/apps/v1/namespaces/ns/deployments/x": dial tcp '
    "127.0.0.1:6443: connect: connection refused",
    "Error: UPGRADE FAILED: http2: client connection lost",
    "Error: Kubernetes cluster unreachable: read tcp 127.0.0.1:1->127.0.0.1:6443: read: connection reset by peer",
])
def test_helm_losing_the_api_server_is_exit_5(said):
    exc = helm._helm_error("helm upgrade --install r", RuntimeError(said), hint="h", unreachable_hint="resume")
    assert exc.exit_code == EXIT_UNREACHABLE
    assert "the Kubernetes API server cannot be reached" in exc.message and said in exc.message
    assert exc.hint == "resume"


def test_other_helm_errors_stay_exit_7():
    exc = helm._helm_error("helm upgrade --install r", RuntimeError("Error: UPGRADE FAILED: values don't meet the "
                                                                     "specifications of the schema"), hint="h")
    assert exc.exit_code == EXIT_CLUSTER and exc.hint == "h"


def test_the_fix_for_a_pending_release_is_the_helm_command_that_makes_it_proceedable(tmp_path):
    kc = tmp_path / "kc"
    assert helm._fix_pending("r", "ns", "pending-upgrade", kc) == f"helm rollback r -n ns --wait --kubeconfig {kc}"
    assert helm._fix_pending("r", "ns", "pending-rollback", None) == "helm rollback r -n ns --wait"
    assert helm._fix_pending("r", "ns", "pending-install", None) == "helm uninstall r -n ns --wait"
