"""Runtime layer: is the node's container runtime set up for GPUs the way the site asked? (pure functions)

The probe (installer/validate/probe.py) prints, in the same SSH session as the node layer's facts:
- `containerd config dump` (the EFFECTIVE configuration: the main file with its imports merged, as containerd itself
  reads it; with `sudo -n` when the SSH user may not read the files), and its exit status;
- `docker info --format '{{json .}}'` (the daemon's view: runtimes and default runtime), and its exit status;
- for every runtime binary those name, and `nvidia-container-runtime`, whether it is an executable on the node;
- the CDI spec files in /etc/cdi and /var/run/cdi and whether each declares `nvidia.com/gpu` devices.

check_runtime() turns that and the site's expectations (RuntimeExpect, from installer/validate/__init__.py) into
findings with the same shape as the node layer's. Check ids are listed in CHECKS and in docs/validate.md.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from installer.validate.node import Finding

#: Every check id check_runtime() reports (a check with no finding passes).
CHECKS = ("runtime.present", "runtime.nvidia", "runtime.binary", "runtime.default", "runtime.cdi")

#: containerd's CRI plugin: config version 2 (containerd 1.x) and version 3 (containerd 2.x) place the runtimes here.
CRI_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")


@dataclass(frozen=True)
class RuntimeExpect:
    runtime: str  # containerd | docker (site `runtime`)
    name: str = "nvidia"  # the runtime's name (containerd_runtime_name; docker's runtimes key)
    default: bool | None = None  # True: must be the default runtime; None: not checked (the operator's toolkit)
    cdi: bool = False  # CDI specs for nvidia.com/gpu must be present
    by: str = "gpu-install apply"  # who configures it, for the fix


@dataclass(frozen=True)
class RuntimeConfig:
    """What the node's runtime says about the nvidia runtime: runtimes {name: binary path ('' when not given)} and the
    default runtime name ('' when none is set)."""

    runtimes: dict[str, str]
    default: str


def containerd_config(text: str) -> RuntimeConfig:
    """The runtimes and default runtime of a `containerd config dump` (TOML). Raises ValueError when it is not TOML."""
    doc = tomllib.loads(text)
    plugins = doc.get("plugins") or {}
    runtimes: dict[str, str] = {}
    default = ""
    for key in CRI_PLUGINS:
        section = ((plugins.get(key) or {}).get("containerd") or {}) if isinstance(plugins, dict) else {}
        if not isinstance(section, dict):
            continue
        default = default or str(section.get("default_runtime_name") or "")
        for name, rt in (section.get("runtimes") or {}).items():
            if isinstance(rt, dict):
                options = rt.get("options")
                runtimes[str(name)] = str(options.get("BinaryName") or "") if isinstance(options, dict) else ""
    return RuntimeConfig(runtimes, default)


class RuntimeDown(ValueError):
    """The runtime's client answered, its daemon did not (the message is the client's)."""


def docker_config(text: str) -> RuntimeConfig:
    """The runtimes and default runtime of `docker info --format '{{json .}}'`. Raises RuntimeDown when the client
    reports the daemon unreachable (docker 20.10 exits 0 then, with the error in ServerErrors), ValueError when it is
    not the daemon's JSON."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip().startswith("{")]
    doc = json.loads(lines[0] if lines else text)
    if isinstance(doc, dict) and doc.get("ServerErrors"):
        raise RuntimeDown(str(doc["ServerErrors"][0]))
    if not isinstance(doc, dict) or not doc.get("Runtimes"):
        raise ValueError("no Runtimes in docker info")
    runtimes = {str(k): str((v or {}).get("path") or "") if isinstance(v, dict) else ""
                for k, v in (doc.get("Runtimes") or {}).items()}
    return RuntimeConfig(runtimes, str(doc.get("DefaultRuntime") or ""))


def binaries(section: str) -> dict[str, str]:
    """The probe's `binaries` section ("ok NAME PATH" / "missing NAME" lines) as {name: resolved path or ''}."""
    out: dict[str, str] = {}
    for line in section.splitlines():
        word = line.split()
        if len(word) >= 2 and word[0] in ("ok", "missing"):
            out[word[1]] = word[2] if word[0] == "ok" and len(word) > 2 else ""
    return out


def cdi_specs(section: str) -> tuple[list[str], list[str]]:
    """(all CDI spec files, those declaring nvidia.com/gpu devices) from the probe's `cdi` section."""
    files, nvidia = [], []
    for line in section.splitlines():
        word = line.split()
        if word:
            files.append(word[0])
            if "nvidia.com/gpu" in word[1:]:
                nvidia.append(word[0])
    return files, nvidia


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def check_runtime(host: str, sections: Mapping[str, str], statuses: Mapping[str, int],
                  expect: RuntimeExpect) -> list[Finding]:
    """Findings about the node's runtime; an empty list means every check in CHECKS passed."""

    def finding(check: str, message: str, fix: str, severity: Any = "error") -> Finding:
        return Finding(check, severity, host, f"{host}: {message}", fix)

    rt = expect.runtime
    status = statuses.get(rt, 127)
    text = sections.get(rt, "")
    where = "containerd config dump" if rt == "containerd" else "docker info"
    if status == 127:
        return [finding("runtime.present", f"{rt} is not installed (the site's runtime is {rt})",
                        f"install {rt} on the node, or set `runtime:` in the site file to the node's runtime")]
    if status != 0:
        fix = ("start containerd (systemctl status containerd) and check its config files"
               if rt == "containerd" else "start docker (systemctl status docker); the SSH user needs docker access "
               "or passwordless sudo")
        return [finding("runtime.present", f"`{where}` failed (exit {status}): {_last_line(text)}", fix)]
    try:
        config = containerd_config(text) if rt == "containerd" else docker_config(text)
    except RuntimeDown as exc:
        return [finding("runtime.present", f"`{where}`: {exc}", "start docker (systemctl status docker); the SSH user "
                        "needs docker access or passwordless sudo")]
    except ValueError as exc:
        return [finding("runtime.present", f"`{where}` printed something unreadable ({exc})",
                        f"run `{where}` on the node and check its output")]
    out: list[Finding] = []
    configured_by = f"{expect.by} (the {rt}_runtime role)" if expect.by == "gpu-install apply" else expect.by
    if expect.name not in config.runtimes:
        have = ", ".join(sorted(config.runtimes)) or "none"
        out.append(finding("runtime.nvidia", f"{rt} has no runtime named {expect.name!r} (runtimes: {have})",
                           f"configure it with {configured_by}; see that its config file is the one {rt} reads"))
    else:
        binary = config.runtimes[expect.name] or "nvidia-container-runtime"
        found = binaries(sections.get("binaries", ""))
        if not found.get(binary):
            out.append(finding("runtime.binary", f"the {expect.name} runtime's binary {binary} is not an executable "
                               "on the node", "install the NVIDIA Container Toolkit (toolkit.mode host: gpu-install "
                               "apply; operator: the toolkit daemonset) or fix the runtime's path"))
    if expect.default is True and config.default != expect.name:
        out.append(finding("runtime.default", f"the default runtime is {config.default or 'not set (runc)'}, not "
                           f"{expect.name}: pods without runtimeClassName get no GPU",
                           f"make {expect.name} the default ({configured_by}) or give GPU pods the RuntimeClass "
                           f"{expect.name}"))
    if expect.cdi:
        files, nvidia = cdi_specs(sections.get("cdi", ""))
        if not nvidia:
            out.append(finding("runtime.cdi", "cdi.enabled, but no CDI spec declares nvidia.com/gpu devices "
                               f"(in /etc/cdi, /var/run/cdi: {', '.join(files) or 'no spec files'})",
                               "generate it: `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` (toolkit.mode "
                               "host), or check the operator's toolkit pod on this node"))
    return out
