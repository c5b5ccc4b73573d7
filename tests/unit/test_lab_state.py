"""Lab state file and node planning: pure parts, no root needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpu_install_lab import net, rootfs
from gpu_install_lab.lab import plan_nodes
from gpu_install_lab.proc import alive, identity, proc_start, same_process
from gpu_install_lab.state import State, locked, teardown_order
from installer.errors import ConfigError, EnvironmentProblem


def test_record_writes_before_create_and_dedupes(tmp_path):
    st = State(tmp_path / "state.json")
    st.record("netns", "ns1")
    on_disk = json.loads((tmp_path / "state.json").read_text())
    assert on_disk["resources"] == [{"kind": "netns", "key": "ns1"}]
    st.record("netns", "ns1", extra=1)  # second `up`: updated, not duplicated
    st.record("link", "veth1")
    again = State(tmp_path / "state.json")
    assert [(r["kind"], r["key"]) for r in again.resources] == [("netns", "ns1"), ("link", "veth1")]
    assert again.find("netns", "ns1")["extra"] == 1
    again.forget("netns", "ns1")
    assert [r["key"] for r in State(tmp_path / "state.json").resources] == ["veth1"]
    assert oct((tmp_path / "state.json").stat().st_mode & 0o777) == "0o600"


def test_unknown_kind_and_bad_files(tmp_path):
    st = State(tmp_path / "state.json")
    with pytest.raises(ValueError):
        st.record("volume", "x")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(EnvironmentProblem, match="unreadable"):
        State(tmp_path / "bad.json")
    (tmp_path / "v9.json").write_text('{"version": 9}')
    with pytest.raises(EnvironmentProblem, match="version 9"):
        State(tmp_path / "v9.json")


def test_teardown_order_processes_first_then_newest_first():
    res = [{"kind": k, "key": str(i)} for i, k in
           enumerate(["dir", "link", "netns", "link", "mount", "process", "cgroup", "process"])]
    order = [(r["kind"], r["key"]) for r in teardown_order(res)]
    assert order == [("process", "7"), ("process", "5"), ("cgroup", "6"), ("mount", "4"),
                     ("link", "3"), ("link", "1"), ("netns", "2"), ("dir", "0")]


def test_process_identity_survives_only_for_the_same_process():
    me = identity(os.getpid())
    assert same_process(me) and alive(me)
    assert not same_process({**me, "start": me["start"] + 1})  # recycled pid: never ours
    assert not same_process({**me, "boot": "another-boot"})
    assert not same_process({"pid": None, "start": None, "boot": me["boot"]})
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    rec = identity(child.pid)
    child.wait()
    assert proc_start(child.pid) is None and not alive(rec)


def test_zombie_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    rec = identity(child.pid)
    import time

    deadline = time.time() + 10
    while time.time() < deadline and open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    assert same_process(rec)  # the zombie still has its /proc entry ...
    assert not alive(rec)  # ... but alive() reaps it and says no


def test_lock_is_exclusive(tmp_path):
    with locked(tmp_path):
        with pytest.raises(EnvironmentProblem, match="another gpu-install lab command"):
            with locked(tmp_path):
                pass
    with locked(tmp_path):  # released
        pass


def test_plan_nodes_round_robin_and_validation():
    plan = plan_nodes(3, ["debian12", "rhel9"])
    assert [(p["name"], p["flavour"]) for p in plan] == [("node1", "debian12"), ("node2", "rhel9"), ("node3", "debian12")]
    with pytest.raises(ConfigError, match="at least 1"):
        plan_nodes(0, ["debian12"])
    with pytest.raises(ConfigError, match="unknown lab flavour 'ubuntu22'"):
        plan_nodes(1, ["ubuntu22"])


def test_network_names_and_addresses():
    lid = net.lab_id(__import__("pathlib").Path("/var/lib/gpu-install/lab"))
    assert len(lid) == 6
    for name in (net.bridge_name(lid), net.veth_name(lid, 999)):
        assert len(name) <= 15  # IFNAMSIZ
    assert net.bastion_ip("10.250.3.0/24") == "10.250.3.1"
    assert net.node_ip("10.250.3.0/24", 1) == "10.250.3.11"
    with pytest.raises(EnvironmentProblem):
        net.node_ip("10.250.3.0/24", 245)  # would be the broadcast address


def test_pick_subnet_skips_networks_in_use():
    assert net.pick_subnet([]) == "10.250.0.0/24"
    assert net.pick_subnet(["10.250.0.0/24", "10.250.1.7/32", "192.0.2.0/24"]) == "10.250.2.0/24"
    with pytest.raises(EnvironmentProblem, match="no free /24"):
        net.pick_subnet(["10.0.0.0/8"])


def test_rootfs_cache_key_tracks_inputs(monkeypatch):
    deb, rhel = rootfs.cache_key("debian12"), rootfs.cache_key("rhel9")
    assert deb != rhel
    assert "dnf" in rootfs.packages("rhel9") and "dnf" not in rootfs.packages("debian12")
    monkeypatch.setenv(rootfs.ENV_MIRROR, "http://mirror.example/debian")
    assert rootfs.cache_key("debian12") != deb  # another mirror, another cache entry
    assert 'ID="rocky"' in rootfs.hook("rhel9") and "redhat-release" in rootfs.hook("rhel9")
