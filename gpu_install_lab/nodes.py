"""Lab nodes: an overlay over the cached flavour rootfs, per-node files, booted by systemd-nspawn
inside the node's network namespace."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_install_lab import pki, repo, rootfs
from gpu_install_lab.rootfs import LAB_USER
from gpu_install_lab.sh import run
from installer.errors import EnvironmentProblem
from installer.util import atomic_write

CA_NAME = "gpu-install-lab-ca.crt"


def mounted(path: Path) -> bool:
    target = str(Path(path).resolve())
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == target for line in fh)


def mount_overlay(lower: Path, node_dir: Path) -> Path:
    upper, work, merged = node_dir / "upper", node_dir / "work", node_dir / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    if not mounted(merged):
        run(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={lower},upperdir={upper},workdir={work}", merged])
    return merged


def umount(path: Path) -> None:
    if mounted(path):
        if run(["umount", path], check=False).returncode != 0:
            run(["umount", "-l", path])


def _uid_gid(root: Path, user: str) -> tuple[int, int]:
    for line in (root / "etc" / "passwd").read_text().splitlines():
        f = line.split(":")
        if f[0] == user:
            return int(f[2]), int(f[3])
    raise EnvironmentProblem(f"user {user} missing in node rootfs {root}")


def _authorize(root: Path, user: str, home: str, pubkey: str) -> None:
    ssh_dir = root / home.lstrip("/") / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    atomic_write(ssh_dir / "authorized_keys", pubkey + "\n", mode=0o600)
    uid, gid = _uid_gid(root, user)
    os.chown(ssh_dir, uid, gid)
    os.chown(ssh_dir / "authorized_keys", uid, gid)


def customise(merged: Path, node: dict[str, Any], lab: dict[str, Any]) -> str:
    """Write the node's own files into its overlay; returns its SSH host public key line.
    lab: {"bastion_ip", "hosts" (name -> ip), "ssh_pubkey", "ca_pem", "registry", "repo_url", "trust_ca"
    (default true: the lab CA goes into the node's trust store; real Kubernetes nodes get it only from
    gpu-install's registry_trust role)}."""
    name = node["name"]
    etc = merged / "etc"
    atomic_write(etc / "hostname", name + "\n")
    mid = etc / "machine-id"
    if not mid.read_text().strip():
        atomic_write(mid, secrets.token_hex(16) + "\n", mode=0o444)
    hosts = ["127.0.0.1 localhost", f"{lab['bastion_ip']} bastion.gpu-install.lab bastion"]
    hosts += [f"{ip} {n}" for n, ip in sorted(lab["hosts"].items())]
    atomic_write(etc / "hosts", "\n".join(hosts) + "\n")
    # SSH: per-node host key, lab key for root and the sudo user.
    host_pub = pki.ssh_keypair(etc / "ssh" / "ssh_host_ed25519_key", f"root@{name}")
    atomic_write(etc / "ssh" / "sshd_config.d" / "gpu-install-lab.conf",
                 "HostKey /etc/ssh/ssh_host_ed25519_key\nPasswordAuthentication no\nUseDNS no\n")
    _authorize(merged, "root", "/root", lab["ssh_pubkey"])
    _authorize(merged, LAB_USER, f"/home/{LAB_USER}", lab["ssh_pubkey"])
    # Lab CA: in the system trust store (as an enterprise CA would be) and for containers tools. rhel9: RHEL's
    # anchors directory and the stand-in update-ca-trust (rootfs.UPDATE_CA_TRUST), which owns the bundle there.
    if node["flavour"] == "rhel9":
        tool = merged / "usr" / "bin" / "update-ca-trust"
        if not tool.exists() or tool.read_text() != rootfs.UPDATE_CA_TRUST:
            atomic_write(tool, rootfs.UPDATE_CA_TRUST, mode=0o755)
        ca_file = etc / "pki" / "ca-trust" / "source" / "anchors" / CA_NAME
        refresh = ["update-ca-trust", "extract"]
    else:
        ca_file = merged / "usr" / "local" / "share" / "ca-certificates" / CA_NAME
        refresh = ["update-ca-certificates", "--fresh"]
    if not lab.get("trust_ca", True):
        pass
    elif not ca_file.exists() or ca_file.read_text() != lab["ca_pem"]:
        atomic_write(ca_file, lab["ca_pem"])
        run(["chroot", merged, *refresh])
    if lab.get("trust_ca", True):
        atomic_write(etc / "containers" / "certs.d" / lab["registry"] / "ca.crt", lab["ca_pem"])
    if node["flavour"] == "rhel9":
        atomic_write(etc / "yum.repos.d" / "gpu-install-lab.repo", repo.yum_repo(lab["repo_url"]))
    else:
        atomic_write(etc / "apt" / "sources.list.d" / "gpu-install-lab.list", repo.apt_source(lab["repo_url"]))
    return host_pub


CGROUP_PARENT = "gpu-install-lab"


V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")


def cgroup_roots(controllers: bool = False) -> list[Path]:
    """Hierarchies where systemd tracks processes: cgroup v2, or the hybrid layout's unified +
    name=systemd hierarchies; with controllers, also the v1 controller hierarchies (a real kubelet in the
    node makes its kubepods/ there, under the node's own cgroup)."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [base]
    names = ("unified", "systemd") + (V1_CONTROLLERS if controllers else ())
    return [p for p in (base / n for n in names) if (p / "cgroup.procs").exists() and not p.is_symlink()]


def cgroup_create(rel: str, controllers: bool = False) -> list[Path]:
    """Each node's nspawn gets its own cgroup: two containers' systemd must never share one."""
    roots = cgroup_roots(controllers)
    for root in roots:
        if root.name == "cpuset":
            # a new cpuset cgroup starts with no CPUs and no memory nodes: inherit them level by level
            cur = root
            for part in Path(rel).parts:
                nxt = cur / part
                nxt.mkdir(exist_ok=True)
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (nxt / f).read_text().strip():
                        (nxt / f).write_text((cur / f).read_text().strip())
                cur = nxt
        (root / rel).mkdir(parents=True, exist_ok=True)
    return [root / rel for root in roots]


def cgroup_enter(paths: list[Path]) -> None:
    for p in paths:
        (p / "cgroup.procs").write_text("0")


def cgroup_remove(rel: str, timeout: float = 10) -> None:
    """Kill what is left in the node's cgroup tree (only the node's processes can be there), then
    rmdir it bottom-up (in every hierarchy: a real node's kubelet makes cgroups in the controllers)."""
    deadline = time.monotonic() + timeout
    for root in cgroup_roots(controllers=True):
        top = root / rel
        while top.exists():
            walk = sorted(os.walk(top), key=lambda w: -w[0].count("/"))
            for dirpath, _dirs, _files in walk:
                for pid in Path(dirpath, "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            try:
                for dirpath, _dirs, _files in walk:
                    os.rmdir(dirpath)
            except OSError:  # EBUSY until the killed processes are gone
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        try:
            top.parent.rmdir()  # the shared gpu-install-lab parent, once empty
        except OSError:
            pass


def nspawn_argv(merged: Path, name: str, netns: str, extra: list[str] | None = None) -> list[str]:
    return [
        "systemd-nspawn", "--quiet", "--boot", "--directory", str(merged),
        f"--machine={name}", f"--hostname={name}", "--register=no", "--keep-unit",
        f"--network-namespace-path=/run/netns/{netns}", "--console=read-only",
        "--resolv-conf=off", "--timezone=off", "--link-journal=no", *(extra or []),
    ]


def wait_ssh(ip: str, timeout: float = 60, proc_alive: Callable[[], bool] = lambda: True) -> float:
    """Wait for the node's sshd banner on ip:22; returns seconds waited."""
    start = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - start < timeout:
        if not proc_alive():
            raise EnvironmentProblem(f"node {ip}: systemd-nspawn exited while booting",
                                     hint="see nodes/<name>/console.log in the lab directory")
        try:
            with socket.create_connection((ip, 22), timeout=1) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):
                    return time.monotonic() - start
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise EnvironmentProblem(f"node {ip}: no SSH after {timeout:.0f}s ({last})",
                             hint="see nodes/<name>/console.log in the lab directory")
