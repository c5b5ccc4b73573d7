"""kubelet-standin: the lab's STAND-IN for the kubelet's static-pod runner (not a kubelet).

A real control-plane node runs kube-scheduler (and friends) as static pods: the kubelet watches
/etc/kubernetes/manifests and runs each Pod manifest there. The lab has no kubelet that runs
containers (its nodes are kubemark hollow kubelets), so this small supervisor does that one job
for the lab's control plane, faithfully enough that what gpu-install's scheduler_policy role does
to the manifest is exercised against the real kube-scheduler binary:

* polls the manifest directory (every ~0.5 s); every *.yaml / *.yml / *.json file there is a Pod
  manifest (other files are ignored here -- note that the real kubelet reads EVERY file in that
  directory, which is why backups must never be written into it);
* runs the first container's command + args; when a file's content changes or the process exits,
  it stops the old process (SIGTERM, then SIGKILL) and starts the new one -- a crash loop restarts
  with a doubling back-off (1 s .. 30 s here; the kubelet uses 10 s .. 5 min), reset by a content
  change or a run longer than 60 s; a deleted manifest stops its process; an unparsable manifest is
  logged and its old process stopped;
* container filesystem: in a private mount namespace (`unshare --mount --propagation private`)
  a tmpfs root gets the image's binary (image name -> <bin-dir>/<name>, at /usr/local/bin/<name>),
  /proc, /dev, the host's /etc/hosts and /etc/resolv.conf (read-only), and each volumeMount's
  hostPath at its mountPath (readOnly honoured, hostPath `type` checked like the kubelet does);
  then chroot + exec. So a file the manifest forgets to mount is really missing for the binary;
* host network only (the lab's manifests are hostNetwork; a pod without it is refused);
  dnsPolicy is recorded in the state file but has no effect (there is no cluster DNS in the lab);
* each container's stdout/stderr goes to <logs>/<pod>.log (appended; a line marks each
  (re)start and why); each process is recorded (gpu_install_lab.proc: pid + start time + boot id) in
  the state file, so the lab's `down` can stop them by identity even if this supervisor was killed.

What it is NOT: no images (binaries come from the lab's build), no pod sandbox, no pid/ipc/uts
namespaces, no cgroups or resource limits, no probes, no API mirror pods, no restartPolicy other
than Always, only hostPath volumes, only the first container.

Usage: python -m gpu_install_lab.staticpods --manifests DIR --logs DIR --bin-dir DIR [--state FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_install_lab import proc

PROCESS_NAME = "kubelet-standin"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
CONTAINER_BIN_DIR = "/usr/local/bin"
CONTAINER_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
POLL_INTERVAL = 0.5
BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_RESET_AFTER = 1.0, 30.0, 60.0
STOP_GRACE = 10.0
HOSTPATH_TYPES = ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                  "BlockDevice")


class ManifestError(Exception):
    """The manifest cannot be run (the kubelet would refuse it or fail the pod)."""


@dataclass
class Mount:
    source: str  # host path
    target: str  # path inside the container
    read_only: bool
    is_file: bool


@dataclass
class ContainerPlan:
    pod: str
    binary: str  # host path of the image's binary
    argv: list[str]  # inside the container: argv[0] is the binary's container path
    mounts: list[Mount] = field(default_factory=list)
    dns_policy: str = "ClusterFirst"


# --------------------------------------------------------------------------- manifest -> plan (pure)
def parse_manifest(text: str, name: str = "manifest") -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{name}: not valid YAML/JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{name}: a Pod manifest must be a mapping")
    if doc.get("kind") != "Pod" or doc.get("apiVersion") != "v1":
        raise ManifestError(f"{name}: kind {doc.get('kind')!r} apiVersion {doc.get('apiVersion')!r}; "
                            "a static pod manifest is kind Pod, apiVersion v1")
    if not (doc.get("metadata") or {}).get("name"):
        raise ManifestError(f"{name}: metadata.name is missing")
    containers = (doc.get("spec") or {}).get("containers") or []
    if not containers or not isinstance(containers[0], dict):
        raise ManifestError(f"{name}: spec.containers is empty")
    return doc


def image_binary_name(image: str) -> str:
    """registry.k8s.io/kube-scheduler:v1.20.2 -> kube-scheduler (what the lab's build provides)."""
    last = image.rsplit("/", 1)[-1]
    return last.split("@", 1)[0].split(":", 1)[0]


def image_tag(image: str) -> str:
    last = image.rsplit("/", 1)[-1].split("@", 1)[0]
    return last.split(":", 1)[1] if ":" in last else ""


def _check_hostpath(path: str, kind: str, where: str) -> bool:
    """The kubelet's hostPath type checks; creates what *OrCreate asks for. Returns is_file."""
    if kind not in HOSTPATH_TYPES:
        raise ManifestError(f"{where}: hostPath type {kind!r} is not a valid type")
    p = Path(path)
    if kind == "DirectoryOrCreate":
        p.mkdir(mode=0o755, parents=True, exist_ok=True)
    elif kind == "FileOrCreate" and not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch(mode=0o644)
    if kind in ("Directory", "DirectoryOrCreate") and not p.is_dir():
        raise ManifestError(f"{where}: hostPath type check failed: {path} is not a directory")
    if kind in ("File", "FileOrCreate") and not p.is_file():
        raise ManifestError(f"{where}: hostPath type check failed: {path} is not a file")
    if kind == "" and not p.exists():
        p.mkdir(mode=0o755, parents=True)  # like a bind mount of a missing source: a directory
    return not p.is_dir()


def plan(doc: dict[str, Any], bin_dir: Path, name: str = "manifest") -> ContainerPlan:
    """What the stand-in runs for a parsed Pod manifest: binary, container argv, mounts."""
    spec = doc.get("spec") or {}
    pod = str(doc["metadata"]["name"])
    if spec.get("hostNetwork") is not True:
        raise ManifestError(f"{name}: pod {pod} is not hostNetwork; the lab's kubelet stand-in runs "
                            "host-network pods only (it has no pod network)")
    c = spec["containers"][0]
    image = str(c.get("image") or "")
    if not image:
        raise ManifestError(f"{name}: containers[0].image is missing")
    binary_name = image_binary_name(image)
    binary = Path(bin_dir) / binary_name
    if not os.access(binary, os.X_OK):
        raise ManifestError(f"{name}: image {image}: the stand-in has no binary {binary} for it")
    command = [str(a) for a in (c.get("command") or [])]
    args = [str(a) for a in (c.get("args") or [])]
    if not command:
        raise ManifestError(f"{name}: containers[0].command is empty (the stand-in knows no image entrypoints)")
    exe = command[0]
    in_container = f"{CONTAINER_BIN_DIR}/{binary_name}"
    if "/" in exe:
        if exe != in_container:
            raise ManifestError(f"{name}: {exe}: no such file in image {image} (it has {in_container})")
    elif exe != binary_name:
        raise ManifestError(f"{name}: {exe}: executable file not found in $PATH of image {image}")
    volumes: dict[str, dict[str, Any]] = {}
    for v in spec.get("volumes") or []:
        if not isinstance(v, dict) or not v.get("name"):
            raise ManifestError(f"{name}: spec.volumes: every volume needs a name")
        volumes[str(v["name"])] = v
    mounts: list[Mount] = []
    for vm in c.get("volumeMounts") or []:
        vname, target = str(vm.get("name") or ""), str(vm.get("mountPath") or "")
        if vname not in volumes:
            raise ManifestError(f"{name}: volumeMount {vname!r}: no volume of that name in spec.volumes")
        if not target.startswith("/"):
            raise ManifestError(f"{name}: volumeMount {vname!r}: mountPath must be absolute")
        hp = volumes[vname].get("hostPath")
        if not isinstance(hp, dict) or not hp.get("path"):
            raise ManifestError(f"{name}: volume {vname!r}: the stand-in supports hostPath volumes only")
        source = str(hp["path"])
        is_file = _check_hostpath(source, str(hp.get("type") or ""), f"{name}: volume {vname!r}")
        mounts.append(Mount(source, target, bool(vm.get("readOnly")), is_file))
    return ContainerPlan(pod=pod, binary=str(binary), argv=[in_container, *command[1:], *args],
                         mounts=mounts, dns_policy=str(spec.get("dnsPolicy") or "ClusterFirst"))


def mount_script(p: ContainerPlan) -> str:
    """sh script run in a fresh private mount namespace: $1 = an empty directory that becomes the
    tmpfs root; the rest of "$@" is the container argv. Ends in chroot + exec."""
    q = shlex.quote
    lines = [
        "set -eu",
        'root="$1"; shift',
        'mount -t tmpfs -o mode=0755 kubelet-standin-root "$root"',
        'cd "$root"',
        "mkdir -p proc dev tmp etc usr/local/bin && chmod 1777 tmp",
        "mount -t proc proc proc",
        "mount --rbind /dev dev",
    ]

    def bind(source: str, target: str, ro: bool, is_file: bool) -> None:
        rel = q("." + target)
        if is_file:
            lines.append(f'mkdir -p "$(dirname {rel})" && touch {rel}')
        else:
            lines.append(f"mkdir -p {rel}")
        lines.append(f"mount --bind {q(source)} {rel}")
        if ro:
            lines.append(f"mount -o remount,bind,ro {rel}")

    bind(p.binary, p.argv[0], True, True)
    for hostfile in ("/etc/hosts", "/etc/resolv.conf"):
        if os.path.exists(hostfile):
            bind(hostfile, hostfile, True, True)
    for m in p.mounts:
        bind(m.source, m.target, m.read_only, m.is_file)
    lines.append('cd /; exec chroot "$root" "$@"')
    return "\n".join(lines) + "\n"


def launch_argv(p: ContainerPlan, root: Path) -> list[str]:
    """Host argv: unshare (no fork: the pid stays the container's) -> sh (mounts) -> chroot -> binary."""
    return ["unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", mount_script(p), "kubelet-standin-mounts", str(root), *p.argv]


# --------------------------------------------------------------------------- the supervisor
@dataclass
class Pod:
    manifest: Path
    digest: str
    plan: ContainerPlan | None
    proc: subprocess.Popen[bytes] | None = None
    record: dict[str, Any] | None = None
    started: float = 0.0
    restarts: int = 0
    backoff: float = 0.0
    next_start: float = 0.0
    error: str | None = None


class Supervisor:
    def __init__(self, manifests: Path, logs: Path, bin_dir: Path, state: Path | None = None,
                 interval: float = POLL_INTERVAL):
        self.manifests, self.logs, self.bin_dir = Path(manifests), Path(logs), Path(bin_dir)
        self.state = Path(state) if state else self.logs / f"{PROCESS_NAME}.json"
        self.rootfs = self.state.parent / f"{PROCESS_NAME}-rootfs"
        self.interval = interval
        self.pods: dict[Path, Pod] = {}
        self.running = True

    # ---------------------------------------------------------------- logging / state
    def say(self, msg: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {PROCESS_NAME}: {msg}", file=sys.stderr, flush=True)

    def _pod_log(self, name: str) -> Path:
        self.logs.mkdir(parents=True, exist_ok=True)
        return self.logs / f"{name}.log"

    def _mark(self, name: str, msg: str) -> None:
        with open(self._pod_log(name), "a", encoding="utf-8") as fh:
            fh.write(f"---- {PROCESS_NAME} {time.strftime('%Y-%m-%dT%H:%M:%S')}: {msg} ----\n")

    def save(self) -> None:
        pods = {}
        for path, pod in self.pods.items():
            name = pod.plan.pod if pod.plan else path.stem
            pods[name] = {"manifest": str(path), "sha256": pod.digest, "restarts": pod.restarts,
                          "error": pod.error, "log": str(self._pod_log(name)),
                          "dnsPolicy": pod.plan.dns_policy if pod.plan else None,
                          **({k: pod.record[k] for k in ("pid", "start", "boot")}
                             if pod.record and pod.proc is not None and pod.proc.poll() is None else {})}
        data = {"supervisor": proc.identity(os.getpid()), "pods": pods}
        tmp = self.state.with_name(f".{self.state.name}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.state)

    def adopt_leftovers(self) -> None:
        """A previous supervisor that died (SIGKILL) may have left its pods running: stop them."""
        try:
            old = json.loads(self.state.read_text())
        except (OSError, ValueError):
            return
        for name, rec in (old.get("pods") or {}).items():
            if proc.alive(rec):
                self.say(f"stopping {name} (pid {rec['pid']}) left by an earlier {PROCESS_NAME}")
                proc.stop(rec, grace=STOP_GRACE)

    # ---------------------------------------------------------------- pods
    def start(self, pod: Pod, why: str) -> None:
        assert pod.plan is not None
        root = self.rootfs / pod.plan.pod
        root.mkdir(parents=True, exist_ok=True)
        self._mark(pod.plan.pod, f"starting {pod.plan.pod} from {pod.manifest} ({why})")
        with open(self._pod_log(pod.plan.pod), "ab") as log:
            pod.proc = subprocess.Popen(
                launch_argv(pod.plan, root), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={"PATH": ":".join(CONTAINER_PATH), "HOME": "/root"}, close_fds=True, start_new_session=True)
        pod.record = proc.identity(pod.proc.pid)
        pod.started = time.monotonic()
        self.say(f"started {pod.plan.pod} (pid {pod.proc.pid}): {why}")

    def stop(self, pod: Pod, why: str) -> None:
        if pod.proc is None:
            return
        name = pod.plan.pod if pod.plan else pod.manifest.stem
        if pod.proc.poll() is None:
            self._mark(name, f"stopping pid {pod.proc.pid} ({why})")
            pod.proc.send_signal(signal.SIGTERM)
            try:
                pod.proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                pod.proc.kill()
                pod.proc.wait()
            self.say(f"stopped {name} (pid {pod.proc.pid}): {why}")
        pod.proc = None
        pod.record = None

    def _manifest_files(self) -> dict[Path, bytes]:
        out: dict[Path, bytes] = {}
        try:
            entries = sorted(self.manifests.iterdir())
        except OSError:
            return out
        for p in entries:
            if p.suffix not in MANIFEST_SUFFIXES or p.name.startswith(".") or not p.is_file():
                continue
            try:
                out[p] = p.read_bytes()
            except OSError:
                continue
        return out

    def tick(self) -> None:
        now = time.monotonic()
        files = self._manifest_files()
        for path in list(self.pods):
            if path not in files:
                self.stop(self.pods.pop(path), "manifest removed")
        for path, content in files.items():
            digest = hashlib.sha256(content).hexdigest()
            pod = self.pods.get(path)
            if pod is not None and pod.digest == digest:
                if pod.plan is None:
                    continue
                if pod.proc is not None and pod.proc.poll() is not None:
                    rc = pod.proc.returncode
                    ran = now - pod.started
                    pod.backoff = BACKOFF_FIRST if ran > BACKOFF_RESET_AFTER or not pod.backoff \
                        else min(pod.backoff * 2, BACKOFF_MAX)
                    pod.next_start = now + pod.backoff
                    pod.restarts += 1
                    self._mark(pod.plan.pod, f"container exited with code {rc} after {ran:.1f}s; "
                                             f"restarting in {pod.backoff:.0f}s (back-off)")
                    self.say(f"{pod.plan.pod} exited ({rc}); back-off {pod.backoff:.0f}s")
                    pod.proc = pod.record = None
                if pod.proc is None and now >= pod.next_start:
                    self.start(pod, f"restart {pod.restarts} after exit")
                continue
            why = "manifest changed" if pod is not None else "new manifest"
            if pod is not None:
                self.stop(pod, why)
            try:
                doc = parse_manifest(content.decode("utf-8", errors="replace"), str(path))
                the_plan = plan(doc, self.bin_dir, str(path))
            except ManifestError as exc:
                self.pods[path] = Pod(path, digest, None, error=str(exc))
                self.say(f"cannot run {path}: {exc}")
                old_name = pod.plan.pod if pod is not None and pod.plan else path.stem
                self._mark(old_name, f"cannot run {path}: {exc}")
                continue
            new = Pod(path, digest, the_plan)
            self.pods[path] = new
            self.start(new, why)
        self.save()

    def run(self) -> int:
        def _term(*_: Any) -> None:
            self.running = False

        signal.signal(signal.SIGTERM, _term)
        signal.signal(signal.SIGINT, _term)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.adopt_leftovers()
        self.say(f"watching {self.manifests} (stand-in for the kubelet's static pods)")
        try:
            while self.running:
                self.tick()
                time.sleep(self.interval)
        finally:
            for pod in self.pods.values():
                self.stop(pod, f"{PROCESS_NAME} stopping")
            self.save()
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m gpu_install_lab.staticpods ({PROCESS_NAME})",
                                 description="the lab's stand-in for the kubelet's static-pod runner")
    ap.add_argument("--manifests", type=Path, required=True, help="static pod manifest directory")
    ap.add_argument("--logs", type=Path, required=True, help="directory for <pod>.log")
    ap.add_argument("--bin-dir", type=Path, required=True, help="where image names find their binaries")
    ap.add_argument("--state", type=Path, default=None, help="state file (default <logs>/kubelet-standin.json)")
    args = ap.parse_args(argv)
    try:  # a recognisable process name (ps, top) for the stand-in
        import ctypes

        ctypes.CDLL(None).prctl(15, PROCESS_NAME.encode(), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
    return Supervisor(args.manifests, args.logs, args.bin_dir, args.state).run()


if __name__ == "__main__":
    sys.exit(main())
