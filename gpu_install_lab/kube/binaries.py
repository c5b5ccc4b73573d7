"""The control plane's binaries: Kubernetes 1.20.2 built from Debian's `kubernetes` source package by
scripts/build-kubernetes into <cache>/kubernetes/1.20.2/bin (built once, then cached), and Debian's etcd."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from installer.errors import EnvironmentProblem
from installer.util import cache_dir

KUBE_VERSION = "1.20.2"
BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet", "kubemark", "kubectl")
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-kubernetes"

Progress = Callable[[str], Any]


def bin_dir() -> Path:
    return cache_dir() / "kubernetes" / KUBE_VERSION / "bin"


def _script_recipe() -> str | None:
    """RECIPE=N of scripts/build-kubernetes (None when the script is not there)."""
    try:
        m = re.search(r"^RECIPE=(\S+)", BUILD_SCRIPT.read_text(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def find_binaries() -> Path | None:
    """The cached build's bin dir if it holds every binary (of the build script's current recipe)."""
    d = bin_dir()
    try:
        info = (d / "BUILD-INFO").read_text()
    except OSError:
        return None
    recipe = _script_recipe()
    if recipe is not None and f"recipe={recipe}" not in info.splitlines():
        return None
    if all(os.access(d / b, os.X_OK) for b in BINARIES):
        return d
    return None


def ensure_binaries(progress: Progress = print) -> Path:
    """Return the bin dir, building it with scripts/build-kubernetes when the cache lacks it."""
    found = find_binaries()  # the script also checks the recipe stamp and returns at once if current
    if not BUILD_SCRIPT.is_file():
        if found:
            return found
        raise EnvironmentProblem(
            f"kubernetes {KUBE_VERSION} binaries are not in {bin_dir()} and {BUILD_SCRIPT} is missing",
            hint="run scripts/build-kubernetes from a gpu-install checkout",
        )
    if not found:
        progress(
            f"kubernetes {KUBE_VERSION}: building {', '.join(BINARIES)} from Debian's source package "
            f"(once; ~7 min on 2 cores; cached in {bin_dir()})"
        )
    env = dict(os.environ, GPU_INSTALL_CACHE=str(cache_dir()))
    build = subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert build.stdout is not None
    import queue
    import threading

    lines: queue.Queue[str | None] = queue.Queue()

    def reader() -> None:
        for raw in build.stdout:  # type: ignore[union-attr]
            lines.put(raw.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    tail: list[str] = []
    t0 = time.monotonic()
    while True:
        try:
            line = lines.get(timeout=60)
        except queue.Empty:
            progress(f"  build-kubernetes: still building ({time.monotonic() - t0:.0f}s)")
            continue
        if line is None:
            break
        tail = (tail + [line])[-30:]
        if line.startswith("build-kubernetes:") and not found:
            progress("  " + line)
    rc = build.wait()
    if rc != 0:
        raise EnvironmentProblem(
            f"building kubernetes {KUBE_VERSION} failed (scripts/build-kubernetes exit {rc}):\n  "
            + "\n  ".join(tail[-15:]),
            hint="run scripts/build-kubernetes by hand as root (it needs deb-src, golang-go, dpkg-dev, rsync)",
        )
    found = find_binaries()
    if not found:
        raise EnvironmentProblem(f"scripts/build-kubernetes succeeded but {bin_dir()} is incomplete")
    return found


def etcd_binary() -> str:
    path = shutil.which("etcd")
    if not path:
        raise EnvironmentProblem(
            "etcd is not installed", hint="apt-get install etcd-server (or run scripts/bootstrap as root)"
        )
    return path

