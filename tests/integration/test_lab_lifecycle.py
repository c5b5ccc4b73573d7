"""`lab down` leaves nothing behind -- also after `lab up` was killed half-way -- and the
registry's basic auth. Each test makes its own small lab (not the session one)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest

from tests.integration.conftest import lab_prerequisites

pytestmark = pytest.mark.lab
VENV_BIN = Path(sys.executable).parent


def _netns_inodes(lab_dir: Path) -> dict[str, int]:
    state = json.loads((lab_dir / "state.json").read_text())
    return {r["key"]: os.stat(f"/run/netns/{r['key']}").st_ino for r in state["resources"]
            if r["kind"] == "netns" and Path(f"/run/netns/{r['key']}").exists()}


def leftovers(lab_dir: Path, lab_id: str, netns_inodes: dict[str, int]) -> list[str]:
    """Everything of this lab still on the machine: processes, mounts, netns, links, cgroups, files."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            net_ino = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            continue
        if str(lab_dir) in cmd or net_ino in netns_inodes.values():
            found.append(f"process {pid}: {cmd[:120]}")
    with open("/proc/self/mountinfo") as fh:
        found += [f"mount {ln.split()[4]}" for ln in fh if ln.split()[4].startswith(str(lab_dir))]
    netns = os.listdir("/run/netns") if Path("/run/netns").exists() else []
    found += [f"netns {n}" for n in netns if n.startswith(f"gpu-install-{lab_id}-")]
    found += [f"link {n}" for n in os.listdir("/sys/class/net") if n.startswith(f"gl{lab_id}")]
    for root in Path("/sys/fs/cgroup").glob("*/gpu-install-lab"):
        found += [f"cgroup {p}" for p in root.glob(f"{lab_id}-*")]
    if lab_dir.exists():
        found.append(f"files {lab_dir}: {sorted(os.listdir(lab_dir))}")
    return found


@pytest.fixture
def lab_dir(tmp_path):
    lab_prerequisites()
    return tmp_path / "lab"


def test_down_leaves_nothing_and_registry_auth(lab_dir):
    from gpu_install_lab.lab import Lab
    from gpu_install_lab.net import lab_id

    lab = Lab(lab_dir, progress=print)
    try:
        status = lab.up(count=1, flavours=["debian12"], registry_auth=True)
        assert status["nodes"][0]["ssh"]
        ctx = ssl.create_default_context(cafile=str(lab_dir / "pki" / "ca.crt"))
        url = status["registry_url"] + "/v2/"
        with pytest.raises(urllib.error.HTTPError) as no_creds:
            urllib.request.urlopen(url, context=ctx, timeout=5)
        assert no_creds.value.code == 401
        password = (lab_dir / "registry" / "password").read_text().strip()
        auth = "Basic " + b64encode(f"lab:{password}".encode()).decode()
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": auth}),
                                    context=ctx, timeout=5) as resp:
            assert resp.status == 200
        inodes = _netns_inodes(lab_dir)
        assert inodes and leftovers(lab_dir, lab_id(lab_dir), inodes)  # the check sees a live lab
    finally:
        lab.down()
    assert leftovers(lab_dir, lab_id(lab_dir), inodes) == []


def test_down_after_up_was_killed(lab_dir):
    """SIGKILL `lab up` while it boots the nodes; `lab down` still removes everything."""
    from gpu_install_lab.lab import Lab
    from gpu_install_lab.net import lab_id

    up = subprocess.Popen([str(VENV_BIN / "gpu-install"), "lab", "--lab-dir", str(lab_dir), "up", "--nodes", "2"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    state_file = lab_dir / "state.json"
    inodes: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and up.poll() is None:
            if state_file.exists():
                try:
                    res = json.loads(state_file.read_text())["resources"]
                except ValueError:
                    res = []
                if any(r["kind"] == "process" and r["key"] == "node:node1" and r.get("pid") for r in res):
                    inodes = _netns_inodes(lab_dir)
                    break
            time.sleep(0.02)
        assert up.poll() is None, f"lab up ended before it could be killed: {up.stderr.read()}"
        up.send_signal(signal.SIGKILL)
        up.wait()
        assert leftovers(lab_dir, lab_id(lab_dir), inodes)  # the crash left things behind ...
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        Lab(lab_dir, progress=print).down()
    assert leftovers(lab_dir, lab_id(lab_dir), inodes) == []  # ... and down removed them all
