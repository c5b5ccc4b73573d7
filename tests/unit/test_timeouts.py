"""Nothing gpu-install waits on can hold it forever (installer/limits.py): an API server that accepts connections and
never answers, a helm that never returns, a playbook task that hangs. Each ends with a clear error naming what did
not answer and the limit -- within a bound the tests measure.

The silent API server is a real TCP listener on 127.0.0.1 that accepts every connection and never sends a byte (over
https the TLS handshake never completes; over http the request is read and never answered)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from installer import ansible as seam
from installer import helm, kube, limits
from installer.errors import (
    EXIT_HOST_FAILURES,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ClusterError,
    ClusterUnreachable,
    ConfigError,
    HostFailures,
)
from tests.conftest import need


class Silent:
    """A TCP listener on 127.0.0.1 that accepts and never answers; `accepted` counts the connections."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)  # kept open, never read from or written to

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def silent():
    s = Silent()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def private(tmp_path, monkeypatch):
    for name in ("GPU_INSTALL_API_TIMEOUT", "GPU_INSTALL_HELM_TIMEOUT", "GPU_INSTALL_ANSIBLE_TIMEOUT", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def site(tmp_path: Path) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"}}))
    return path


def timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t0


def test_operator_status_against_a_silent_api_server_is_exit_5_within_60s(tmp_path, silent, cli):
    """The default limits (no environment variable): the TLS handshake gets no answer in 10 s."""
    server = f"https://127.0.0.1:{silent.port}"
    (rc, out, err), elapsed = timed(cli, "operator", "status", "-s", site(tmp_path), "--kubeconfig",
                                    kubeconfig(tmp_path, server))
    assert rc == EXIT_UNREACHABLE, (out, err)
    assert elapsed < 60, elapsed
    assert f"cannot reach the Kubernetes API server {server} (no answer in 10 s)" in err, err
    assert "GPU_INSTALL_API_TIMEOUT" in err and silent.accepted >= 1


def test_a_request_read_but_never_answered_is_the_read_limit(tmp_path, silent, cli, monkeypatch):
    """Over http the request goes out and the answer never comes: the read limit, from GPU_INSTALL_API_TIMEOUT; a
    read is never retried (a write may have been done), so one limit is all it takes."""
    monkeypatch.setenv("GPU_INSTALL_API_TIMEOUT", "2,3")
    server = f"http://127.0.0.1:{silent.port}"
    (rc, out, err), elapsed = timed(cli, "operator", "status", "-s", site(tmp_path), "--kubeconfig",
                                    kubeconfig(tmp_path, server))
    assert rc == EXIT_UNREACHABLE and f"cannot reach the Kubernetes API server {server} (no answer in 3 s)" in err, err
    assert 3 <= elapsed < 10, elapsed
    assert silent.accepted == 1


def test_apply_stops_at_a_silent_api_server_before_any_host(tmp_path, silent, cli):
    """apply reads the server version in preflight, before any node is touched: the node's SSH port (a listener
    here) sees no connection, and no playbook ran."""
    node = Silent()
    try:
        inventory = tmp_path / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": {
            "ansible_host": "127.0.0.1", "ansible_port": node.port, "gpu_install_os": "ubuntu22.04",
            "gpu_install_kernel": "5.15.0-105-generic"}}}}}}))
        chart = tmp_path / "chart"
        chart.mkdir()
        (chart / "Chart.yaml").write_text("apiVersion: v2\nname: gpu-operator\nversion: v24.9.2\n")
        server = f"https://127.0.0.1:{silent.port}"
        (rc, out, err), elapsed = timed(cli, "apply", "-s", site(tmp_path), "-i", inventory, "--kubeconfig",
                                        kubeconfig(tmp_path, server), "--chart", chart)
        assert rc == EXIT_UNREACHABLE, (out, err)
        assert elapsed < 60, elapsed
        assert f"cannot reach the Kubernetes API server {server} (no answer in 10 s)" in err, err
        assert node.accepted == 0
        runs = tmp_path / "state" / "runs"
        assert not runs.exists() or not any(runs.iterdir())
    finally:
        node.close()


@pytest.mark.parametrize("value", ["soon", "0", "-1", "1,2,3", "10,", "nan", "inf", "700000"])
def test_a_bad_api_timeout_is_exit_2_before_any_contact(tmp_path, silent, cli, monkeypatch, value):
    monkeypatch.setenv("GPU_INSTALL_API_TIMEOUT", value)
    rc, out, err = cli("operator", "status", "-s", site(tmp_path), "--kubeconfig",
                       kubeconfig(tmp_path, f"https://127.0.0.1:{silent.port}"))
    assert rc == EXIT_USAGE and "GPU_INSTALL_API_TIMEOUT" in err and "is not a timeout" in err, err
    assert silent.accepted == 0


def test_limits_parse():
    assert limits.api_timeout({}) == (10.0, 30.0)
    assert limits.api_timeout({"GPU_INSTALL_API_TIMEOUT": "5"}) == (5.0, 5.0)
    assert limits.api_timeout({"GPU_INSTALL_API_TIMEOUT": " 2.5,60 "}) == (2.5, 60.0)
    assert limits.ansible_timeout({}) == 4 * 3600 and limits.ansible_timeout({"GPU_INSTALL_ANSIBLE_TIMEOUT": "90"}) == 90
    assert limits.helm_timeout({}) == 600
    with pytest.raises(ConfigError, match="GPU_INSTALL_HELM_TIMEOUT"):
        limits.helm_timeout({"GPU_INSTALL_HELM_TIMEOUT": "1,2"})


def test_connection_refused_is_exit_5_naming_the_server(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed below: nothing listens there
    client = kube.api_client(kubeconfig(tmp_path, f"https://127.0.0.1:{port}"))
    with pytest.raises(ClusterUnreachable) as err:
        kube.server_version(client)
    assert f"cannot reach the Kubernetes API server https://127.0.0.1:{port} (" in err.value.message
    assert "refused" in err.value.message.lower()


def test_helm_against_a_silent_api_server_is_stopped(tmp_path, silent, monkeypatch):
    """The real helm, asked for a release's status by a silent API server over http (client-go has no request
    timeout of its own): stopped at GPU_INSTALL_HELM_TIMEOUT, and no helm process is left behind."""
    from installer import tools

    need(tools.find_helm(), "helm is not installed (scripts/bootstrap fetches it)")
    monkeypatch.setenv("GPU_INSTALL_HELM_TIMEOUT", "3")
    kc = kubeconfig(tmp_path, f"http://127.0.0.1:{silent.port}")
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as err:
        helm.release_state("gpu-operator", "gpu-operator", kc)
    elapsed = time.monotonic() - t0
    assert "helm status gpu-operator did not finish in 3 s and was stopped" in err.value.message
    assert "GPU_INSTALL_HELM_TIMEOUT" in (err.value.hint or "")
    assert 3 <= elapsed < 15, elapsed
    assert silent.accepted >= 1  # helm did reach the listener: it was the answer that never came
    deadline = time.monotonic() + 5
    while _processes_with(str(kc)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(str(kc))


def _processes_with(needle: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in cmdline and int(pid) != os.getpid():
                out.append(int(pid))
    return out


HANG = """\
---
- name: Timeout fixture
  hosts: all
  gather_facts: false
  tasks:
    - name: Fixture | Quick
      ansible.builtin.command: "true"
      changed_when: false

    - name: Fixture | Hang
      ansible.builtin.command: "sleep 300"
      changed_when: false
"""


def test_a_playbook_past_its_limit_is_stopped_naming_host_and_task(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_ANSIBLE_TIMEOUT", "4")
    playbook = tmp_path / "hang.yml"
    playbook.write_text(HANG)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(f"[gpu_nodes]\nnode-a ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    t0 = time.monotonic()
    with pytest.raises(HostFailures) as err:
        seam.run_playbook(playbook, inventory)
    elapsed = time.monotonic() - t0
    assert err.value.exit_code == EXIT_HOST_FAILURES
    assert "ansible-playbook hang.yml ran past its 4 s limit and was stopped" in err.value.message
    assert "still running: node-a (Fixture | Hang)" in err.value.message
    assert "GPU_INSTALL_ANSIBLE_TIMEOUT" in (err.value.hint or "")
    assert 4 <= elapsed < 40, elapsed
    deadline = time.monotonic() + 10
    while _processes_with("sleep 300") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_with("sleep 300")  # the hung task went with the run
