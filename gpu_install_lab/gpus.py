"""GPUs on the lab's real nodes: the STAND-IN device plugin and STAND-IN nvidia-smi (labtools/, built by
scripts/build-lab-tools) installed into each real node, with the node's lab GPU config.

There is no GPU here. Each real node runs `standin-gpu-device-plugin` as a systemd unit: it speaks the kubelet
device-plugin API v1beta1 to the node's real kubelet and advertises `nvidia.com/gpu` devices (or mixed-strategy
`nvidia.com/mig-<profile>` ones) described in /etc/gpu-install-lab/gpus.yaml; Allocate gives a container
NVIDIA_VISIBLE_DEVICES and mounts the STAND-IN nvidia-smi, which answers for the allocated devices only, from
recorded real nvidia-smi documents (tests/fixtures/nvidia-smi/README.md). Editing gpus.yaml on a node (for instance
`healthy: false`) reaches the kubelet through ListAndWatch within a second.

Node config: `gpu-install lab up --kubelet real --gpus N [--gpu-model MODEL]` gives every node N GPUs of that model
with UUIDs derived from the lab id and the node name (stable across `lab up`, distinct between nodes and labs). The
models are those with a recorded document: A100-SXM4-80GB (driver 535), Tesla T4, and a real H100 80GB HBM3 and H200
on driver 580 (their nodes' nvidia-smi reports driver 580.159.04 / CUDA 13.0 and prints the 580 table layout).

NVSwitch nodes: `nvswitch: true` in a node's gpus.yaml (node_config(nvswitch=True)) makes the STAND-IN nvidia-smi report
each GPU's NVSwitch fabric in `-q -x`: Completed / Success while the node's Fabric Manager STAND-IN unit runs (it keeps
FABRIC_STATE while active: gpu_install_lab/standin_fabric.py), In Progress / N/A otherwise. install_node_smi() puts
the STAND-IN nvidia-smi on a running node (the driver lab's nodes have no STAND-IN GPUs of their own).
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from gpu_install_lab import GPU_DRIVERS, GPU_MODELS
from installer.errors import EnvironmentProblem
from installer.util import atomic_write

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build-lab-tools"
PLUGIN = "standin-gpu-device-plugin"
SMI = "standin-nvidia-smi"
NODE_LIB = "/usr/local/lib/gpu-install-lab"  # where the binaries go inside a node
CONFIG_PATH = "/etc/gpu-install-lab/gpus.yaml"
NODE_SMI = "/usr/local/bin/nvidia-smi"  # the node's own nvidia-smi: the stand-in over all of the node's GPUs
NODE_DEVICES = "/etc/gpu-install-lab/node-devices.json"
MIG_STATE = "/var/lib/gpu-install-lab/mig-mode.json"  # the node's GPUs' MIG mode (the STAND-IN's state; "busy")
FABRIC_STATE = "/run/gpu-install-lab/fabric-manager.state"  # kept by the Fabric Manager STAND-IN unit while it runs
UNIT = "gpu-install-lab-device-plugin.service"
DRIVER_VERSION = "535.54.03"  # what the stand-in nvidia-smi reports (the recorded A100 document's driver)
CUDA_VERSION = "12.2"

MODELS = GPU_MODELS  # model -> (memory MiB, MIG-capable)
DEFAULT_MODEL = "NVIDIA A100-SXM4-80GB"

UNIT_TEXT = f"""[Unit]
Description=gpu-install lab STAND-IN GPU device plugin (no GPU: advertises the devices of {CONFIG_PATH})
After=kubelet.service
Wants=kubelet.service

[Service]
ExecStart={NODE_LIB}/{PLUGIN} --config={CONFIG_PATH} --nvidia-smi={NODE_LIB}/{SMI}
Restart=always
RestartSec=1
StandardInput=null

[Install]
WantedBy=multi-user.target
"""


def tools_dir(progress: Any = print) -> Path:
    """The built lab tools (scripts/build-lab-tools: builds them when missing or stale, else instant)."""
    if not BUILD_SCRIPT.is_file():
        raise EnvironmentProblem("the lab's STAND-IN GPU tools need scripts/build-lab-tools",
                                 hint="run the lab from a gpu-install checkout")
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), "--bin-dir"], capture_output=True, text=True)
    bin_dir = Path(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 and proc.stdout.strip() else None
    if bin_dir is None or not all((bin_dir / t).is_file() for t in (PLUGIN, SMI)):
        progress("lab tools: building the STAND-IN device plugin and nvidia-smi (scripts/build-lab-tools, ~2 min)")
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise EnvironmentProblem(f"scripts/build-lab-tools failed (exit {proc.returncode}):\n  "
                                 + "\n  ".join(proc.stderr.strip().splitlines()[-10:]),
                                 hint="it needs golang-go and deb-src (scripts/bootstrap installs them)")
    return Path(proc.stdout.strip().splitlines()[-1])


def parse_mig(spec: str | None) -> dict[str, int]:
    """`--mig 1g.10gb=2,2g.20gb=1` -> {"1g.10gb": 2, "2g.20gb": 1} (empty: no MIG devices)."""
    out: dict[str, int] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        profile, sep, count = part.strip().partition("=")
        if not sep or not count.isascii() or not count.isdigit() or int(count) < 1 or not profile:
            raise ValueError(f"--mig {spec!r}: {part.strip()!r} is not PROFILE=COUNT (e.g. 1g.10gb=2)")
        if profile in out:
            raise ValueError(f"--mig {spec!r}: {profile} given twice")
        out[profile] = int(count)
    return out


def check_mig(model: str, mig: dict[str, int]) -> None:
    """Refuse a MIG layout the model cannot hold: a profile it has not (mig-parted's profile list,
    values/mig/models.yaml), more instances of one than it allows, or more than 7 compute slices in all."""
    if not mig:
        return
    import re

    import yaml

    from installer import content

    if not MODELS[model][1]:
        raise ValueError(f"--mig: {model} is not MIG-capable")
    doc = yaml.safe_load(content.mig_models_file().read_text())
    entry = next((m for m in doc["models"] if any(re.search(p, model, re.I) for p in m["products"])), None)
    if entry is None:
        raise ValueError(f"--mig: no MIG profile list for {model}")
    profiles: dict[str, int] = entry["profiles"]
    for profile, count in mig.items():
        if profile not in profiles:
            raise ValueError(f"--mig: {model} has no MIG profile {profile} (it has {', '.join(profiles)})")
        if count > profiles[profile]:
            raise ValueError(f"--mig: {model} holds at most {profiles[profile]} x {profile}, not {count}")
    slices = sum(int(p.split("g.", 1)[0]) * n for p, n in mig.items())
    if slices > 7:
        raise ValueError(f"--mig: {', '.join(f'{n} x {p}' for p, n in mig.items())} needs {slices} compute slices; "
                         f"a {model} has 7")


def node_config(lab_id: str, node: str, count: int, model: str = DEFAULT_MODEL,
                mig: dict[str, int] | None = None, nvswitch: bool = False) -> dict[str, Any]:
    """The node's lab GPU config: count GPUs of model, UUIDs stable per (lab, node, index); with mig, every GPU
    has those MIG devices (the device plugin then advertises them the mixed-strategy way, not the GPUs); nvswitch: an
    NVSwitch node (the STAND-IN nvidia-smi reports the GPUs' fabric state)."""
    if model not in MODELS:
        raise ValueError(f"GPU model {model!r}: the stand-in has recorded documents for {', '.join(MODELS)} only")
    check_mig(model, mig or {})
    mem, mig_capable = MODELS[model]
    gpus = []
    for i in range(count):
        u = uuid.uuid5(uuid.NAMESPACE_URL, f"gpu-install-lab:{lab_id}:{node}:{i}")
        gpu: dict[str, Any] = {"uuid": f"GPU-{u}", "model": model, "memoryMiB": mem, "migCapable": mig_capable,
                               "pciBusId": f"00000000:{0x10 + i:02X}:00.0"}
        devices = []
        for profile, n in sorted((mig or {}).items()):
            for j in range(n):
                m = uuid.uuid5(uuid.NAMESPACE_URL, f"gpu-install-lab:{lab_id}:{node}:{i}:{profile}:{j}")
                devices.append({"uuid": f"MIG-{m}", "profile": profile})
        if devices:
            gpu["mig"] = devices
        gpus.append(gpu)
    driver, cuda = GPU_DRIVERS.get(model, (DRIVER_VERSION, CUDA_VERSION))
    return {"driverVersion": driver, "cudaVersion": cuda, **({"nvswitch": True} if nvswitch else {}), "gpus": gpus}


def node_device_info(config: dict[str, Any]) -> dict[str, Any]:
    """The stand-in nvidia-smi's device-info document for ALL of the node's GPUs (what the node's own nvidia-smi
    shows; a container's shows only what Allocate gave it)."""
    return {"driverVersion": config.get("driverVersion", DRIVER_VERSION), "cudaVersion": config.get("cudaVersion", CUDA_VERSION),
            "nvswitch": config.get("nvswitch") is True,
            "devices": [{"uuid": g["uuid"], "index": i, "model": g["model"], "memoryMiB": g["memoryMiB"],
                         "migCapable": g["migCapable"], "pciBusId": g.get("pciBusId", ""),
                         **({"mig": g["mig"]} if g.get("mig") else {})}
                        for i, g in enumerate(config.get("gpus", []))]}


NODE_SMI_TEXT = f"""#!/bin/sh
# gpu-install lab STAND-IN: this node's nvidia-smi. There is no GPU and no driver: it is the STAND-IN nvidia-smi
# (labtools/) over every GPU of {CONFIG_PATH} as it was at `lab up` ({NODE_DEVICES}).
# MIG mode (--query-gpu mig.mode.*, -mig, -r) is kept in {MIG_STATE}; an NVSwitch node's fabric is initialised while
# {FABRIC_STATE} exists (the Fabric Manager STAND-IN unit keeps it).
NVIDIA_VISIBLE_DEVICES=all NVIDIA_STANDIN_DEVICE_INFO={NODE_DEVICES} NVIDIA_STANDIN_MIG_STATE={MIG_STATE} \\
    NVIDIA_STANDIN_FABRIC_STATE={FABRIC_STATE} exec {NODE_LIB}/{SMI} "$@"
"""


def expected_resources(config: dict[str, Any]) -> dict[str, int]:
    """What the device plugin advertises for a config (healthy devices): {resource: count}."""
    out: dict[str, int] = {}
    for g in config.get("gpus", []):
        if g.get("healthy") is False:
            continue
        if not g.get("mig"):
            out["nvidia.com/gpu"] = out.get("nvidia.com/gpu", 0) + 1
        for m in g.get("mig", []):
            if m.get("healthy") is not False:
                name = "nvidia.com/mig-" + m["profile"].replace("+", ".")
                out[name] = out.get(name, 0) + 1
    return out


def install_node_smi(root: Path, config: dict[str, Any], tools: Path) -> None:
    """Put the STAND-IN nvidia-smi with this GPU config (node_config()) on a node whose root is `root` (its overlay,
    also while it runs): the binary, gpus.yaml, the device-info document and the node's nvidia-smi wrapper, replacing
    what is there. Nothing else (no device plugin)."""
    import json

    import yaml

    lib = root / NODE_LIB.lstrip("/")
    lib.mkdir(parents=True, exist_ok=True)
    tmp = lib / f".{SMI}.tmp"
    shutil.copyfile(tools / SMI, tmp)
    tmp.chmod(0o755)
    tmp.replace(lib / SMI)
    atomic_write(root / CONFIG_PATH.lstrip("/"), "# gpu-install lab: this node's STAND-IN GPUs (gpu_install_lab/gpus.py)\n"
                 + yaml.safe_dump(config, sort_keys=False))
    atomic_write(root / NODE_DEVICES.lstrip("/"), json.dumps(node_device_info(config), indent=2) + "\n")
    atomic_write(root / NODE_SMI.lstrip("/"), NODE_SMI_TEXT, mode=0o755)


def customise(merged: Path, lab_id: str, node: dict[str, Any], tools: Path) -> None:
    """Install the STAND-IN device plugin and nvidia-smi into a real node's overlay (before it boots)."""
    import yaml

    lib = merged / NODE_LIB.lstrip("/")
    lib.mkdir(parents=True, exist_ok=True)
    for name in (PLUGIN, SMI):
        src, dest = tools / name, lib / name
        if not dest.exists() or dest.read_bytes() != src.read_bytes():
            tmp = dest.with_name(f".{name}.tmp")
            shutil.copyfile(src, tmp)
            tmp.chmod(0o755)
            tmp.replace(dest)
    cfg = merged / CONFIG_PATH.lstrip("/")
    if not cfg.exists():  # a second `lab up` keeps what a test (or the user) changed on the node
        doc = node_config(lab_id, node["name"], node.get("gpus", 1), node.get("gpu_model", DEFAULT_MODEL),
                          node.get("mig"))
        atomic_write(cfg, "# gpu-install lab: this node's STAND-IN GPUs (gpu_install_lab/gpus.py); edits reach the "
                          "kubelet within a second\n" + yaml.safe_dump(doc, sort_keys=False))
        import json

        atomic_write(merged / NODE_DEVICES.lstrip("/"), json.dumps(node_device_info(doc), indent=2) + "\n")
    atomic_write(merged / NODE_SMI.lstrip("/"), NODE_SMI_TEXT, mode=0o755)
    units = merged / "etc/systemd/system"
    atomic_write(units / UNIT, UNIT_TEXT)
    link = units / "multi-user.target.wants" / UNIT
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{UNIT}")
