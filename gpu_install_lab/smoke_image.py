"""The lab's STAND-IN CUDA smoke image: tiny (busybox-static + a shell entrypoint), built with umoci
(no Docker), tagged at the exact repository path of a catalog release's CUDA image
(`operator.initContainer`: nvcr.io/nvidia/cuda:<version> in every release) so that the values
gpu-install renders for that release resolve to it in the lab registry.

Its entrypoint runs `nvidia-smi -L` -- in a pod that got `nvidia.com/gpu` from the stand-in device
plugin that is the mounted stand-in nvidia-smi (labtools/, docs/lab.md) -- prints what it lists and
one result line, and exits 0 when at least one GPU is visible. It runs no CUDA code (there is no GPU):
it stands in for a CUDA "vectorAdd" sample, and says so.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from installer.catalog import Catalog
from installer.config import Registry
from installer.render.values import destination_repository
from installer.util import cache_dir

COMPONENT = "operator.initContainer"  # nvcr.io/nvidia/cuda:<version>-base-ubi8 (every catalog release)
BUSYBOX = Path("/bin/busybox")  # from Debian's busybox-static
APPLETS = ("sh", "grep", "cat", "echo", "ls", "env", "sleep")  # sleep: validate's metrics probe pod
RESULT_PREFIX = "gpu-install smoke (STAND-IN for CUDA vectorAdd):"

ENTRYPOINT = f"""#!/bin/sh
# gpu-install lab STAND-IN CUDA smoke test: no CUDA code runs. Lists the GPUs the container was
# given with nvidia-smi (the stand-in one, mounted by the stand-in device plugin) and prints one
# result line; exit 0 when at least one GPU is visible.
out=$(nvidia-smi -L 2>&1)
rc=$?
echo "$out"
n=$(echo "$out" | grep -c '^GPU ')
if [ "$rc" -eq 0 ] && [ "$n" -ge 1 ]; then
  echo "{RESULT_PREFIX} PASSED: $n GPU(s) visible (NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES)"
  exit 0
fi
echo "{RESULT_PREFIX} FAILED: nvidia-smi exit $rc, $n GPU(s) visible"
exit 1
"""

# the same image at the release's validator path: `vectorAdd` is the command the GPU Operator's validator image runs
# for its CUDA workload check (and `gpu-install validate`'s smoke pod)
VECTOR_ADD = """#!/bin/sh
# gpu-install lab STAND-IN for the CUDA sample vectorAdd: no CUDA code runs, there is no GPU. Says PASSED when the
# stand-in nvidia-smi (mounted by the STAND-IN device plugin) lists at least one GPU given to this container.
echo "[Vector addition of 50000 elements] (gpu-install lab STAND-IN: no CUDA code runs)"
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$n" -ge 1 ]; then
  echo "Test PASSED"
  echo "Done"
  exit 0
fi
echo "Failed to allocate device vector A (error code no CUDA-capable device is detected)!"
exit 1
"""


def smoke_image_source(release: str) -> tuple[str, str]:
    """(repository, tag) of the release's CUDA image upstream, e.g. ('nvcr.io/nvidia/cuda', '12.3.2-base-ubi8')."""
    comp = Catalog.default().get(release).components[COMPONENT]
    if not comp.repository or not comp.version:
        raise ValueError(f"release {release} pins no {COMPONENT} image")
    repo = f"{comp.repository}/{comp.image}" if comp.image else comp.repository
    return repo, comp.version


def smoke_image_ref(release: str, registry: Registry) -> str:
    """Where the smoke image goes in the site registry: the release's CUDA image path there."""
    repo, tag = smoke_image_source(release)
    return f"{destination_repository(repo, registry)}:{tag}"


def _run(*cmd: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")


def build_smoke_image(tag: str, root: Path | None = None) -> Path:
    """Build (once per tag and content) an OCI layout holding the smoke image as `<layout>:<tag>`.

    Cached under <cache>/lab-files/smoke-image/<hash>/layout; returns the layout directory."""
    for tool in ("umoci",):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing (apt-get install umoci busybox-static)")
    if not BUSYBOX.is_file():
        raise RuntimeError(f"{BUSYBOX} is missing (apt-get install busybox-static)")
    digest = hashlib.sha256(ENTRYPOINT.encode() + VECTOR_ADD.encode() + BUSYBOX.read_bytes()
                            + " ".join(APPLETS).encode() + tag.encode()).hexdigest()[:16]
    base = (root or cache_dir() / "lab-files" / "smoke-image") / digest
    layout = base / "layout"
    if (base / "complete").is_file():
        return layout
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    ref = f"{layout}:{tag}"
    _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", ref)
    bundle = base / "bundle"
    _run("umoci", "unpack", "--rootless", "--image", ref, str(bundle))
    rootfs = bundle / "rootfs"
    for d in ("bin", "usr/bin", "usr/local/bin", "run/nvidia-standin", "tmp"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    entry = rootfs / "usr" / "local" / "bin" / "gpu-install-smoke"
    entry.write_text(ENTRYPOINT)
    entry.chmod(0o755)
    vector = rootfs / "usr" / "bin" / "vectorAdd"
    vector.write_text(VECTOR_ADD)
    vector.chmod(0o755)
    _run("umoci", "repack", "--image", ref, str(bundle))
    _run("umoci", "config", "--image", ref,
         "--config.entrypoint", "/usr/local/bin/gpu-install-smoke",
         "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
         "--config.label", "org.opencontainers.image.title=gpu-install lab STAND-IN CUDA smoke image",
         "--config.label", "org.opencontainers.image.description=no CUDA, no GPU: runs nvidia-smi -L and prints one result line")
    _run("umoci", "gc", "--layout", str(layout))
    shutil.rmtree(bundle)
    (base / "complete").write_text(json.dumps({"tag": tag}) + "\n")
    return layout


def push_smoke_image(layout: Path, tag: str, dest_ref: str, ca_dir: Path | None = None, tls_verify: bool = True) -> None:
    """Copy the smoke image to the registry (skopeo), e.g. to smoke_image_ref(release, registry)."""
    cmd = ["skopeo", "copy", "--quiet", f"--dest-tls-verify={'true' if tls_verify else 'false'}"]
    if ca_dir is not None:
        cmd += ["--dest-cert-dir", str(ca_dir)]
    _run(*cmd, f"oci:{layout}:{tag}", f"docker://{dest_ref}")


def validator_image_ref(release: str, registry: Registry) -> str | None:
    """The release's validator image in the site registry, when it is an image of its own (up to v25.3; from v25.10
    the validator is inside the operator image, which the lab does not stand in for)."""
    comp = Catalog.default().get(release).components.get("validator")
    if comp is None or not comp.repository or not comp.version or comp.image == "gpu-operator":
        return None
    repo = f"{comp.repository}/{comp.image}" if comp.image else comp.repository
    return f"{destination_repository(repo, registry)}:{comp.version}"


def lab_smoke_refs(registry_host: str) -> dict[str, list[str]]:
    """{reference in the lab registry: [catalog releases]}: the smoke image at the CUDA image path and the validator
    image path of every catalog release that pins them, as a site with the default registry layout (strip-host, no
    prefix) renders them."""
    reg = Registry(host=registry_host)
    refs: dict[str, list[str]] = {}
    for release in Catalog.default().releases():
        try:
            refs.setdefault(smoke_image_ref(release, reg), []).append(release)
        except (KeyError, ValueError):
            pass  # a release without a CUDA image pin (v26.x): nothing to stand in for
        validator = validator_image_ref(release, reg)
        if validator:
            refs.setdefault(validator, []).append(release)
    return refs


def push_lab_smoke_images(registry_host: str, ca: Path, progress: Callable[[str], object] = print
                          ) -> dict[str, list[str]]:
    """Build the smoke image once and push it to every lab_smoke_refs() reference (same blobs: after the first
    push each tag costs one manifest). Returns lab_smoke_refs()."""
    import time

    from gpu_install_lab import images

    t0 = time.monotonic()
    layout = build_smoke_image("smoke")
    refs = lab_smoke_refs(registry_host)
    for ref in refs:
        images.push(layout, "smoke", ref, ca)
    progress(f"registry: STAND-IN CUDA smoke image at {len(refs)} catalog CUDA and validator image paths "
             f"({registry_host}/nvidia/cuda:<tag>, .../gpu-operator-validator:<release>; {time.monotonic() - t0:.1f}s)")
    return refs

