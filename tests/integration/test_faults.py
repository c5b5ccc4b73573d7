"""Faults during `apply` on ONE lab (2 debian12 nodes with real containerd from the lab repo, the set-up of
tests/integration/test_runtime_roles.py): a node's container stopped mid-play, and Ctrl-C. Each fault lands on a
condition (a line of apply's own progress shows the site playbook reached the nodes), never after a sleep; each
asserts the exit code, the message, the stage table, that no node holds a half-written config, and that the re-run
converges (docs/reliability.md); and a node's link cut mid-run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import tomllib

import pytest

from tests.integration.test_runtime_roles import (
    CONTAINERD_TOML,
    NODES,
    Applier,
    _ok,
    apply_inventory,
    root,
    runtime_lab,
    write_site,
)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def fl(tmp_path_factory):
    handle, the_lab = runtime_lab(tmp_path_factory)
    work = tmp_path_factory.mktemp("faults")
    try:
        for node in NODES:
            root(handle, node, "mkdir -p /etc/containerd && cat > /etc/containerd/config.toml", input=CONTAINERD_TOML)
            root(handle, node, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                               "-o Dpkg::Options::=--force-confold containerd "
                               "gpu-install-standin-nvidia-container-runtime")
        apply = Applier(apply_inventory(handle, work), work / "state")
        site = write_site(work, "containerd")
        _ok(apply(site))  # converged once: the faults below hit a re-apply with work to do
        yield handle, the_lab, apply, site
    finally:
        the_lab.down()


def _undo(handle) -> None:
    """Work for the next apply on every node: the runtime drop-in and the import line gone."""
    for node in NODES:
        root(handle, node, "rm -f /etc/containerd/conf.d/99-nvidia.toml && cat > /etc/containerd/config.toml",
             input=CONTAINERD_TOML)


def _on_a_node(line: str) -> bool:
    """A task of the site playbook ran on a node (not the inventory checks: those run on the controller)."""
    return line.startswith("[node") and "Inventory |" not in line


def _run_until(apply: Applier, site, trigger, act) -> tuple[int, str, str]:
    """apply in a session of its own; act(proc) once trigger(line) holds for a line of its progress (stderr) that
    follows the start of the site playbook (its second 'Validate inventory' play; the first is preflight's)."""
    proc = subprocess.Popen(apply.argv(site), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=apply.env(), start_new_session=True)
    plays, fired, err = 0, False, []
    try:
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:
            err.append(line)
            if line.startswith("== Validate inventory"):
                plays += 1
            elif plays >= 2 and not fired and trigger(line):
                act(proc)
                fired = True
        out = proc.stdout.read()
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert fired, "".join(err)
    return rc, out, "".join(err)


def _whole_configs(handle, node: str) -> None:
    """No half-written config: every file under /etc/containerd parses as TOML, no temporary file of a write is
    left there, and containerd reads the result."""
    listing = root(handle, node, "find /etc/containerd -type f").stdout.split()
    assert not [f for f in listing if "/.ansible" in f or f.endswith((".tmp", ".part"))], listing
    for f in listing:
        if f.endswith(".toml"):
            tomllib.loads(root(handle, node, f"cat {f}").stdout)
    root(handle, node, "containerd config dump >/dev/null")


def test_node_killed_mid_play(fl):
    """node2's container is stopped once the site playbook reached the nodes: node1 finishes, exit 5 naming node2,
    the stage table's nodes row says so; with node2 back, the re-run changes only node2."""
    handle, the_lab, apply, site = fl
    _undo(handle)

    def kill_node2(_proc: subprocess.Popen) -> None:
        st = the_lab.state()
        the_lab._stop_roles(st, ["node:node2"], timeout=5)
        st.save()

    try:
        rc, out, err = _run_until(apply, site, _on_a_node, kill_node2)
        text = out + err
        assert rc == 5, text[-4000:]
        assert "Traceback" not in text and "internal error" not in text, text[-4000:]
        assert "unreachable: node2" in err and "node1" not in err.split("error:")[-1].split("hint:")[0], err[-3000:]
        assert re.search(r"^.*nodes\s.*FAILED.*unreachable: node2", text, re.M), text[-3000:]
        stats = apply.site_stats()
        assert stats["node1"]["dark"] == 0 and stats["node1"]["failures"] == 0 and stats["node1"]["changed"] >= 1, \
            stats
        assert stats["node2"]["dark"] >= 1, stats
        _whole_configs(handle, "node1")
        assert "BinaryName" in root(handle, "node1", "cat /etc/containerd/conf.d/99-nvidia.toml").stdout
    finally:  # node2 back (its disk as it was when stopped) -- also when an assertion failed: the next tests need it
        the_lab.up(count=2, flavours=["debian12"])
    deadline = time.monotonic() + 60
    while root(handle, "node2", "systemctl is-system-running --wait", check=False).returncode not in (0, 1):
        assert time.monotonic() < deadline, "node2 did not come back"
    _whole_configs(handle, "node2")
    _ok(apply(site))
    stats = apply.site_stats()
    assert stats["node1"]["changed"] == 0 and stats["node2"]["changed"] >= 1, stats
    _ok(apply(site))
    assert all(apply.site_stats()[n]["changed"] == 0 for n in NODES)


def test_sigint_during_apply(fl):
    """Ctrl-C (SIGINT to apply's process group) once the site playbook reached the nodes: exit 130 'cancelled', the
    stage table's nodes row 'cancelled', no traceback; no node holds a half-written config; the next run converges,
    and the one after changes nothing."""
    handle, _, apply, site = fl
    _undo(handle)
    rc, out, err = _run_until(apply, site, _on_a_node, lambda proc: os.killpg(proc.pid, signal.SIGINT))
    text = out + err
    assert rc == 130, text[-4000:]
    assert "cancelled" in err and "Traceback" not in text and "internal error" not in text, text[-3000:]
    assert re.search(r"^.*nodes\s.*FAILED.*cancelled", text, re.M), text[-3000:]
    for node in NODES:
        _whole_configs(handle, node)
    _ok(apply(site))
    _ok(apply(site))
    assert all(apply.site_stats()[n]["changed"] == 0 for n in NODES)


def test_ssh_cut_mid_play(fl):
    """node2's link goes down once the site playbook's tasks run on the nodes (SSH to it cut mid-run): the same
    contract as a stopped node -- exit 5 naming node2 in the message and the stage table, node1 finishes; with the
    link back, the re-run changes only node2."""
    handle, the_lab, apply, site = fl
    _undo(handle)
    veth = the_lab.state().nodes["node2"]["veth"]
    try:
        rc, out, err = _run_until(apply, site, _on_a_node,
                                  lambda _p: subprocess.run(["ip", "link", "set", veth, "down"], check=True))
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    text = out + err
    assert rc == 5, text[-4000:]
    assert "Traceback" not in text and "internal error" not in text
    assert "unreachable: node2" in err and "node1" not in err.split("error:")[-1].split("hint:")[0], err[-3000:]
    assert re.search(r"^.*nodes\s.*FAILED.*unreachable: node2", text, re.M), text[-3000:]
    assert any(ln.startswith("[node2]") and " unreachable  " in ln for ln in err.splitlines()), err[-3000:]
    recap = out[out.index("RECAP site.yml"):].splitlines()
    assert recap[2].split()[0] == "node2" and recap[2].split()[4] != "0", recap  # the unreachable column
    stats = apply.site_stats()
    assert stats["node2"]["dark"] >= 1, stats
    assert stats["node1"]["dark"] == 0 and stats["node1"]["failures"] == 0 and stats["node1"]["changed"] >= 1, stats
    _whole_configs(handle, "node1")
    deadline = time.monotonic() + 30
    while root(handle, "node2", "true", check=False).returncode != 0:
        assert time.monotonic() < deadline, "node2 did not answer again"
    _whole_configs(handle, "node2")
    _ok(apply(site))
    stats = apply.site_stats()
    assert stats["node1"]["changed"] == 0 and stats["node2"]["changed"] >= 1, stats
