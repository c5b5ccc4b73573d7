"""Real Kubernetes nodes: `lab up --kubernetes --kubelet real` (gpu_install_lab/kubelet.py).

A lab of its own: 2 debian12 nodes, each running the real kubelet 1.20.2 with the node's own containerd
(Debian's, from the lab repo) and CNI bridge + host-local, joined to the lab control plane with its own client
certificate. The nodes do NOT trust the lab CA: a pod's image pull fails with an x509 error until
`gpu-install apply --skip-operator` (containerd_runtime + registry_trust roles) installed the CA and the
containerd registry config; then the pod runs to completion and its log holds its output. Tests run in file
order; the last one takes the lab down and compares what is left with a snapshot taken before `up`.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import VENV_BIN, LabHandle, _skip_or_fail, lab_prerequisites
from tests.integration.test_runtime_roles import Applier, _ok, apply_inventory, root, write_site

pytestmark = pytest.mark.lab
NODES = ("node1", "node2")
POD = "hello"


def _snapshot(lab_dir: Path) -> dict[str, set[str]]:
    """What a lab can leave behind on this machine. Other labs may run beside this one: tests compare
    the entries that are new and name this lab (its id, its directory)."""
    with open("/proc/self/mountinfo") as fh:
        mounts = {line.split()[4] for line in fh}
    procs = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            procs.add(f"{pid} {cmd}")
    return {
        "mounts": mounts,
        "netns": set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set(),
        "links": set(os.listdir("/sys/class/net")),
        "cgroups": set(glob.glob("/sys/fs/cgroup/*/gpu-install-lab/*")) | set(glob.glob("/sys/fs/cgroup/*/kubepods*")),
        "processes": procs,
        "iptables": _iptables(),
    }


def _iptables() -> set[str]:
    """The host's iptables rules and chains (filter, nat, mangle), counters stripped."""
    import re
    import shutil

    if shutil.which("iptables-save") is None:
        return set()
    out = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    return {re.sub(r" \[\d+:\d+\]$", "", line) for line in out.splitlines() if line[:1] in (":", "-")}


def _ours(lab_dir: Path, lid: str, kube_netns: str, entry: str) -> bool:
    return (str(lab_dir) in entry or lid in entry or kube_netns in entry or "kubepods" in entry
            # rules a kubelet, CNI or the pods' network would add if they reached the host's tables
            or any(k in entry for k in ("KUBE-", "CNI-", "10.244.", "cni0")))


def real_lab(tmp_path_factory, name: str, count: int, runtime: str = "containerd"):
    """A module's lab of real-kubelet nodes (a generator for a module-scoped fixture): up, then down at the end.
    Yields the dict the tests take: handle, work dir, the leak snapshot taken before up, lab id, kube netns."""
    lab_prerequisites()
    from gpu_install_lab import kube, net
    from gpu_install_lab.lab import Lab
    from installer.errors import GpuInstallError

    try:
        kube.ensure_binaries(progress=lambda m: print(m, flush=True))
    except GpuInstallError as exc:
        _skip_or_fail(f"kubernetes binaries (with the kubelet) cannot be built: {exc}")
    lab_dir = tmp_path_factory.mktemp(f"{name}lab") / "lab"
    before = _snapshot(lab_dir)
    the_lab = Lab(lab_dir, progress=lambda m: print(m, flush=True))
    try:
        t0 = time.monotonic()
        status = the_lab.up(count=count, flavours=["debian12"], kubernetes=True, kubelet="real", runtime=runtime)
        took = time.monotonic() - t0
        print(f"BENCHMARK lab up --kubernetes --kubelet real --runtime {runtime}, {count} node(s): {took:.1f}s "
              "(target 90s for 2 nodes after the first build)", flush=True)
        from gpu_install_lab.kube.controlplane import ControlPlane

        yield {"h": LabHandle(the_lab, lab_dir, status), "work": tmp_path_factory.mktemp(f"{name}work"),
               "before": before, "lid": net.lab_id(lab_dir), "kube_netns": ControlPlane(lab_dir).netns,
               "up_seconds": took}
    finally:
        the_lab.down()


@pytest.fixture(scope="module")
def rl(tmp_path_factory):
    yield from real_lab(tmp_path_factory, "real", len(NODES))


def kubectl(rl, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    from gpu_install_lab.kube import bin_dir

    h = rl["h"]
    proc = subprocess.run([str(bin_dir() / "kubectl"), "--kubeconfig", str(h.dir / "kube" / "kubeconfig"), *args],
                          capture_output=True, text=True, input=input, timeout=60)
    if check:
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc


def test_two_real_nodes_ready_with_own_identity(rl):
    nodes = json.loads(kubectl(rl, "get", "nodes", "-o", "json").stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == list(NODES)
    for n in nodes:
        ready = {c["type"]: c["status"] for c in n["status"]["conditions"]}["Ready"]
        assert ready == "True", n["status"]["conditions"]
        info = n["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.20.2" and info["containerRuntimeVersion"].startswith("containerd://1.6")
        assert n["metadata"]["labels"]["gpu-install.lab/kubelet"] == "real"
        assert "gpu-install.lab/hollow-node" not in n["metadata"]["labels"]
        ips = {a["type"]: a["address"] for a in n["status"]["addresses"]}
        assert ips["InternalIP"] == rl["h"].nodes[n["metadata"]["name"]]["ip"]
    # each kubelet is system:node:<name> (Node authorizer + NodeRestriction): node1's credentials may label
    # node1 but not node2
    conf = json.loads(root(rl["h"], "node1", "cat /etc/kubernetes/kubelet.conf").stdout)
    assert conf["users"][0]["name"] == "system:node:node1"
    admin = json.loads((rl["h"].dir / "kube" / "kubeconfig").read_text())
    conf["clusters"][0]["cluster"]["server"] = admin["clusters"][0]["cluster"]["server"]  # the host's side
    node_kc = rl["work"] / "node1.kubeconfig"
    node_kc.write_text(json.dumps(conf))
    from gpu_install_lab.kube import bin_dir

    def as_node1(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir() / "kubectl"), "--kubeconfig", str(node_kc), *args],
                              capture_output=True, text=True, timeout=60)

    assert as_node1("label", "node", "node1", "gpu-install.lab/probe=1", "--overwrite").returncode == 0
    other = as_node1("label", "node", "node2", "gpu-install.lab/probe=1", "--overwrite")
    assert other.returncode != 0 and "Forbidden" in other.stderr, other


def test_status_shows_kubelet_runtime_ready(rl):
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(rl["h"].dir), "status", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["kubelet"] == "real"
    for n in st["nodes"]:
        assert n["kubelet"] == "active" and n["ready"] is True, n
        assert n["runtime"].startswith("containerd 1.6") and n["runtime"].endswith("active"), n
        assert n["device_plugin"] == "active" and n["gpus"] == "1", n
    text = subprocess.run([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(rl["h"].dir), "status"],
                          capture_output=True, text=True, timeout=120).stdout
    assert "kubelet" in text and "ready" in text and "plugin" in text and "gpus" in text


def test_second_up_is_a_noop(rl):
    from installer.errors import ConfigError

    h = rl["h"]

    def pids() -> dict[str, int]:
        return {r["key"]: r["pid"] for r in h.lab.state().resources if r["kind"] == "process"}

    before = pids()
    t0 = time.monotonic()
    status = h.lab.up(count=2, flavours=["debian12"], kubernetes=True, kubelet="real")
    print(f"BENCHMARK second lab up --kubelet real: {time.monotonic() - t0:.1f}s", flush=True)
    assert pids() == before  # nothing restarted
    assert all(n["ready"] and n["kubelet"] == "active" for n in status["nodes"]), status["nodes"]
    try:
        h.lab.up(count=2, flavours=["debian12"], kubernetes=True, kubelet="hollow")
    except ConfigError as exc:
        assert "real kubelet" in exc.message
    else:
        raise AssertionError("a real-node lab accepted --kubelet hollow")


def _pod_manifest(image: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": "default"},
                       "spec": {"restartPolicy": "Never", "dnsPolicy": "Default",
                                "nodeSelector": {"kubernetes.io/hostname": "node1"},
                                "containers": [{"name": POD, "image": image}]}})


def _events(rl) -> str:
    return kubectl(rl, "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={POD}",
                   "-o", "jsonpath={range .items[*]}{.reason}: {.message}{'\\n'}{end}").stdout


def test_pull_fails_with_x509_before_apply(rl):
    from gpu_install_lab import images

    h = rl["h"]
    reg = h.status["registry"]
    # nothing on the node trusts the lab CA
    assert root(h, "node1", f"curl -sS https://{reg}/v2/", check=False).returncode != 0
    assert root(h, "node1", "ls -A /usr/local/share/ca-certificates/; ls -A /etc/containerd/certs.d 2>&1", check=False).stdout.strip() \
        == "ls: cannot access '/etc/containerd/certs.d': No such file or directory"
    kubectl(rl, "apply", "-f", "-", input=_pod_manifest(f"{reg}/{images.HELLO[0]}:{images.HELLO[1]}"))
    deadline = time.monotonic() + 90
    while "x509" not in (ev := _events(rl)):
        assert time.monotonic() < deadline, ev
        time.sleep(2)
    assert "certificate signed by unknown authority" in ev, ev
    assert kubectl(rl, "get", "pod", POD, "-o", "jsonpath={.status.phase}").stdout == "Pending"


def test_after_apply_the_pod_runs_and_logs(rl):
    from gpu_install_lab import images

    h, work = rl["h"], rl["work"]
    reg = h.status["registry"]
    site = write_site(work, "containerd", host=reg, ca=str(h.ca))
    # toolkit.mode operator, the default (the GPU Operator's toolkit container configures the runtime): no
    # containerd_runtime role runs, so only registry_trust can make containerd trust the CA -- it restarts containerd,
    # which reads the OS trust store when it starts
    doc = yaml.safe_load(site.read_text())
    doc["toolkit"] = {"mode": "operator"}
    site.write_text(yaml.safe_dump(doc))
    apply = Applier(apply_inventory(h, work), work / "state")
    _ok(apply(site))
    hosts = root(h, "node1", f"cat /etc/containerd/certs.d/{reg}/hosts.toml").stdout
    assert f'ca = "/etc/containerd/certs.d/{reg}/ca.crt"' in hosts
    deadline = time.monotonic() + 150
    while (phase := kubectl(rl, "get", "pod", POD, "-o", "jsonpath={.status.phase}").stdout) != "Succeeded":
        assert phase in ("Pending", "Running") and time.monotonic() < deadline, (phase, _events(rl))
        time.sleep(2)
    pod = json.loads(kubectl(rl, "get", "pod", POD, "-o", "json").stdout)
    assert pod["status"]["podIP"].startswith("10.244."), pod["status"]
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0, term
    # the container's log as the kubelet wrote it (CRI log format) on the node
    uid = pod["metadata"]["uid"]
    log = root(h, "node1", f"cat /var/log/pods/default_{POD}_{uid}/{POD}/0.log").stdout
    assert f"stdout F {images.HELLO_TEXT}" in log, log
    assert "stdout F hello\n" in log + "\n"  # the container's own hostname: the pod name
    # and through the apiserver (its egress proxy lets it reach the real nodes on the lab bridge, nothing else)
    assert images.HELLO_TEXT in kubectl(rl, "logs", POD).stdout
    pulled = root(h, "node1", "ctr -n k8s.io images ls -q").stdout
    assert f"{reg}/{images.HELLO[0]}:{images.HELLO[1]}" in pulled


def _gpu_pod(name: str, image: str, gpus: int, node: str | None = None) -> str:
    spec: dict = {"restartPolicy": "Never", "dnsPolicy": "Default",
                  "containers": [{"name": name, "image": image, "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                       "spec": spec})


def _wait_phase(rl, pod: str, want: str, timeout: float = 150) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        doc = json.loads(kubectl(rl, "get", "pod", pod, "-o", "json").stdout)
        phase = doc["status"].get("phase")
        if phase == want:
            return doc
        assert phase in ("Pending", "Running") and time.monotonic() < deadline, (phase, doc["status"])
        time.sleep(1)


def test_gpu_pod_runs_the_smoke_image_and_sees_one_gpu(rl):
    """After apply (the CA trusted): a pod asking nvidia.com/gpu: 1 gets it from the node's STAND-IN device plugin
    and runs the STAND-IN CUDA smoke image, pulled from the site registry at the release's CUDA image path; its
    log lists exactly the one GPU allocated to it (the stand-in nvidia-smi Allocate mounted)."""
    import re

    from gpu_install_lab import gpus
    from gpu_install_lab.smoke_image import RESULT_PREFIX, smoke_image_ref
    from installer.config import Registry

    h = rl["h"]
    reg = h.status["registry"]
    for n in json.loads(kubectl(rl, "get", "nodes", "-o", "json").stdout)["items"]:
        assert n["status"]["allocatable"].get("nvidia.com/gpu") == "1", n["status"]["allocatable"]
    image = smoke_image_ref("v23.9.2", Registry(host=reg))
    assert image == f"{reg}/nvidia/cuda:12.3.2-base-ubi8"
    kubectl(rl, "apply", "-f", "-", input=_gpu_pod("smoke", image, 1, "node1"))
    pod = _wait_phase(rl, "smoke", "Succeeded")
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    log = kubectl(rl, "logs", "smoke").stdout
    listed = re.findall(r"^GPU \d+: (.+) \(UUID: (GPU-[0-9a-f-]+)\)$", log, re.M)
    want = gpus.node_config(rl["lid"], "node1", 1)["gpus"][0]
    assert listed == [(want["model"], want["uuid"])], log
    assert f"{RESULT_PREFIX} PASSED: 1 GPU(s) visible (NVIDIA_VISIBLE_DEVICES={want['uuid']})" in log, log
    kubectl(rl, "delete", "pod", "smoke", "--wait=false")


def test_two_gpus_on_one_gpu_nodes_stay_pending(rl):
    from gpu_install_lab.smoke_image import smoke_image_ref
    from installer.config import Registry

    image = smoke_image_ref("v23.9.2", Registry(host=rl["h"].status["registry"]))
    kubectl(rl, "apply", "-f", "-", input=_gpu_pod("two-gpus", image, 2))
    deadline = time.monotonic() + 60
    while True:
        doc = json.loads(kubectl(rl, "get", "pod", "two-gpus", "-o", "json").stdout)
        cond = {c["type"]: c for c in doc["status"].get("conditions", [])}.get("PodScheduled")
        if cond and cond["status"] == "False" and "Insufficient nvidia.com/gpu" in cond.get("message", ""):
            break
        assert time.monotonic() < deadline, doc["status"]
        time.sleep(1)
    assert doc["status"]["phase"] == "Pending" and not doc["spec"].get("nodeName"), doc
    assert cond["reason"] == "Unschedulable" and "2 Insufficient nvidia.com/gpu" in cond["message"], cond
    kubectl(rl, "delete", "pod", "two-gpus", "--wait=false")


def test_unhealthy_gpu_leaves_allocatable(rl):
    """A GPU marked unhealthy in the node's lab config goes Unhealthy through ListAndWatch: the kubelet drops it from
    allocatable (capacity keeps it); healthy again, it comes back."""
    import yaml as _yaml

    from gpu_install_lab import gpus

    h = rl["h"]
    path = gpus.CONFIG_PATH
    doc = _yaml.safe_load(root(h, "node2", f"cat {path}").stdout)

    def write(healthy: bool) -> None:
        doc["gpus"][0]["healthy"] = healthy
        root(h, "node2", f"cat > {path}.tmp && mv {path}.tmp {path}", input=_yaml.safe_dump(doc))

    def wait_alloc(want: str) -> dict:
        deadline = time.monotonic() + 60
        while True:
            st = json.loads(kubectl(rl, "get", "node", "node2", "-o", "json").stdout)["status"]
            if st["allocatable"].get("nvidia.com/gpu") == want:
                return st
            assert time.monotonic() < deadline, st["allocatable"]
            time.sleep(0.5)

    write(False)
    st = wait_alloc("0")
    assert st["capacity"]["nvidia.com/gpu"] == "1", st["capacity"]
    write(True)
    wait_alloc("1")


def test_mig_devices_advertised_and_allocated_mixed_strategy(rl):
    """node2 given MIG devices (its lab config, as `lab up --mig 1g.10gb=2` writes it): the kubelet advertises
    nvidia.com/mig-1g.10gb (and the GPU no longer as nvidia.com/gpu); a pod asking one runs the smoke image and its
    nvidia-smi -L lists the parent GPU and exactly the MIG device it was given."""
    import re

    import yaml as _yaml

    from gpu_install_lab import gpus
    from gpu_install_lab.smoke_image import RESULT_PREFIX, smoke_image_ref
    from installer.config import Registry

    h = rl["h"]
    old = root(h, "node2", f"cat {gpus.CONFIG_PATH}").stdout
    cfg = gpus.node_config(rl["lid"], "node2", 1, mig={"1g.10gb": 2})
    assert gpus.expected_resources(cfg) == {"nvidia.com/mig-1g.10gb": 2}
    root(h, "node2", f"cat > {gpus.CONFIG_PATH}.tmp && mv {gpus.CONFIG_PATH}.tmp {gpus.CONFIG_PATH}",
         input=_yaml.safe_dump(cfg))
    try:
        deadline = time.monotonic() + 60
        while True:
            alloc = json.loads(kubectl(rl, "get", "node", "node2", "-o", "json").stdout)["status"]["allocatable"]
            if alloc.get("nvidia.com/mig-1g.10gb") == "2" and alloc.get("nvidia.com/gpu", "0") == "0":
                break
            assert time.monotonic() < deadline, alloc
            time.sleep(0.5)
        image = smoke_image_ref("v23.9.2", Registry(host=h.status["registry"]))
        pod = json.loads(_gpu_pod("mig", image, 1, "node2"))
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": 1}}
        kubectl(rl, "apply", "-f", "-", input=json.dumps(pod))
        _wait_phase(rl, "mig", "Succeeded")
        log = kubectl(rl, "logs", "mig").stdout
        gpu = cfg["gpus"][0]
        assert re.findall(r"^GPU \d+: .* \(UUID: (\S+)\)$", log, re.M) == [gpu["uuid"]], log
        migs = re.findall(r"^  MIG 1g\.10gb +Device +\d+: \(UUID: (MIG-[0-9a-f-]+)\)$", log, re.M)
        assert len(migs) == 1 and migs[0] in {m["uuid"] for m in gpu["mig"]}, log
        assert f"{RESULT_PREFIX} PASSED: 1 GPU(s) visible (NVIDIA_VISIBLE_DEVICES={migs[0]})" in log, log
        kubectl(rl, "delete", "pod", "mig", "--wait=false")
    finally:
        root(h, "node2", f"cat > {gpus.CONFIG_PATH}.tmp && mv {gpus.CONFIG_PATH}.tmp {gpus.CONFIG_PATH}", input=old)
        _wait_alloc(rl, "node2", {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "0"})


def _wait_alloc(rl, node: str, want: dict[str, str], timeout: float = 60) -> None:
    """Until the node's allocatable has those counts (a missing resource counts as "0")."""
    deadline = time.monotonic() + timeout
    while True:
        alloc = json.loads(kubectl(rl, "get", "node", node, "-o", "json").stdout)["status"]["allocatable"]
        if all(alloc.get(r, "0") == n for r, n in want.items()):
            return
        assert time.monotonic() < deadline, alloc
        time.sleep(0.5)


def _validate(rl, *extra: str, inventory: Path | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """`gpu-install validate` against the real nodes, with the apply test's site file."""
    h, work = rl["h"], rl["work"]
    out = work / "validate.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "validate", "-s", str(work / "site-containerd.yaml"),
                           "-i", str(inventory or work / "inventory"), "--kubeconfig", str(h.dir / "kube" / "kubeconfig"),
                           "--json", str(out), "--junit", str(work / "validate.xml"), "--timeout", "120", *extra],
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(out.read_text()) if out.exists() else {}


def _by(report: dict, check: str) -> dict[str, dict]:
    return {c["node"]: c for c in report["checks"] if c["check"] == check}


def test_validate_passes_on_the_real_nodes(rl):
    """`gpu-install validate` after apply: both nodes Ready with a GPU allocatable, and the smoke pod on each (CUDA
    image: nvidia-smi -L, validator image: vectorAdd -- the STAND-IN images at the release's paths) passes. The
    operator is not installed on the lab (its 1.20 API server; apply --skip-operator): the smoke pods run in the
    operator's namespace, created here as `operator install` would."""
    import xml.etree.ElementTree as ET

    kubectl(rl, "create", "namespace", "gpu-operator")
    # the STAND-IN GPUs report driver 535.54.03; the site's release (v24.9.2) pins 550.144.03 for the driver image
    # the runtime layer is left out: with toolkit.mode operator the operator's toolkit configures the nvidia runtime,
    # and the operator is not on the lab (test_validate_runtime_layer_without_the_operators_toolkit_is_exit_6)
    proc, report = _validate(rl, "--set", "driver.version=535.54.03", "--only", "node,cluster,smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["schema"] == "gpu-install.validate/v1" and report["exitCode"] == 0
    assert report["layers"] == ["node", "cluster", "smoke"]
    smi = _by(report, "node.nvidia-smi")
    assert smi["node1"]["message"] == "1 GPU(s), driver 535.54.03, CUDA 12.2", smi
    for check in ("node.reachable", "node.nvidia-smi", "node.driver.version", "node.gpu.ecc-dbe",
                  "cluster.node-ready", "cluster.gpu-allocatable", "cluster.gpu-count", "smoke.gpu-pod"):
        by = _by(report, check)
        assert sorted(by) == list(NODES) and all(c["status"] == "pass" for c in by.values()), by
    assert "vectorAdd: Test PASSED" in _by(report, "smoke.gpu-pod")["node1"]["message"]
    assert _by(report, "cluster.operator")["(cluster)"]["status"] == "skip"
    junit = ET.parse(rl["work"] / "validate.xml").getroot()
    cases = junit.findall(".//testcase")
    assert len(cases) == len(report["checks"]) and not junit.findall(".//failure")
    assert "node1" in proc.stdout and "passed" in proc.stdout
    # the smoke pods are gone
    left = kubectl(rl, "get", "pods", "-n", "gpu-operator", "-o", "name").stdout.strip()
    deadline = time.monotonic() + 30
    while left:
        assert time.monotonic() < deadline, left
        time.sleep(1)
        left = kubectl(rl, "get", "pods", "-n", "gpu-operator", "-o", "name").stdout.strip()


def test_validate_node_layer_driver_pin_and_unreachable_node(rl):
    """The node layer alone: the release's driver pin differs from what nvidia-smi reports (exit 6, both versions
    named); a node whose address does not answer (a TEST-NET-1 address) is unreachable: exit 5."""
    proc, report = _validate(rl, "--only", "node")
    assert proc.returncode == 6, proc.stdout + proc.stderr
    pin = _by(report, "node.driver.version")
    assert pin["node1"]["status"] == "fail" and "535.54.03" in pin["node1"]["message"] \
        and "550.144.03" in pin["node1"]["message"], pin
    inv = rl["work"] / "inventory-unreachable"
    inv.mkdir(exist_ok=True)
    for f in (rl["work"] / "inventory").iterdir():
        (inv / f.name).write_text(f.read_text())
    (inv / "zz-unreachable.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"gpu_nodes": {"hosts": {"node2": {"ansible_host": "192.0.2.1"}}}}}}))
    proc, report = _validate(rl, "--only", "node", "--ssh-timeout", "3", "--set", "driver.version=535.54.03",
                             inventory=inv)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    reach = _by(report, "node.reachable")
    assert reach["node1"]["status"] == "pass" and reach["node2"]["status"] == "unreachable", reach
    assert "192.0.2.1" in reach["node2"]["message"], reach


def test_nodes_facts_read_over_ssh_agree_with_what_each_kubelet_reports(rl):
    """`gpu-install nodes facts` over the same SSH as validate, against the real nodes: what it read (os-release,
    uname, the containerd the apply test installed) is what each node's own kubelet reports in its nodeInfo -- an
    independent reader of the same node. The lab's nodes have no NVIDIA function on their PCI bus (the GPUs are
    STAND-INs behind the device plugin and nvidia-smi): no GPU, no NVSwitch. Nothing is written on the nodes."""
    work = rl["work"]
    out = work / "facts.json"
    proc = subprocess.run([str(VENV_BIN / "gpu-install"), "nodes", "facts", "-i", str(work / "inventory"),
                           "-o", str(out), "--ssh-timeout", "20"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "gpu-install.node-facts/v1" and doc["exitCode"] == 0, doc
    read = {h["host"]: h for h in doc["hosts"]}
    assert sorted(read) == list(NODES), read
    info = {n["metadata"]["name"]: n["status"]["nodeInfo"]
            for n in json.loads(kubectl(rl, "get", "nodes", "-o", "json").stdout)["items"]}
    arch = {"amd64": "x86_64", "arm64": "aarch64"}
    for name in NODES:
        h = read[name]
        assert h["error"] is None, h
        f = h["facts"]
        assert f["problems"] == [], f["problems"]
        assert f["kernel"] == info[name]["kernelVersion"], (f["kernel"], info[name])
        assert f["architecture"] == arch[info[name]["architecture"]], (f["architecture"], info[name])
        assert f["osVersion"] and f["osVersion"] in info[name]["osImage"], (f["osId"], f["osVersion"], info[name])
        assert f["os"] == f"{f['osId']}{f['osVersion']}"
        containerd = {r["name"]: r for r in f["runtimes"]}.get("containerd")
        assert containerd and info[name]["containerRuntimeVersion"] == f"containerd://{containerd['version']}", \
            (f["runtimes"], info[name]["containerRuntimeVersion"])
        assert f["gpuCount"] == 0 and f["nvswitchCount"] == 0 and f["pciDevices"] == [], f
        assert h["via"].startswith("ssh ") and rl["h"].nodes[name]["ip"] in h["via"], h["via"]


def test_validate_image_missing_from_the_registry_is_exit_6_with_the_registry_message(rl):
    proc, report = _validate(rl, "--set", "registry.prefix=not-mirrored", "--only", "smoke")
    assert proc.returncode == 6, proc.stdout + proc.stderr
    for c in _by(report, "smoke.gpu-pod").values():
        assert c["status"] == "fail", c
        assert "nvidia-smi: ErrImagePull" in c["message"] or "ImagePullBackOff" in c["message"], c
        assert "not-mirrored/nvidia/cuda" in c["message"] and "not found" in c["message"], c
        assert "gpu-install mirror push" in c["fix"], c
    assert "FAIL" in proc.stdout and "fix:" in proc.stdout


def test_validate_unhealthy_gpu_is_exit_6_on_that_node_only(rl):
    import yaml as _yaml

    from gpu_install_lab import gpus

    h = rl["h"]
    old = root(h, "node2", f"cat {gpus.CONFIG_PATH}").stdout
    doc = _yaml.safe_load(old)
    doc["gpus"][0]["healthy"] = False
    root(h, "node2", f"cat > {gpus.CONFIG_PATH}.tmp && mv {gpus.CONFIG_PATH}.tmp {gpus.CONFIG_PATH}",
         input=_yaml.safe_dump(doc))
    try:
        deadline = time.monotonic() + 60
        while json.loads(kubectl(rl, "get", "node", "node2", "-o", "json").stdout)["status"]["allocatable"].get(
                "nvidia.com/gpu") != "0":
            assert time.monotonic() < deadline
            time.sleep(0.5)
        proc, report = _validate(rl)
        assert proc.returncode == 6, proc.stdout + proc.stderr
        alloc = _by(report, "cluster.gpu-allocatable")
        assert alloc["node1"]["status"] == "pass" and alloc["node2"]["status"] == "fail", alloc
        assert "unhealthy" in alloc["node2"]["message"], alloc
        smoke = _by(report, "smoke.gpu-pod")
        assert smoke["node1"]["status"] == "pass", smoke
        assert smoke["node2"]["status"] == "fail" and "Insufficient nvidia.com/gpu" in smoke["node2"]["message"], smoke
    finally:
        root(h, "node2", f"cat > {gpus.CONFIG_PATH}.tmp && mv {gpus.CONFIG_PATH}.tmp {gpus.CONFIG_PATH}", input=old)
        _wait_alloc(rl, "node2", {"nvidia.com/gpu": "1"})


def test_validate_runtime_layer_without_the_operators_toolkit_is_exit_6(rl):
    """A node without the nvidia runtime, for real: the site's toolkit.mode is operator, so no gpu-install role
    configured containerd and the operator's toolkit daemonset (which would) is not installed on the lab. The runtime
    layer reads containerd's effective config (`containerd config dump` on the node): exit 6 on both nodes, the
    runtimes named and the operator's toolkit as the fix; the default runtime is not judged (the operator's to set)."""
    proc, report = _validate(rl, "--only", "runtime")
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert report["layers"] == ["runtime"]
    nvidia = _by(report, "runtime.nvidia")
    for node in NODES:
        assert nvidia[node]["status"] == "fail", nvidia
        assert nvidia[node]["message"] == f"{node}: containerd has no runtime named 'nvidia' (runtimes: runc)", nvidia
        assert "toolkit daemonset (toolkit.mode operator)" in nvidia[node]["fix"], nvidia
    assert _by(report, "runtime.present")["node1"]["message"] == "containerd answers"
    assert not _by(report, "runtime.default") and not _by(report, "runtime.binary")
    assert not any(c["layer"] in ("node", "cluster", "smoke") for c in report["checks"])


def test_validate_mig_layer_after_mig_label_and_its_failure(rl):
    """The MIG layer on node2 with a MIG layout: its lab GPU (A100-SXM4-80GB) carved as all-1g.10gb does (7 x
    1g.10gb), the inventory giving node2 `gpu_install_mig_config: all-1g.10gb`, `gpu-install mig label` setting
    nvidia.com/mig.config. The labels mig-manager and GFD would add are set by the test (STAND-INs for them: the
    operator is not on the lab): mig.config.state, gpu.count, gpu.product. Then `validate --only mig,smoke` (mixed
    strategy) passes with the exact count and node2's smoke pod runs on a MIG device; mig-manager reporting failed
    is exit 6 naming its log."""
    import yaml as _yaml

    from gpu_install_lab import gpus

    h, work = rl["h"], rl["work"]
    inv = work / "inventory-mig"
    inv.mkdir(exist_ok=True)
    for f in (work / "inventory").iterdir():
        (inv / f.name).write_text(f.read_text())
    (inv / "zz-mig.yml").write_text(_yaml.safe_dump(
        {"all": {"children": {"gpu_nodes": {"hosts": {"node2": {"gpu_install_mig_config": "all-1g.10gb"}}}}}}))
    old = root(h, "node2", f"cat {gpus.CONFIG_PATH}").stdout
    cfg = gpus.node_config(rl["lid"], "node2", 1, mig={"1g.10gb": 7})
    root(h, "node2", f"cat > {gpus.CONFIG_PATH}.tmp && mv {gpus.CONFIG_PATH}.tmp {gpus.CONFIG_PATH}",
         input=_yaml.safe_dump(cfg))
    standin = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    try:
        _wait_alloc(rl, "node2", {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu": "0"})
        kubectl(rl, "label", "--overwrite", "node", "node2", *[f"{k}={v}" for k, v in standin.items()])
        kube = ["--kubeconfig", str(h.dir / "kube" / "kubeconfig")]
        label = subprocess.run([str(VENV_BIN / "gpu-install"), "mig", "label", "-s", str(work / "site-containerd.yaml"),
                                "-i", str(inv), *kube], capture_output=True, text=True, timeout=120)
        assert label.returncode == 0, label.stdout + label.stderr
        kubectl(rl, "label", "--overwrite", "node", "node2", "nvidia.com/mig.config.state=success")
        kubectl(rl, "create", "namespace", "gpu-operator", check=False)
        proc, report = _validate(rl, "--only", "mig,smoke", "--set", "mig.strategy=mixed", inventory=inv)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        mig = {(c["node"], c["check"]): c for c in report["checks"] if c["layer"] == "mig"}
        assert sorted(mig) == [("node2", "mig.allocatable"), ("node2", "mig.config-label"),
                               ("node2", "mig.config-state")], mig
        assert all(c["status"] == "pass" for c in mig.values()), mig
        assert mig[("node2", "mig.allocatable")]["message"] == "7 x nvidia.com/mig-1g.10gb (1 GPU(s) x 7)"
        smoke = _by(report, "smoke.gpu-pod")
        assert smoke["node2"]["status"] == "pass" and "nvidia.com/mig-1g.10gb" in smoke["node2"]["message"], smoke
        kubectl(rl, "label", "--overwrite", "node", "node2", "nvidia.com/mig.config.state=failed")
        proc, report = _validate(rl, "--only", "mig", "--set", "mig.strategy=mixed", inventory=inv)
        assert proc.returncode == 6, proc.stdout + proc.stderr
        state = _by(report, "mig.config-state")["node2"]
        assert state["status"] == "fail" and "nvidia-mig-manager pod's log" in state["fix"], state
    finally:
        kubectl(rl, "label", "node", "node2", "nvidia.com/mig.config-", "nvidia.com/mig.config.state-",
                *[f"{k}-" for k in standin], check=False)
        root(h, "node2", f"cat > {gpus.CONFIG_PATH}.tmp && mv {gpus.CONFIG_PATH}.tmp {gpus.CONFIG_PATH}", input=old)
        _wait_alloc(rl, "node2", {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "0"})


def _free_slash30() -> tuple[str, str]:
    """(host side, listener) of a /30 in 198.18.0.0/15 (RFC 2544 benchmarking) that nothing here uses."""
    import ipaddress

    from gpu_install_lab import net

    used = [ipaddress.ip_network(u, strict=False) for u in net.used_networks()]
    for cand in ipaddress.ip_network("198.18.0.0/15").subnets(new_prefix=30):
        if not any(cand.overlaps(u) for u in used):
            return str(cand[1]), str(cand[2])
    raise AssertionError("no free /30 in 198.18.0.0/15")


def test_node_with_net_admin_cannot_lift_egress_denial(rl):
    """A node holds CAP_NET_ADMIN (CNI needs it): inside it, flush iptables and add a default route via the
    bastion. A listener the host reaches (a test namespace behind a host veth, with a route back to the lab)
    stays unreachable from the node: the denial is the host's (no forwarding from the lab bridge)."""
    h = rl["h"]
    ns, host_if = f"gi-egress-{rl['lid']}", f"gie{rl['lid']}"
    subnet, bastion = h.status["subnet"], h.status["bastion_ip"]
    sh = lambda *a: subprocess.run(list(a), check=True, capture_output=True, text=True)  # noqa: E731
    host_ip, listen_ip = _free_slash30()
    sh("ip", "netns", "add", ns)
    listener = None
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "-n", ns, "addr", "add", f"{listen_ip}/30", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "route", "add", subnet, "via", host_ip)
        listener = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-m", "http.server", "8000", "--bind",
                                     listen_ip], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:  # the host reaches it: the probe below can fail
            probe = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-m", "2", f"http://{listen_ip}:8000/"],
                                   capture_output=True, text=True)
            if probe.returncode == 0:
                break
            assert time.monotonic() < deadline, probe.stderr
            time.sleep(0.2)
        out = root(h, "node1", f"iptables -F && iptables -P FORWARD ACCEPT && iptables -P OUTPUT ACCEPT && "
                               f"ip route replace default via {bastion} && ip route show && "
                               f"curl -sS -m 5 http://{listen_ip}:8000/", check=False)
        assert "default via" in out.stdout, out  # the node did lift everything it can lift
        assert out.returncode != 0, out
        for ifname in (h.lab.state().settings["bridge"], h.lab.state().nodes["node1"]["veth"]):
            assert Path(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding").read_text().strip() == "0"
    finally:
        root(h, "node1", f"ip route del default via {bastion}", check=False)
        if listener:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_zz_down_leaves_nothing(rl):
    down_leaves_nothing(rl)


def down_leaves_nothing(rl) -> None:
    """`lab down`, then nothing of this lab is left (compared with the snapshot taken before `up`)."""
    h = rl["h"]
    h.lab.down()
    time.sleep(1)
    after = _snapshot(h.dir)
    left = {}
    for kind, entries in after.items():
        new = {e for e in entries - rl["before"][kind] if _ours(h.dir, rl["lid"], rl["kube_netns"], e)}
        if kind == "processes":
            new = {e for e in new if "pytest" not in e and str(h.dir) in e}
        if new:
            left[kind] = sorted(new)
    assert left == {}, left
    assert not h.dir.exists() or not any(h.dir.iterdir())
