"""Tiny images for the lab registry, built without Docker: one layer with Debian's busybox-static (from the lab
package cache, gpu_install_lab/packages.py) written as an OCI image layout here, pushed with skopeo over TLS with
the lab CA.

  STAND-IN pause image  <registry>/gpu-install-lab/pause:3.6   the real nodes' containerd sandbox image
                        (busybox sleeping until SIGTERM; the real one is a 700-byte C program we cannot fetch here)
  test image            <registry>/gpu-install-lab/hello:v1    prints a line and exits (real-node tests)
  STAND-IN gpu-manager, gpu-quota-admission  at the site registry paths sharing.mode gpumanager renders
                        (push_sharing_standins, called by the tests that need them): print their environment and
                        mounts, then sleep
  STAND-IN hami, kube-scheduler, kube-webhook-certgen  the same for sharing.mode hami (push_hami_standins)
  STAND-IN dcgm-exporter   labtools/standin-dcgm-exporter (push_dcgm_exporter_standin, dcgm_exporter_layout)
  STAND-IN GPU Operator    labtools/standin-gpu-operator at /bin/gpu-operator (operator_standin_layout): the demo's
                           upstream holds it at the release's operator image path
  STAND-IN placeholder     busybox that says what it is and sleeps (idle_standin_layout): the demo's upstream holds
                           it at the path of every other image of the release (NFD, GFD, toolkit, driver, ...)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from gpu_install_lab.sh import run

#: how a STAND-IN holds its place: sleep, and end at once on SIGTERM as the programs it stands in for do. A container's
#: first process gets no signal it has no handler for, so a bare `exec sleep` ignored the kubelet's SIGTERM and every
#: pod deletion (uninstall, a DaemonSet's rolling update, a drain) waited out the 30 s grace period for SIGKILL.
HOLD = "trap 'exit 0' TERM INT; sleep 2147483647 & wait"
PAUSE = ("gpu-install-lab/pause", "3.6")
HELLO = ("gpu-install-lab/hello", "v1")
HELLO_TEXT = "hello from a real lab node"


def busybox_binary() -> bytes:
    from gpu_install_lab import packages

    deb = next(d for d in packages.closure("debian12", ("busybox-static",), progress=lambda _m: None)
               if d.name.startswith("busybox-static_"))
    tar_bytes = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as t:
        member = t.extractfile("./bin/busybox")
        assert member is not None
        return member.read()


def write_layout(out: Path, tag: str, entrypoint: list[str], cmd: list[str] | None = None,
                 busybox: bytes | None = None, scripts: Mapping[str, str | bytes] | None = None) -> None:
    """An OCI image layout at out with one image (tag): busybox at /bin/busybox, /bin/sh and /bin/sleep links;
    scripts: more executables, {"bin/<name>": text or a binary}."""
    busybox = busybox if busybox is not None else busybox_binary()
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        d = hashlib.sha256(data).hexdigest()
        (blobs / d).write_bytes(data)
        return d

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        for d in ("bin", "tmp", "etc", "proc", "sys", "dev"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            t.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(busybox), 0o755
        t.addfile(info, io.BytesIO(busybox))
        for applet in ("sh", "sleep", "echo", "cat", "ls"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(link)
        made = {"bin"}
        for name, text in sorted((scripts or {}).items()):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in made:
                    made.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    t.addfile(info)
            data = text.encode() if isinstance(text, str) else text
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            t.addfile(info, io.BytesIO(data))
    diff_id = hashlib.sha256(raw.getvalue()).hexdigest()
    layer = gzip.compress(raw.getvalue(), mtime=0)
    ld = put(layer)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": entrypoint, "Cmd": cmd or [], "Env": ["PATH=/bin"]},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]}}
    cfg = json.dumps(config).encode()
    cd = put(cfg)
    man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + cd,
                                 "size": len(cfg)},
                      "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                  "digest": "sha256:" + ld, "size": len(layer)}]}).encode()
    md = put(man)
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + md, "size": len(man),
         "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')


def push(layout: Path, tag: str, dest: str, ca: Path) -> None:
    with tempfile.TemporaryDirectory() as certs:
        (Path(certs) / "ca.crt").write_text(ca.read_text())
        run(["skopeo", "copy", "--quiet", "--dest-cert-dir", certs, f"oci:{layout}:{tag}", f"docker://{dest}"],
            timeout=120)


def ensure_lab_images(registry: str, ca: Path, work: Path) -> dict[str, str]:
    """The STAND-IN pause image and the hello test image in the lab registry; returns {name: reference}."""
    busybox = busybox_binary()
    refs = {}
    for name, (repo, tag), entrypoint, cmd in (
        ("pause", PAUSE, ["/bin/sh", "-c", HOLD], None),
        ("hello", HELLO, ["/bin/sh", "-c"], [f"echo '{HELLO_TEXT}'; cat /etc/hostname"]),
    ):
        layout = work / name
        write_layout(layout, tag, entrypoint, cmd, busybox=busybox)
        ref = f"{registry}/{repo}:{tag}"
        push(layout, tag, ref, ca)
        refs[name] = ref
    return refs


#: STAND-INs of sharing.mode gpumanager's images (component name as installer.features.gpumanager names it -> what
#: it prints):
#: busybox printing the environment and mount points the chart gave it, then sleeping. They run no GPU code and
#: register no device plugin; they let the lab check that the objects apply, the pods are scheduled on the labelled
#: nodes, pull from the site registry and get the arguments and mounts gpu-install renders.
SHARING_STANDIN_MARK = "STAND-IN (gpu-install lab)"
_SHARING_SCRIPTS = {
    "gpuManager": ('echo "{mark} gpu-manager: no GPU, no device plugin"; echo "LOG_LEVEL=$LOG_LEVEL"; '
                   'echo "EXTRA_FLAGS=$EXTRA_FLAGS"; echo "NODE_NAME=$NODE_NAME"; '
                   'while read -r dev mnt rest; do echo "mount $mnt"; done < /proc/self/mounts; '
                   f'{HOLD}'),
    "gpuQuotaAdmission": ('echo "{mark} gpu-quota-admission: no scheduler extender"; echo "LOG_LEVEL=$LOG_LEVEL"; '
                          'echo "EXTRA_FLAGS=$EXTRA_FLAGS"; echo "config $(cat /etc/kubernetes/gpu-quota-admission.config)"; '
                          f'{HOLD}'),
}


def push_sharing_standins(refs: dict[str, str], ca: Path, work: Path) -> dict[str, str]:
    """Build and push the STAND-IN images of sharing.mode gpumanager to refs ({component: destination reference},
    e.g. from installer.features.gpumanager.FEATURE.destinations(site)); returns refs."""
    busybox = busybox_binary()
    for comp, ref in refs.items():
        tag = ref.rpartition(":")[2]
        layout = work / f"standin-{comp}"
        write_layout(layout, tag, ["/bin/sh", "-c"], [_SHARING_SCRIPTS[comp].format(mark=SHARING_STANDIN_MARK)],
                     busybox=busybox)
        push(layout, tag, ref, ca)
    return refs


#: STAND-INs of sharing.mode hami's images at the paths gpu-install mirrors them to: each executable the HAMi chart
#: runs (nvidia-device-plugin, vGPUmonitor, scheduler, kube-scheduler) is a script printing its name, arguments and
#: mount points, then sleeping (the device plugin's postStart hook script only prints); the certificate Jobs' image prints its arguments and exits 0 (it writes no Secret).
_HAMI_RUN = ('#!/bin/sh\necho "{mark} $(basename "$0"): $*"\n'
             'while read -r dev mnt rest; do echo "mount $mnt"; done < /proc/self/mounts\n' + HOLD + '\n')
_HAMI_SCRIPTS = {
    "hami": {**{f"bin/{n}": _HAMI_RUN for n in ("nvidia-device-plugin", "vGPUmonitor", "scheduler")},
             # the device plugin container's postStart hook (it copies HAMi's CUDA interception library to the host)
             "k8s-vgpu/bin/vgpu-init.sh": '#!/bin/sh\necho "{mark} vgpu-init.sh: $*"\n'},
    "hami.kubeScheduler": {"bin/kube-scheduler": _HAMI_RUN},
}


def push_hami_standins(refs: dict[str, str], ca: Path, work: Path) -> dict[str, str]:
    """Build and push the STAND-IN images of sharing.mode hami to refs ({component: destination reference}, e.g.
    installer.features.hami.FEATURE.destinations(site)); returns refs."""
    busybox = busybox_binary()
    for comp, ref in refs.items():
        tag = ref.rpartition(":")[2]
        layout = work / f"standin-{comp}"
        if comp == "hami.certgen":
            entry, cmd = ["/bin/sh", "-c", f'echo "{SHARING_STANDIN_MARK} kube-webhook-certgen: $*"', "certgen"], None
            scripts = None
        else:
            entry, cmd = ["/bin/sh", "-c", HOLD], None
            scripts = {k: v.format(mark=SHARING_STANDIN_MARK) for k, v in _HAMI_SCRIPTS[comp].items()}
        write_layout(layout, tag, entry, cmd, busybox=busybox, scripts=scripts)
        push(layout, tag, ref, ca)
    return refs


EXPORTER = "standin-dcgm-exporter"  # labtools/, built by scripts/build-lab-tools


def dcgm_exporter_layout(work: Path, tag: str = "standin", tools: Path | None = None) -> Path:
    """An OCI layout (work/standin-dcgm-exporter, image `tag`) of the STAND-IN dcgm-exporter:
    labtools/standin-dcgm-exporter at /bin/dcgm-exporter, its entrypoint, with busybox."""
    from gpu_install_lab.gpus import tools_dir

    binary = ((tools or tools_dir()) / EXPORTER).read_bytes()
    layout = work / "standin-dcgm-exporter"
    write_layout(layout, tag, ["/bin/dcgm-exporter"], None, scripts={"bin/dcgm-exporter": binary})
    return layout


def push_dcgm_exporter_standin(ref: str, ca: Path, work: Path, tools: Path | None = None) -> str:
    """The STAND-IN dcgm-exporter image pushed to ref, the site-registry path gpu-install mirrors the release's
    dcgm-exporter to; returns ref."""
    tag = ref.rpartition(":")[2] if "@" not in ref else "standin"
    push(dcgm_exporter_layout(work, tag, tools), tag, ref, ca)
    return ref


OPERATOR = "standin-gpu-operator"  # labtools/, built by scripts/build-lab-tools


def operator_standin_layout(work: Path, tag: str = "standin", tools: Path | None = None) -> Path:
    """An OCI layout (work/standin-gpu-operator, image `tag`) of the STAND-IN GPU Operator: labtools/
    standin-gpu-operator at /bin/gpu-operator (the command NVIDIA's chart runs), its entrypoint, with busybox. It
    plays what `gpu-install validate` reads of the operator: the device plugin DaemonSet and ClusterPolicy
    status.state (labtools/standin-gpu-operator/main.go)."""
    from gpu_install_lab.gpus import tools_dir

    binary = ((tools or tools_dir()) / OPERATOR).read_bytes()
    layout = work / "standin-gpu-operator"
    write_layout(layout, tag, ["/bin/gpu-operator"], None, scripts={"bin/gpu-operator": binary})
    return layout


IDLE_TEXT = ("STAND-IN image (gpu-install lab): holds the place of an NVIDIA image that cannot run offline; it runs "
             "nothing of it")


def idle_standin_layout(work: Path, tag: str = "standin") -> Path:
    """An OCI layout (work/standin-idle, image `tag`): busybox whose entrypoint prints IDLE_TEXT and sleeps, so that
    a pod of it stays Running (sh, sleep, echo, cat, ls for scripts and probes that a caller gives it)."""
    layout = work / "standin-idle"
    write_layout(layout, tag, ["/bin/sh", "-c", f"echo '{IDLE_TEXT}'; {HOLD}"])
    return layout
