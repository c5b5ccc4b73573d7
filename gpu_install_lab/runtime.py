"""`gpu-install lab up --runtime containerd|docker`: put a container runtime on the lab's debian12 nodes the
way a site's nodes have one before gpu-install runs (Kubernetes nodes come with their runtime).

The lab repo gets the runtime packages (gpu_install_lab/packages.py runtime_debs(): Debian's containerd and
docker.io with their closure relative to the node rootfs, plus the STAND-IN nvidia-container-runtime /
nvidia-container-toolkit that `apply` with toolkit.mode host installs), then each node runs
`apt-get install` from the bastion over SSH. For docker the node first gets the daemon.json dockerd needs
to start inside a lab node (no iptables, no bridge: nodes share the host kernel's network stack rules).
Only debian12 nodes: no docker/containerd RPMs are obtainable for the rhel9 stand-in.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from installer.errors import ConfigError, EnvironmentProblem

RUNTIMES = {"containerd": ("containerd",), "docker": ("docker.io",)}
# What dockerd needs to start inside a lab node; kept as the site's own keys (uninstall leaves them).
LAB_DAEMON_JSON = {"iptables": False, "ip-forward": False, "bridge": "none"}


def ssh_argv(lab_dir: Path, ip: str, user: str = "root") -> list[str]:
    ssh = Path(lab_dir) / "ssh"
    return ["ssh", "-i", str(ssh / "id_ed25519"), "-o", f"UserKnownHostsFile={ssh / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"{user}@{ip}"]


def node_run(lab_dir: Path, ip: str, command: str, input: str | None = None, timeout: float = 600) -> str:
    proc = subprocess.run([*ssh_argv(lab_dir, ip), command], capture_output=True, text=True, input=input,
                          timeout=timeout)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"lab node {ip}: `{command}` failed ({proc.returncode}): "
                                 f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc.stdout


def install(lab_dir: Path, status: dict[str, Any], runtime: str, progress: Callable[[str], None] = print) -> None:
    """Runtime packages into the lab repo, then installed on every debian12 node (idempotent)."""
    from gpu_install_lab import packages, repo
    from gpu_install_lab.state import locked

    if runtime not in RUNTIMES:
        raise ConfigError(f"--runtime {runtime}: unknown", hint=f"use one of {', '.join(RUNTIMES)}")
    nodes = [n for n in status["nodes"] if n["flavour"] == "debian12"]
    skipped = [n["name"] for n in status["nodes"] if n["flavour"] != "debian12"]
    if skipped:
        progress(f"runtime {runtime}: not on {', '.join(skipped)} (no docker/containerd RPMs for the rhel9 stand-in)")
    if not nodes:
        return
    debs = packages.runtime_debs(progress=progress)
    with locked(Path(lab_dir)):
        repo.add_packages(Path(lab_dir) / "repo", debs)
        repo.refresh(Path(lab_dir) / "repo")
    progress(f"runtime {runtime}: {len(debs)} packages in the lab repo")
    for n in nodes:
        if runtime == "docker":
            node_run(lab_dir, n["ip"], "mkdir -p /etc/docker && test -e /etc/docker/daemon.json || "
                                        "cat > /etc/docker/daemon.json", input=json.dumps(LAB_DAEMON_JSON, indent=2) + "\n")
        node_run(lab_dir, n["ip"], "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                                    f"-o Dpkg::Options::=--force-confold {' '.join(RUNTIMES[runtime])} >/dev/null")
        probe = "ctr version >/dev/null" if runtime == "containerd" else "docker info >/dev/null"
        node_run(lab_dir, n["ip"], f"systemctl is-active {'containerd' if runtime == 'containerd' else 'docker'} "
                                    f">/dev/null && {probe}")
        progress(f"{n['name']}: {runtime} installed from the lab repo and answering")
