"""gpu-install: NVIDIA GPU nodes of a Kubernetes cluster from bare metal to validated."""

from pathlib import Path

__version__ = "0.1.0"

#: Repository root when running from a checkout (values/, playbooks/, roles/ live here).
PROJECT_ROOT = Path(__file__).resolve().parent.parent
