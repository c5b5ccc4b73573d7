"""Real Kubernetes nodes on docker: `lab up --kubernetes --kubelet real --runtime docker` (gpu_install_lab/kubelet.py).

A lab of its own with 1 debian12 node running dockerd 20.10 (Debian's docker.io, from the lab repo) and the real
kubelet 1.20.2 through its built-in dockershim (CNI bridge + host-local, the STAND-IN pause image as the pod infra
image), as sites on CentOS 7 + docker 20.10 run it. The node does NOT trust the lab CA: the pod's pull fails with
an x509 error until `gpu-install apply --skip-operator` with `runtime: docker` (docker_runtime + registry_trust roles:
daemon.json, /etc/docker/certs.d/<registry>/ca.crt); then the pod runs to completion, its log is read through the
apiserver and the image is in `docker images` on the node. Helpers come from test_lab_real_nodes.py; tests run in
file order and the last one takes the lab down and compares what is left with a snapshot taken before `up`.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.integration.conftest import VENV_BIN
from tests.integration.test_lab_real_nodes import (
    POD,
    _events,
    _gpu_pod,
    _pod_manifest,
    _wait_phase,
    down_leaves_nothing,
    kubectl,
    real_lab,
)
from tests.integration.test_runtime_roles import Applier, _ok, apply_inventory, root, write_site

pytestmark = pytest.mark.lab
NODES = ("node1",)


@pytest.fixture(scope="module")
def rl(tmp_path_factory):
    yield from real_lab(tmp_path_factory, "docker", len(NODES), runtime="docker")


def test_node_ready_on_docker_through_dockershim(rl):
    h = rl["h"]
    assert kubectl(rl, "get", "node", "node1", "-o",
                   "jsonpath={.status.conditions[?(@.type=='Ready')].status}").stdout == "True"
    info = json.loads(kubectl(rl, "get", "node", "node1", "-o", "jsonpath={.status.nodeInfo}").stdout)
    assert info["containerRuntimeVersion"].startswith("docker://20.10"), info
    assert info["kubeletVersion"] == "v1.20.2", info
    kubelet_args = root(h, "node1", "tr '\\0' ' ' < /proc/$(pidof kubelet)/cmdline").stdout
    reg = h.status["registry"]
    for flag in ("--container-runtime=docker", "--network-plugin=cni", "--cni-bin-dir=/usr/lib/cni",
                 f"--pod-infra-container-image={reg}/gpu-install-lab/pause:3.6"):
        assert flag in kubelet_args, kubelet_args
    # the kubelet's cgroup driver is docker's; dockerd runs as a systemd service (runc's stdin is not a tty)
    assert root(h, "node1", "docker info --format '{{.CgroupDriver}}'").stdout.strip() == "cgroupfs"
    assert root(h, "node1", "systemctl is-active docker containerd kubelet").stdout.split() == ["active"] * 3
    assert root(h, "node1", "readlink /proc/$(pidof dockerd)/fd/0").stdout.strip() == "/dev/null"
    # containerd is docker's (moby namespace), not the kubelet's: Debian's own config, not the lab's CRI one
    assert root(h, "node1", "grep -q gpu-install /etc/containerd/config.toml", check=False).returncode == 1
    print(f"BENCHMARK docker node Ready within lab up: {rl['up_seconds']:.1f}s", flush=True)


def test_status_shows_runtime_docker_active(rl):
    lab_dir = str(rl["h"].dir)
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", lab_dir, "status", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["kubelet"] == "real" and st["runtime"] == "docker"
    for n in st["nodes"]:
        assert n["kubelet"] == "active" and n["ready"] is True, n
        assert n["runtime"].startswith("docker 20.10") and n["runtime"].endswith(" active"), n
    text = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", lab_dir, "status"],
                          capture_output=True, text=True, timeout=120).stdout
    assert "real kubelets on docker" in text and "docker 20.10" in text, text


def test_second_up_keeps_docker_and_refuses_another_runtime(rl):
    h = rl["h"]

    def pids() -> dict[str, int]:
        return {r["key"]: r["pid"] for r in h.lab.state().resources if r["kind"] == "process"}

    before = pids()
    status = h.lab.up(count=len(NODES), flavours=["debian12"], kubernetes=True, kubelet="real", runtime="docker")
    assert pids() == before and all(n["ready"] for n in status["nodes"]), status["nodes"]
    # containerd is the default runtime: asking for it (or naming it) on a docker lab is refused, exit 2
    for extra in ([], ["--runtime", "containerd"]):
        proc = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(h.dir), "up", "--nodes",
                               str(len(NODES)), "--kubernetes", "--kubelet", "real", *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc
        assert "real nodes run docker, not containerd" in proc.stderr and "lab down" in proc.stderr, proc.stderr
    assert pids() == before


def test_pull_fails_with_x509_before_apply(rl):
    from gpu_install_lab import images

    h = rl["h"]
    reg = h.status["registry"]
    assert root(h, "node1", f"curl -sS https://{reg}/v2/", check=False).returncode != 0
    assert root(h, "node1", "ls -A /usr/local/share/ca-certificates/; ls -A /etc/docker/certs.d 2>&1",
                check=False).stdout.strip() == "ls: cannot access '/etc/docker/certs.d': No such file or directory"
    kubectl(rl, "apply", "-f", "-", input=_pod_manifest(f"{reg}/{images.HELLO[0]}:{images.HELLO[1]}"))
    deadline = time.monotonic() + 90
    while "x509" not in (ev := _events(rl)):
        assert time.monotonic() < deadline, ev
        time.sleep(2)
    # dockershim pulls the pod infra (pause) image first: that pull is the one refused
    assert "certificate signed by unknown authority" in ev and f"{reg}/gpu-install-lab/pause:3.6" in ev, ev
    assert kubectl(rl, "get", "pod", POD, "-o", "jsonpath={.status.phase}").stdout == "Pending"
    assert root(h, "node1", "docker images -q").stdout.strip() == ""


def test_after_apply_the_pod_runs_and_logs(rl):
    from gpu_install_lab import images, kubelet

    h, work = rl["h"], rl["work"]
    reg = h.status["registry"]
    site = write_site(work, "docker", host=reg, ca=str(h.ca))  # toolkit.mode host: docker_runtime runs
    t0 = time.monotonic()
    _ok(Applier(apply_inventory(h, work), work / "state")(site))
    print(f"BENCHMARK gpu-install apply --skip-operator (runtime docker, 1 node): {time.monotonic() - t0:.1f}s",
          flush=True)
    assert root(h, "node1", f"cat /etc/docker/certs.d/{reg}/ca.crt").stdout == h.ca.read_text()
    daemon = json.loads(root(h, "node1", "cat /etc/docker/daemon.json").stdout)
    assert daemon["default-runtime"] == "nvidia" and "nvidia" in daemon["runtimes"], daemon
    assert daemon["exec-opts"] == ["native.cgroupdriver=cgroupfs"] and daemon["bridge"] == "none", daemon
    deadline = time.monotonic() + 150
    while (phase := kubectl(rl, "get", "pod", POD, "-o", "jsonpath={.status.phase}").stdout) != "Succeeded":
        assert phase in ("Pending", "Running") and time.monotonic() < deadline, (phase, _events(rl))
        time.sleep(2)
    print(f"pod {POD} Succeeded {time.monotonic() - t0:.1f}s after apply started", flush=True)
    pod = json.loads(kubectl(rl, "get", "pod", POD, "-o", "json").stdout)
    assert pod["status"]["podIP"].startswith("10.244."), pod["status"]
    status = pod["status"]["containerStatuses"][0]
    assert status["containerID"].startswith("docker://") and status["state"]["terminated"]["exitCode"] == 0, status
    # through the apiserver (its egress proxy reaches the kubelet's :10250; dockershim reads docker's log)
    assert images.HELLO_TEXT in kubectl(rl, "logs", POD).stdout
    pulled = root(h, "node1", "docker images --format '{{.Repository}}:{{.Tag}}'").stdout.split()
    assert f"{reg}/{images.HELLO[0]}:{images.HELLO[1]}" in pulled and f"{reg}/gpu-install-lab/pause:3.6" in pulled
    # the pod sandbox went through the default runtime (nvidia STAND-IN -> runc) and the lab's runc shim, which
    # clamped the kubelet's -998 (runc cannot set it without CAP_SYS_RESOURCE)
    shim = root(h, "node1", f"cat {kubelet.RUNC_SHIM_LOG}").stdout
    assert "oomScoreAdj -998 -> " in shim, shim


def test_gpu_pod_on_docker_sees_exactly_its_gpu(rl):
    """The STAND-IN device plugin's Allocate through dockershim: NVIDIA_VISIBLE_DEVICES and the stand-in nvidia-smi
    mount reach the container; the smoke image (pulled by dockerd after apply) lists the node's one GPU."""
    import re

    from gpu_install_lab import gpus
    from gpu_install_lab.smoke_image import RESULT_PREFIX, smoke_image_ref
    from installer.config import Registry

    image = smoke_image_ref("v23.9.2", Registry(host=rl["h"].status["registry"]))
    kubectl(rl, "apply", "-f", "-", input=_gpu_pod("smoke", image, 1, "node1"))
    _wait_phase(rl, "smoke", "Succeeded")
    log = kubectl(rl, "logs", "smoke").stdout
    want = gpus.node_config(rl["lid"], "node1", 1)["gpus"][0]
    assert re.findall(r"^GPU \d+: (.+) \(UUID: (GPU-[0-9a-f-]+)\)$", log, re.M) == [(want["model"], want["uuid"])], log
    assert f"{RESULT_PREFIX} PASSED: 1 GPU(s) visible" in log, log


def test_validate_runtime_layer_reads_dockers_own_view(rl):
    """`validate --only runtime` on the docker node after apply: `docker info` (the running daemon, not daemon.json)
    has the nvidia runtime as default and its binary is on the node. dockerd stopped (socket too, so `docker info`
    cannot start it): runtime.present fails with the docker client's own message, exit 6; started again, the node is
    Ready again."""
    h, work = rl["h"], rl["work"]
    site = work / "site-docker.yaml"

    def validate(*extra: str) -> tuple[subprocess.CompletedProcess, dict]:
        out = work / "validate-runtime.json"
        out.unlink(missing_ok=True)
        proc = subprocess.run([str(VENV_BIN / "gpu-install"), "validate", "-s", str(site), "-i",
                               str(work / "inventory"), "--only", "runtime", "--json", str(out), *extra],
                              capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc, json.loads(out.read_text()) if out.exists() else {}

    proc, report = validate()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by = {c["check"]: c for c in report["checks"]}
    assert by["runtime.present"]["message"] == "docker answers" and by["runtime.default"]["status"] == "pass", by
    assert {c["status"] for c in report["checks"]} == {"pass"}, report
    # dockerd stopped: the daemon's own error, exit 6
    root(h, "node1", "systemctl stop docker.socket docker")
    try:
        proc, report = validate()
        assert proc.returncode == 6, proc.stdout + proc.stderr
        present = {c["check"]: c for c in report["checks"]}["runtime.present"]
        assert present["status"] == "fail" and "Cannot connect to the Docker daemon" in present["message"], present
    finally:
        root(h, "node1", "systemctl start docker")
        deadline = time.monotonic() + 90
        while kubectl(rl, "get", "node", "node1", "-o",
                      "jsonpath={.status.conditions[?(@.type=='Ready')].status}").stdout != "True":
            assert time.monotonic() < deadline
            time.sleep(1)


def test_zz_down_leaves_nothing(rl):
    down_leaves_nothing(rl)
