"""STAND-IN NVIDIA Fabric Manager packages for the lab's NVSwitch node (driver.mode host on debian12).

NVIDIA ships Fabric Manager (`nvidia-fabricmanager-<branch>`) and NSCQ (`libnvidia-nscq-<branch>`) only in its own
repositories (Debian has neither; NVIDIA's CUDA repository for debian12 names them so), which nothing here reaches,
and there is no NVSwitch to manage. So the lab gets packages under those real names at the lab driver's exact
version (gpu_install_lab.packages.NVIDIA_VERSION, revision -1 as NVIDIA's repository has it), whose Description
says STAND-IN:

- nvidia-fabricmanager-<branch>: /usr/bin/nv-fabricmanager and the unit nvidia-fabricmanager.service (forking, as
  NVIDIA's). Like the real one it refuses to start when the installed driver is another version, with the real
  message ("fabric manager NVIDIA GPU driver interface version X don't match with driver version Y. Please update
  with matching NVIDIA driver package."). The driver's version is the loaded module's (/sys/module/nvidia/version)
  when one is loaded, else -- the lab never loads one -- the upstream version of the package that owns
  /usr/bin/nvidia-smi (dpkg; Debian's is an alternatives link to /usr/lib/nvidia/current/nvidia-smi). Started, it keeps gpu_install_lab.gpus.FABRIC_STATE until it stops: the node's
  STAND-IN nvidia-smi reports the GPUs' fabric Completed / Success while that file exists (gpus.py);
- libnvidia-nscq-<branch>: a document only (the real one is the NVSwitch configuration and query library).

Put them into a lab with `gpu-install lab repo-add $(...)`. See docs/lab.md.

nvswitch_pci_command(): the lab's nodes share the bastion's PCI bus, which has no NVIDIA function. On a node that
stands for an HGX board the command makes /sys/bus/pci/devices (inside that node only: a directory under /run
bind-mounted over it) list NVIDIA GPUs and NVSwitches as sysfs does (vendor, device, class files), so that everything
that reads the node's PCI bus -- preflight's gpu_install_nvswitch comparison, the driver role's detection, validate's
probe -- sees an NVSwitch node. pci_undo_command() puts the node's own bus back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpu_install_lab.gpus import FABRIC_STATE
from gpu_install_lab.packages import NVIDIA_VERSION, _standin_deb

UNIT = "nvidia-fabricmanager.service"
PID_FILE = "/run/nvidia-fabricmanager/nv-fabricmanager.pid"

_DAEMON = r"""#!/bin/sh
# nv-fabricmanager -- gpu-install lab STAND-IN for NVIDIA Fabric Manager {version} (not NVIDIA's program: there is no
# NVSwitch here). It refuses to start unless the installed NVIDIA driver is {version}, as the real one does; started,
# it keeps {state} (the lab's STAND-IN nvidia-smi then reports the fabric initialised) and forks a process for systemd
# to watch (the unit is Type=forking, as NVIDIA's).
VERSION={version}
STATE={state}
PIDFILE={pidfile}
case "${1:-}" in
  -v|--version) echo "Fabric Manager version is : $VERSION (gpu-install lab STAND-IN)"; exit 0;;
esac
drv=$(cat /sys/module/nvidia/version 2>/dev/null)
if [ -z "$drv" ]; then
  smi=$(readlink -f /usr/bin/nvidia-smi 2>/dev/null) || smi=/usr/bin/nvidia-smi
  owner=$(dpkg-query -S "$smi" 2>/dev/null | head -n 1 | cut -d: -f1)
  [ -n "$owner" ] && drv=$(dpkg-query -W -f '${Version}' "$owner" 2>/dev/null)
  drv=${drv#*:}
  drv=${drv%%-*}
fi
if [ -z "$drv" ]; then
  echo "request to query NVIDIA driver version failed: no NVIDIA driver installed (gpu-install lab STAND-IN)" >&2
  exit 1
fi
if [ "$drv" != "$VERSION" ]; then
  echo "fabric manager NVIDIA GPU driver interface version $VERSION don't match with driver version $drv. Please update with matching NVIDIA driver package. (gpu-install lab STAND-IN)" >&2
  exit 1
fi
mkdir -p "${STATE%/*}" "${PIDFILE%/*}"
echo "Completed $VERSION" > "$STATE"
sleep infinity </dev/null >/dev/null 2>&1 &
echo $! > "$PIDFILE"
exit 0
"""

_UNIT = """[Unit]
Description=NVIDIA fabric manager service (gpu-install lab STAND-IN {version})

[Service]
Type=forking
PIDFile={pidfile}
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
ExecStopPost=/bin/rm -f {state}
TimeoutStartSec=60

[Install]
WantedBy=multi-user.target
"""


def names(version: str = NVIDIA_VERSION) -> tuple[str, str]:
    """(Fabric Manager, NSCQ) package names of the version's branch, as NVIDIA's repositories name them before 580."""
    branch = version.split(".")[0]
    return f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}"


def standin_fabric_debs(version: str = NVIDIA_VERSION) -> list[Path]:
    """The Fabric Manager and NSCQ STAND-IN .debs at `version` (package version <version>-1; built once, cached)."""
    fm, nscq = names(version)
    fields = {"version": version, "state": FABRIC_STATE, "pidfile": PID_FILE}
    daemon, unit = _DAEMON, _UNIT
    for key, value in fields.items():
        daemon, unit = daemon.replace("{" + key + "}", value), unit.replace("{" + key + "}", value)
    note = (" gpu-install lab STAND-IN with NVIDIA's package name: not NVIDIA's package (Fabric Manager is not\n"
            " obtainable here and there is no NVSwitch). See gpu_install_lab/standin_fabric.py.\n")
    return [
        _standin_deb(fm, f"{version}-1", f"Description: gpu-install lab STAND-IN for NVIDIA Fabric Manager {version}\n{note}",
                     {"nv-fabricmanager": daemon, f"/lib/systemd/system/{UNIT}": unit}),
        _standin_deb(nscq, f"{version}-1", f"Description: gpu-install lab STAND-IN for NVIDIA NSCQ {version}\n{note}", {}),
    ]


#: where a node's STAND-IN PCI functions are made (inside the node), bind-mounted over its /sys/bus/pci/devices
PCI_DIR = "/run/gpu-install-lab/pci-devices"
SYS_PCI = "/sys/bus/pci/devices"
H100_SXM = "0x2330"  # H100 SXM5 80GB (installer/data/nvidia-pci-ids.tsv)
H100_NVSWITCH = "0x22a3"


def nvswitch_pci_command(gpu_bus_ids: Sequence[str], nvswitches: int = 4, gpu_device: str = H100_SXM) -> str:
    """A shell command (run as root on a lab node) after which the node's /sys/bus/pci/devices lists NVIDIA GPUs at
    these bus ids (nvidia-smi's form, 00000000:10:00.0: the STAND-IN nvidia-smi's GPUs) and `nvswitches` H100
    NVSwitches (class 0x068000) at 0000:05:00.0 and on, and nothing else. Idempotent."""
    funcs = [(f"0000:{b.split(':', 1)[1].lower()}", gpu_device, "0x030200") for b in gpu_bus_ids]
    funcs += [(f"0000:{5 + i:02x}:00.0", H100_NVSWITCH, "0x068000") for i in range(nvswitches)]
    lines = ["set -e", f"mountpoint -q {SYS_PCI} && umount {SYS_PCI}", f"rm -rf {PCI_DIR}"]
    for addr, device, klass in funcs:
        lines.append(f"mkdir -p {PCI_DIR}/{addr} && printf '0x10de\\n' > {PCI_DIR}/{addr}/vendor"
                     f" && printf '{device}\\n' > {PCI_DIR}/{addr}/device && printf '{klass}\\n' > {PCI_DIR}/{addr}/class")
    lines.append(f"mount --bind {PCI_DIR} {SYS_PCI}")
    return "\n".join(lines) + "\n"


def pci_undo_command() -> str:
    """The node's own PCI bus again (undoes nvswitch_pci_command)."""
    return f"if mountpoint -q {SYS_PCI}; then umount {SYS_PCI}; fi; rm -rf {PCI_DIR}\n"
