"""`gpu-install lab up --kubernetes --kubelet real --gpu-model "NVIDIA H100 80GB HBM3"`: a lab node that looks like
today's datacenter nodes. Its STAND-IN nvidia-smi renders the real H100's driver-580 document
(tests/fixtures/nvidia-smi/README.md), the STAND-IN device plugin advertises the GPU to the real kubelet, and
`gpu-install validate --only node` reads the node over SSH as NVML read the real machine (thresholds 89 / 95 / 87 C
from the T.Limit margins, driver 580.159.04, MIG off).

A lab of its own: one debian12 node, taken down at the end.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.integration.conftest import VENV_BIN, LabHandle, _skip_or_fail, lab_prerequisites
from tests.integration.test_runtime_roles import apply_inventory, root, write_site

pytestmark = pytest.mark.lab
MODEL = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab_prerequisites()
    from gpu_install_lab import kube
    from gpu_install_lab.lab import Lab
    from installer.errors import GpuInstallError

    try:
        kube.ensure_binaries(progress=lambda m: print(m, flush=True))
    except GpuInstallError as exc:
        _skip_or_fail(f"kubernetes binaries (with the kubelet) cannot be built: {exc}")
    lab_dir = tmp_path_factory.mktemp("h100lab") / "lab"
    the_lab = Lab(lab_dir, progress=lambda m: print(m, flush=True))
    try:
        t0 = time.monotonic()
        status = the_lab.up(count=1, flavours=["debian12"], kubernetes=True, kubelet="real", gpu_model=MODEL)
        print(f"BENCHMARK lab up --kubelet real --gpu-model H100, 1 node: {time.monotonic() - t0:.1f}s", flush=True)
        yield {"h": LabHandle(the_lab, lab_dir, status), "work": tmp_path_factory.mktemp("h100work")}
    finally:
        the_lab.down()


def test_node_advertises_its_h100(lab):
    from gpu_install_lab.kube import bin_dir

    h = lab["h"]
    proc = subprocess.run([str(bin_dir() / "kubectl"), "--kubeconfig", str(h.dir / "kube" / "kubeconfig"), "get",
                           "node", "node1", "-o", "json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"]["allocatable"]["nvidia.com/gpu"] == "1"


def test_nodes_nvidia_smi_is_the_real_h100s(lab):
    from installer.validate.nvsmi import parse_xml

    h = lab["h"]
    listed = root(h, "node1", "nvidia-smi -L").stdout
    assert listed.startswith(f"GPU 0: {MODEL} (UUID: GPU-"), listed
    plain = root(h, "node1", "nvidia-smi").stdout.splitlines()
    assert plain[2] == "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |"
    assert plain[8].startswith(f"|   0  {MODEL}          On  |"), plain
    doc = parse_xml(root(h, "node1", "nvidia-smi -q -x").stdout)
    assert (doc.driver_version, doc.cuda_version, doc.dtd_version) == ("580.159.04", "13.0", 13)
    [gpu] = doc.gpus
    assert gpu.product_name == MODEL
    assert (gpu.slowdown_temp_c, gpu.shutdown_temp_c, gpu.max_operating_temp_c) == (89, 95, 87)
    assert (gpu.mig_current, gpu.mig_pending, gpu.retired_pages) == (False, False, None)


def test_validate_node_layer_reads_the_h100_node(lab):
    """validate --only node over SSH: the driver pin is the node's (580.159.04), every node check passes."""
    h, work = lab["h"], lab["work"]
    site = write_site(work, "containerd", host=h.status["registry"], ca=str(h.ca))
    inv = apply_inventory(h, work)
    out = work / "validate.json"
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "validate", "-s", str(site), "-i", str(inv), "--only", "node",
                           "--set", "driver.version=580.159.04", "--json", str(out), "--timeout", "120"],
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(out.read_text())
    by = {c["check"]: c for c in report["checks"] if c["node"] == "node1"}
    assert by["node.nvidia-smi"]["message"] == "1 GPU(s), driver 580.159.04, CUDA 13.0", by["node.nvidia-smi"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(c["status"] == "pass" for c in by.values()), by
