"""gpu-install: NVIDIA GPU nodes of a Kubernetes cluster from bare metal to validated."""

__version__ = "0.1.0"
