"""Fixtures for the lab control-plane tests (gpu_install_lab/kube/).

One ControlPlane per test session, in a temporary lab dir, torn down (down()) at the end. The
first run on a machine builds kubernetes 1.20.2 from Debian's source package (~7 min on 2 cores;
cached afterwards in $GPU_INSTALL_CACHE or ~/.cache/gpu-install).

Skips (with the reason) when not root or when the binaries cannot be built -- unless CI or
GPU_INSTALL_REQUIRE_KUBERNETES is set in the environment: then a missing prerequisite is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpu_install_lab import kube
from installer.errors import GpuInstallError
from tests.conftest import need

# The lab nodes the tests register: two GPU nodes (one with MIG resources) and a CPU-only node.
NODES = [
    {"name": "gpu-a", "ip": "10.250.0.11", "gpus": 2, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    {
        "name": "gpu-b",
        "ip": "10.250.0.12",
        "gpus": 1,
        "labels": {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.5gb.count": "7"},
    },
    {"name": "cpu-c", "ip": "10.250.0.13", "gpus": 0, "labels": {}},
]


def _required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("GPU_INSTALL_REQUIRE_KUBERNETES"))


def _skip_or_fail(reason: str) -> None:
    need(False, reason, required=_required(), why_required="CI / GPU_INSTALL_REQUIRE_KUBERNETES")


def _prerequisites() -> Path:
    if os.geteuid() != 0:
        _skip_or_fail("the lab control plane needs root (network and mount namespaces)")
    missing = [t for t in ("ip", "nsenter", "unshare", "mount") if shutil.which(t) is None]
    if missing:
        _skip_or_fail(f"missing tools: {', '.join(missing)} (run scripts/bootstrap as root)")
    try:
        kube.etcd_binary()
        return kube.ensure_binaries(progress=lambda m: print(m, flush=True))
    except GpuInstallError as exc:
        _skip_or_fail(f"kubernetes {kube.KUBE_VERSION} binaries cannot be built: {exc}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def kube_bin() -> Path:
    return _prerequisites()


@pytest.fixture(scope="session")
def control_plane(kube_bin, tmp_path_factory):
    lab_dir = tmp_path_factory.mktemp("kube-lab")
    cp = kube.ControlPlane(lab_dir, progress=lambda m: print(m, flush=True))
    try:
        cp.up()
        cp.register_nodes(NODES)
        yield cp
    finally:
        cp.down()


class Kubectl:
    def __init__(self, binary: Path, kubeconfig: Path):
        self.binary, self.kubeconfig = binary, kubeconfig

    def run(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60):
        proc = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def json(self, *args: str):
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, manifest: dict, attempts: int = 20) -> None:
        """kubectl apply, retrying the transient errors of a fresh namespace (service account token)."""
        last = None
        for _ in range(attempts):
            proc = self.run("apply", "-f", "-", input=json.dumps(manifest), check=False)
            if proc.returncode == 0:
                return
            last = proc.stderr
            time.sleep(1)
        raise AssertionError(f"kubectl apply failed {attempts} times: {last}")


@pytest.fixture(scope="session")
def kubectl(control_plane, kube_bin) -> Kubectl:
    return Kubectl(kube_bin / "kubectl", control_plane.kubeconfig)


@pytest.fixture
def namespace(kubectl, request):
    name = "t-" + request.node.name.lower().replace("_", "-")[:50].strip("-")
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    # the tokens controller gives the default service account its token; pods need it
    deadline = time.time() + 60
    while time.time() < deadline:
        sa = kubectl.run("get", "serviceaccount", "default", "-n", name, "-o", "json", check=False)
        if sa.returncode == 0 and json.loads(sa.stdout).get("secrets"):
            break
        time.sleep(0.5)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", check=False)
