"""Local air-gapped lab: a bastion (OCI registry + apt/RPM repository) and systemd nodes in
egress-denied network namespaces, all on this machine. See docs/lab.md.

Layout under the lab directory (default /var/lib/gpu-install/lab, env GPU_INSTALL_LAB_DIR):
  state.json      every resource `up` created (written before creating it), so `down` can clean up
  pki/            lab CA + registry server certificate
  ssh/            lab SSH key (id_ed25519) and known_hosts of the nodes
  registry/       docker-registry config, data, htpasswd
  repo/           HTTP document root: apt/ (dists + pool) and rpm/ (repodata + packages)
  nodes/<name>/   overlay upper/work/merged of each node + console log
  tools/          helm (sha256-verified)
  kube/           owned by gpu_install_lab.kube (control plane)
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_LAB_DIR = "GPU_INSTALL_LAB_DIR"
DEFAULT_LAB_DIR = "/var/lib/gpu-install/lab"
FLAVOURS = ("debian12", "rhel9")


def default_lab_dir() -> Path:
    return Path(os.environ.get(ENV_LAB_DIR) or DEFAULT_LAB_DIR)

# model -> (memory MiB, MIG-capable): the STAND-IN GPUs a real node can have (gpu_install_lab/gpus.py), the models the
# recorded nvidia-smi documents cover; here so that `gpu-install --help` lists them without importing more
GPU_MODELS: dict[str, tuple[int, bool]] = {
    "NVIDIA A100-SXM4-80GB": (81920, True),
    "Tesla T4": (15360, False),
    "NVIDIA H100 80GB HBM3": (81559, True),  # the real H100's fb_memory_usage total (driver 580 recording)
    "NVIDIA H200": (143771, True),           # the real H200's
}
# model -> (driver, CUDA) its recorded document was taken with, what the stand-in nvidia-smi reports for it (the plain
# table then has that driver's layout); models not named here report gpu_install_lab.gpus.DRIVER_VERSION (535)
GPU_DRIVERS: dict[str, tuple[str, str]] = {
    "NVIDIA H100 80GB HBM3": ("580.159.04", "13.0"),
    "NVIDIA H200": ("580.159.04", "13.0"),
}
