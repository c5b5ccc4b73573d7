"""The lab's STAND-IN GPU device plugin and STAND-IN nvidia-smi (labtools/, scripts/build-lab-tools).

The real binaries run: the plugin against a test STAND-IN of the kubelet's Registration side
(standin-kubelet-harness, same build) over unix sockets in a temp dir, speaking the kubelet
device-plugin API v1beta1 (Register, ListAndWatch, Allocate, GetDevicePluginOptions,
PreStartContainer); the stand-in nvidia-smi with the env and device-info file that Allocate returned.
No root, no lab, no GPU. The first run builds the tools (~2 min: `apt-get source kubernetes` once,
then `go build` against its vendored packages); later runs use the cache.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import need

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"

A100 = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
A100_B = "GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95"
T4 = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
MIG_PARENT = "GPU-5e375e7e-b41f-155b-dcdc-534524c356fc"
MIG0 = "MIG-ce861fb0-a248-58ce-a9a8-f9adbc22a66a"
MIG1 = "MIG-a45882f0-9215-5733-a0c1-49286ab31cb5"

CONFIG = f"""\
# node lab GPU config (what the stand-in device plugin advertises)
driverVersion: "535.54.03"
gpus:
- uuid: {A100}
  model: NVIDIA A100-SXM4-80GB
  memoryMiB: 81920
  migCapable: true
  pciBusId: "00000000:01:00.0"
- uuid: {T4}
  model: Tesla T4
  memoryMiB: 15360
  migCapable: false
- uuid: {MIG_PARENT}
  model: NVIDIA A100-SXM4-80GB
  memoryMiB: 81920
  migCapable: true
  mig:
  - {{uuid: {MIG0}, profile: 1g.20gb}}
  - {{uuid: {MIG1}, profile: 1g.20gb}}
"""


LAB = "CI / GPU_INSTALL_REQUIRE_LAB"
pytestmark = pytest.mark.timeout(1800)  # the first test builds the lab tools (scripts/build-lab-tools: up to 1200 s)


def _required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("GPU_INSTALL_REQUIRE_LAB"))


@pytest.fixture(scope="module")
def tools() -> Path:
    need(shutil.which("go"), "go (golang-go) is missing: scripts/bootstrap installs it", required=_required(), why_required=LAB)
    proc = subprocess.run([str(ROOT / "scripts" / "build-lab-tools")], capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        msg = f"scripts/build-lab-tools failed ({proc.returncode}): {proc.stderr[-2000:]}"
        if proc.returncode == 3:  # what build-lab-tools needs is missing
            need(False, msg, required=_required(), why_required=LAB)
        pytest.fail(msg)
    return Path(proc.stdout.strip().splitlines()[-1])


class Harness:
    """standin-kubelet-harness: serves kubelet.sock, prints JSON events, takes commands on stdin."""

    def __init__(self, tools: Path, sock_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [str(tools / "standin-kubelet-harness"), "--device-plugin-dir", str(sock_dir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._q: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.wait(lambda e: e["event"] == "listening")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(json.loads(line))

    def wait(self, pred: Callable[[dict[str, Any]], bool], start: int = 0, timeout: float = 15.0) -> dict[str, Any]:
        """The first event at index >= start (of all events so far, then new ones) matching pred."""
        for ev in self.events[start:]:
            if pred(ev):
                return ev
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching event within {timeout}s; events so far: {self.events}")
            try:
                ev = self._q.get(timeout=left)
            except queue.Empty:
                continue
            self.events.append(ev)
            if pred(ev):
                return ev

    def wait_all(self, pred: Callable[[dict[str, Any]], bool], count: int) -> list[dict[str, Any]]:
        """count events matching pred (waiting for them if needed)."""
        found: list[dict[str, Any]] = []
        while len(found) < count:
            start = self.events.index(found[-1]) + 1 if found else 0
            found.append(self.wait(pred, start))
        return found

    def command(self, line: str, event: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        start = len(self.events)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.wait(lambda e: e["event"] in (event, event + "-error"), start)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class Node:
    def __init__(self, tools: Path, tmp: Path) -> None:
        self.tools = tools
        self.dir = tmp / "device-plugins"
        self.dir.mkdir()
        self.config = tmp / "gpus.yaml"
        self.config.write_text(CONFIG)
        self.state = tmp / "state"
        self.harness = Harness(tools, self.dir)
        self.log = (tmp / "plugin.log").open("w")
        self.plugin = subprocess.Popen(
            [str(tools / "standin-gpu-device-plugin"), "--device-plugin-dir", str(self.dir),
             "--config", str(self.config), "--nvidia-smi", str(tools / "standin-nvidia-smi"),
             "--state-dir", str(self.state), "--poll", "100ms"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.log_path = tmp / "plugin.log"

    def devices(self, resource: str, pred: Callable[[list[dict[str, str]]], bool] = lambda d: True,
                start: int = 0) -> dict[str, str]:
        """The first device list (at or after event index start) for resource that matches pred."""
        ev = self.harness.wait(lambda e: e["event"] == "devices" and e["resource"] == resource and pred(e["devices"]),
                               start)
        return {d["id"]: d["health"] for d in ev["devices"]}

    def stop(self) -> None:
        if self.plugin.poll() is None:
            self.plugin.terminate()
            self.plugin.wait(timeout=10)
        self.harness.stop()
        self.log.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path: a unix socket's path must fit in 108 bytes, and pytest's tmp_path (longer under
    pytest-xdist, which adds popen-gwN/) plus device-plugins/<plugin>.sock may not."""
    d = Path(tempfile.mkdtemp(prefix="gi-dp-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def node(tools: Path, short_tmp: Path) -> Iterator[Node]:
    n = Node(tools, short_tmp)
    yield n
    n.stop()


def smi(tools: Path, info: str, visible: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": visible, "NVIDIA_STANDIN_DEVICE_INFO": info}
    return subprocess.run([str(tools / "standin-nvidia-smi"), *args], env=env, capture_output=True, text=True, timeout=30)


def test_registers_one_endpoint_per_resource(node: Node) -> None:
    regs = node.harness.wait_all(lambda e: e["event"] == "register", 2)
    assert {r["resource"]: r["endpoint"] for r in regs} == {
        "nvidia.com/gpu": "nvidia-gpu.sock",
        "nvidia.com/mig-1g.20gb": "nvidia-mig-1g.20gb.sock",
    }
    assert all(r["version"] == "v1beta1" for r in regs)
    for r in regs:
        assert (node.dir / r["endpoint"]).is_socket()
    # the MIG-enabled GPU is advertised through its MIG devices only (mixed strategy)
    assert node.devices("nvidia.com/gpu") == {A100: "Healthy", T4: "Healthy"}
    assert node.devices("nvidia.com/mig-1g.20gb") == {MIG0: "Healthy", MIG1: "Healthy"}
    opts = node.harness.command("options nvidia.com/gpu", "options")
    assert opts == {"event": "options", "resource": "nvidia.com/gpu", "preStartRequired": False}
    assert node.harness.command("prestart nvidia.com/gpu", "prestart")["ok"] is True
    assert "STAND-IN" in node.log_path.read_text()


def test_unhealthy_in_config_goes_unhealthy_through_list_and_watch(node: Node) -> None:
    node.devices("nvidia.com/gpu")
    node.devices("nvidia.com/mig-1g.20gb")
    text = CONFIG.replace("  migCapable: false\n", "  migCapable: false\n  healthy: false\n")
    text = text.replace(f"{{uuid: {MIG1}, profile: 1g.20gb}}", f"{{uuid: {MIG1}, profile: 1g.20gb, healthy: false}}")
    node.config.write_text(text)
    assert node.devices("nvidia.com/gpu", lambda d: any(x["health"] == "Unhealthy" for x in d)) == {
        A100: "Healthy", T4: "Unhealthy"}
    assert node.devices("nvidia.com/mig-1g.20gb", lambda d: any(x["health"] == "Unhealthy" for x in d)) == {
        MIG0: "Healthy", MIG1: "Unhealthy"}
    mark = len(node.harness.events)
    node.config.write_text(CONFIG)  # healthy again
    assert node.devices("nvidia.com/gpu", lambda d: all(x["health"] == "Healthy" for x in d), mark) == {
        A100: "Healthy", T4: "Healthy"}
    # a broken edit is ignored (logged): the last good devices stay advertised
    node.config.write_text("gpus: [{uuid: not-a-gpu}]\n")
    deadline = time.monotonic() + 10
    while "config change ignored" not in node.log_path.read_text():
        assert time.monotonic() < deadline, node.log_path.read_text()
        time.sleep(0.1)
    assert node.plugin.poll() is None


def test_new_and_removed_resources_follow_the_config(node: Node) -> None:
    node.devices("nvidia.com/gpu")
    node.devices("nvidia.com/mig-1g.20gb")
    mig3 = "MIG-f00d722c-f4e1-52c9-aa31-750441ae1bfe"
    node.config.write_text(CONFIG + f"""\
- uuid: GPU-69ec2344-ebac-b028-f88f-452abb3d7f11
  model: NVIDIA A100-SXM4-80GB
  memoryMiB: 81920
  migCapable: true
  mig: [{{uuid: {mig3}, profile: 3g.40gb}}]
""")
    reg = node.harness.wait(lambda e: e["event"] == "register" and e["resource"] == "nvidia.com/mig-3g.40gb")
    assert reg["endpoint"] == "nvidia-mig-3g.40gb.sock"
    assert node.devices("nvidia.com/mig-3g.40gb") == {mig3: "Healthy"}
    mark = len(node.harness.events)
    node.config.write_text(CONFIG)  # the profile is gone: its resource drops to no devices
    assert node.devices("nvidia.com/mig-3g.40gb", start=mark) == {}


def test_allocate_env_mounts_and_the_stand_in_nvidia_smi(node: Node) -> None:
    node.devices("nvidia.com/gpu")
    ev = node.harness.command(f"allocate nvidia.com/gpu {T4},{A100}", "allocate")
    assert ev["event"] == "allocate", ev
    (c,) = ev["containers"]
    assert c["envs"]["NVIDIA_VISIBLE_DEVICES"] == f"{A100},{T4}"  # in the node's device order
    mounts = {m["containerPath"]: m for m in c["mounts"]}
    assert mounts["/usr/bin/nvidia-smi"]["hostPath"] == str(node.tools / "standin-nvidia-smi")
    assert all(m["readOnly"] for m in c["mounts"])
    info_path = mounts["/run/nvidia-standin/devices.json"]["hostPath"]
    assert c["envs"]["NVIDIA_STANDIN_DEVICE_INFO"] == "/run/nvidia-standin/devices.json"
    info = json.loads(Path(info_path).read_text())
    assert [d["uuid"] for d in info["devices"]] == [A100, T4]
    assert "STAND-IN" in info["standIn"]

    # NVIDIA_VISIBLE_DEVICES names 1 of the 2 allocated GPUs: exactly that one is shown
    out = smi(node.tools, info_path, T4, "-L")
    assert out.returncode == 0, out
    assert out.stdout == f"GPU 0: Tesla T4 (UUID: {T4})\n"
    plain = smi(node.tools, info_path, T4).stdout
    rows = [ln for ln in plain.splitlines() if re.match(r"\|\s+\d+  ", ln)]
    assert len(rows) == 1 and "Tesla T4" in rows[0], plain
    assert "15360MiB" in plain
    xml = smi(node.tools, info_path, T4, "-q", "-x").stdout
    root = ET.fromstring(xml)
    assert root.findtext("attached_gpus") == "1"
    gpus = root.findall("gpu")
    assert [g.findtext("uuid") for g in gpus] == [T4]
    assert gpus[0].findtext("product_name") == "Tesla T4"
    assert gpus[0].findtext("fb_memory_usage/total") == "15360 MiB"
    assert root.findtext("driver_version") == "535.54.03"
    assert "STAND-IN" in xml and "tesla-t4.xml" in xml

    # both visible: two GPUs, in order, the A100 from the A100 document
    both = ET.fromstring(smi(node.tools, info_path, f"{A100},{T4}", "-q", "-x").stdout)
    assert both.findtext("attached_gpus") == "2"
    assert [g.findtext("product_name") for g in both.findall("gpu")] == ["NVIDIA A100-SXM4-80GB", "Tesla T4"]
    assert both.find("gpu").get("id") == "00000000:01:00.0"
    assert both.findtext("gpu/mig_mode/current_mig") == "Disabled"  # MIG-capable, no MIG devices
    assert smi(node.tools, info_path, "all", "-L").stdout.count("\nGPU ") == 1  # 2 lines

    # nothing visible: what the real tool says
    none = smi(node.tools, info_path, "", "-L")
    assert (none.returncode, none.stdout.strip()) == (6, "No devices were found")


def test_allocate_mig_device(node: Node) -> None:
    node.devices("nvidia.com/mig-1g.20gb")
    ev = node.harness.command(f"allocate nvidia.com/mig-1g.20gb {MIG1}", "allocate")
    (c,) = ev["containers"]
    assert c["envs"]["NVIDIA_VISIBLE_DEVICES"] == MIG1
    info_path = next(m["hostPath"] for m in c["mounts"] if m["containerPath"] == "/run/nvidia-standin/devices.json")
    out = smi(node.tools, info_path, MIG1, "-L").stdout
    assert out == (f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {MIG_PARENT})\n"
                   f"  MIG 1g.20gb     Device  0: (UUID: {MIG1})\n")
    root = ET.fromstring(smi(node.tools, info_path, MIG1, "-q", "-x").stdout)
    assert root.findtext("attached_gpus") == "1"
    assert root.findtext("gpu/mig_mode/current_mig") == "Enabled"
    migs = root.findall("gpu/mig_devices/mig_device")
    assert len(migs) == 1 and migs[0].findtext("fb_memory_usage/total") == "19968 MiB"


def test_allocate_unknown_or_foreign_device_is_refused(node: Node) -> None:
    node.devices("nvidia.com/gpu")
    ev = node.harness.command("allocate nvidia.com/gpu GPU-00000000-0000-0000-0000-000000000000", "allocate")
    assert ev["event"] == "allocate-error" and "unknown device" in ev["error"]
    # a MIG device is not an nvidia.com/gpu device
    ev = node.harness.command(f"allocate nvidia.com/gpu {MIG0}", "allocate")
    assert ev["event"] == "allocate-error"


def test_registers_again_when_the_kubelet_restarts(node: Node, tools: Path) -> None:
    node.devices("nvidia.com/gpu")
    node.devices("nvidia.com/mig-1g.20gb")
    node.harness.stop()
    (node.dir / "kubelet.sock").unlink(missing_ok=True)
    for f in node.dir.iterdir():  # a restarting kubelet removes the plugin sockets
        f.unlink()
    node.harness = Harness(tools, node.dir)
    regs = {e["resource"] for e in node.harness.wait_all(lambda e: e["event"] == "register", 2)}
    assert regs == {"nvidia.com/gpu", "nvidia.com/mig-1g.20gb"}
    assert node.devices("nvidia.com/gpu") == {A100: "Healthy", T4: "Healthy"}
    assert "registering again" in node.log_path.read_text()


def test_sigterm_removes_the_endpoints(node: Node) -> None:
    node.devices("nvidia.com/gpu")
    node.devices("nvidia.com/mig-1g.20gb")
    node.plugin.terminate()
    assert node.plugin.wait(timeout=10) == 0
    assert sorted(p.name for p in node.dir.iterdir()) == ["kubelet.sock"]
    assert node.harness.wait(lambda e: e["event"] == "watch-end")["resource"] in ("nvidia.com/gpu", "nvidia.com/mig-1g.20gb")
    assert "endpoints removed, exiting" in node.log_path.read_text()


def test_registration_is_retried_until_a_kubelet_answers(tools: Path, short_tmp: Path) -> None:
    """Started before the kubelet (or while it restarts): waits, then registers."""
    tmp_path = short_tmp
    sock_dir = tmp_path / "device-plugins"
    sock_dir.mkdir()
    cfg = tmp_path / "gpus.yaml"
    cfg.write_text(CONFIG)
    plugin = subprocess.Popen(
        [str(tools / "standin-gpu-device-plugin"), "--device-plugin-dir", str(sock_dir), "--config", str(cfg),
         "--state-dir", str(tmp_path / "state"), "--poll", "100ms"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        assert plugin.poll() is None
        harness = Harness(tools, sock_dir)
        try:
            regs = {e["resource"] for e in harness.wait_all(lambda e: e["event"] == "register", 2)}
            assert regs == {"nvidia.com/gpu", "nvidia.com/mig-1g.20gb"}
        finally:
            harness.stop()
    finally:
        plugin.terminate()
        plugin.wait(timeout=10)


def test_bad_config_is_refused_at_start(tools: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "gpus.yaml"
    cfg.write_text("gpus:\n- uuid: GPU-1\n  model: T4\n  mig: [{uuid: MIG-1, profile: 1g.5gb}]\n")
    out = subprocess.run(
        [str(tools / "standin-gpu-device-plugin"), "--device-plugin-dir", str(tmp_path), "--config", str(cfg)],
        capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "migCapable is false" in out.stderr
    cfg.write_text("gpus:\n- uuid: GPU-1\n  model: T4\n  colour: green\n")
    out = subprocess.run(
        [str(tools / "standin-gpu-device-plugin"), "--device-plugin-dir", str(tmp_path), "--config", str(cfg)],
        capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "colour" in out.stderr


def _info(tmp_path: Path, devices: list[dict[str, Any]], driver: str = "535.54.03") -> str:
    p = tmp_path / "devices.json"
    p.write_text(json.dumps({"driverVersion": driver, "cudaVersion": "12.2", "devices": devices}))
    return str(p)


def test_list_matches_the_recorded_layout(tools: Path, tmp_path: Path) -> None:
    """The recorded -L (telegraf#5812) of GPU 0 with 4 MIG devices, reproduced line for line."""
    recorded = (FIXTURES / "a100-sxm4-80gb-mig-L.txt").read_text().splitlines()
    migs = [{"uuid": ln.split("UUID: ")[1].rstrip(")"), "profile": "1g.20gb"} for ln in recorded[1:5]]
    info = _info(tmp_path, [{"uuid": A100, "index": 0, "model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920,
                             "migCapable": True, "pciBusId": "00000000:01:00.0", "mig": migs}])
    out = smi(tools, info, ",".join(m["uuid"] for m in migs), "-L")
    assert out.stdout.splitlines() == recorded[:5]


def test_plain_matches_the_recorded_layout(tools: Path, tmp_path: Path) -> None:
    """Header lines equal the recorded driver-535 output; every table line has the recorded width and
    column separators."""
    recorded = (FIXTURES / "quadro-rtx-4000-535-plain-excerpt.txt").read_text().splitlines()
    info = _info(tmp_path, [{"uuid": T4, "index": 0, "model": "Tesla T4", "memoryMiB": 15360, "migCapable": False,
                             "pciBusId": "00000000:00:1E.0"}], driver="535.129.03")
    out = smi(tools, info, T4).stdout.splitlines()
    assert out[1:8] == recorded[1:8]
    for mine, theirs in zip(out[8:12], recorded[8:12], strict=True):
        assert len(mine) == len(theirs) == 89
        assert [i for i, ch in enumerate(mine) if ch in "|+"] == [i for i, ch in enumerate(theirs) if ch in "|+"]
    assert out[8].startswith("|   0  Tesla T4 ") and "00000000:00:1E.0" in out[8]


def test_fixture_provenance_is_recorded() -> None:
    readme = (FIXTURES / "README.md").read_text()
    files = [f for f in FIXTURES.rglob("*") if f.is_file() and f.name != "README.md"]
    assert len(files) > 10
    for f in files:
        name = f.relative_to(FIXTURES).as_posix()
        assert f"`{name}`" in readme, f"{name} has no provenance entry in {FIXTURES}/README.md"


def test_smoke_image_ref_is_the_release_cuda_path() -> None:
    from gpu_install_lab.smoke_image import smoke_image_ref
    from installer.config import Registry

    assert smoke_image_ref("v23.9.2", Registry(host="registry.lab:5000")) == \
        "registry.lab:5000/nvidia/cuda:12.3.2-base-ubi8"
    keep = Registry(host="registry.lab:5000", prefix="mirror", layout="keep-host")
    assert smoke_image_ref("v23.9.2", keep) == "registry.lab:5000/mirror/nvcr.io/nvidia/cuda:12.3.2-base-ubi8"


def test_smoke_image_runs_the_allocated_stand_in_nvidia_smi(node: Node, tmp_path: Path) -> None:
    """Allocate through the plugin, then run the smoke image's entrypoint in its own rootfs (chroot)
    with the env and the mounts Allocate returned: it lists exactly the one allocated GPU and passes."""
    from gpu_install_lab.smoke_image import RESULT_PREFIX, build_smoke_image

    need(shutil.which("umoci") and Path("/bin/busybox").is_file(),
         "umoci / busybox-static missing (apt-get install umoci busybox-static)", required=_required(), why_required=LAB)
    need(os.geteuid() == 0, "running the image's rootfs needs chroot (root)", required=_required(), why_required=LAB)
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    tag = "12.3.2-base-ubi8"
    layout = build_smoke_image(tag, tmp_path / "images")
    size = sum(f.stat().st_size for f in layout.rglob("*") if f.is_file())
    assert size < 2 * 1024 * 1024, f"smoke image layout is {size} bytes"
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{layout}:{tag}", str(bundle)], check=True,
                   capture_output=True)
    rootfs = bundle / "rootfs"
    config = json.loads((bundle / "config.json").read_text())
    entrypoint = config["process"]["args"]
    assert entrypoint == ["/usr/local/bin/gpu-install-smoke"]

    node.devices("nvidia.com/gpu")
    ev = node.harness.command(f"allocate nvidia.com/gpu {T4}", "allocate")
    (c,) = ev["containers"]
    for m in c["mounts"]:  # what the runtime's bind mounts would show the container
        dest = rootfs / m["containerPath"].lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(m["hostPath"], dest)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **c["envs"]}
    out = subprocess.run([chroot, str(rootfs), *entrypoint], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out
    lines = out.stdout.splitlines()
    assert lines[0] == f"GPU 0: Tesla T4 (UUID: {T4})"
    assert lines[-1] == f"{RESULT_PREFIX} PASSED: 1 GPU(s) visible (NVIDIA_VISIBLE_DEVICES={T4})"
    # without a GPU allocation (no nvidia-smi mounted) the smoke test fails, saying so
    (rootfs / "usr/bin/nvidia-smi").unlink()
    out = subprocess.run([chroot, str(rootfs), *entrypoint], env={"PATH": env["PATH"]}, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1 and out.stdout.splitlines()[-1].startswith(f"{RESULT_PREFIX} FAILED")


def test_smoke_image_push_to_a_registry_at_the_release_path(tmp_path: Path) -> None:
    """push_smoke_image copies it to smoke_image_ref(release, registry) (a throwaway registry on loopback)."""
    import socket

    from gpu_install_lab.smoke_image import build_smoke_image, push_smoke_image, smoke_image_ref, smoke_image_source
    from installer.config import Registry

    for tool in ("umoci", "skopeo", "docker-registry"):
        need(shutil.which(tool), f"{tool} missing (scripts/apt-packages.txt)", required=_required(), why_required=LAB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "registry.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n")
    reg = subprocess.Popen(["docker-registry", "serve", str(tmp_path / "registry.yml")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "registry did not start"
                time.sleep(0.1)
        _, tag = smoke_image_source("v23.9.2")
        ref = smoke_image_ref("v23.9.2", Registry(host=f"127.0.0.1:{port}", prefix="mirror"))
        assert ref == f"127.0.0.1:{port}/mirror/nvidia/cuda:12.3.2-base-ubi8"
        push_smoke_image(build_smoke_image(tag, tmp_path / "images"), tag, ref, tls_verify=False)
        out = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        info = json.loads(out.stdout)
        assert info["Labels"]["org.opencontainers.image.title"] == "gpu-install lab STAND-IN CUDA smoke image"
        assert len(info["Layers"]) == 1
    finally:
        reg.terminate()
        reg.wait(timeout=10)
