"""The lab's Kubernetes control plane: etcd + kube-apiserver + kube-scheduler +
kube-controller-manager on 127.0.0.1, and one kubemark hollow kubelet per lab node.

Binaries: kubernetes 1.20.2 built from Debian's `kubernetes` source package by
scripts/build-kubernetes into <cache>/kubernetes/1.20.2/bin (built once, then cached);
etcd 3.4 is Debian's etcd-server. kube-scheduler runs as a kubeadm-like static pod
(<lab_dir>/kube/manifests/kube-scheduler.yaml) under the lab's kubelet stand-in
(gpu_install_lab/staticpods.py, process "kubelet-standin"), so that gpu-install's scheduler_policy role
edits a real static-pod manifest; the stand-in's pods are stopped by recorded identity too.

Nodes are kubemark hollow kubelets (`kubemark --morph=kubelet`): the real kubelet code with a fake
container runtime. They register a Node, renew its lease, report status, admit pods and report
them Running -- but they run no containers. GPU capacity (nvidia.com/gpu, nvidia.com/mig-*) is
patched onto the Node status (the kubelet keeps extended resources it does not manage) and
GFD-style labels onto its metadata, so the scheduler places GPU pods exactly as in a real cluster.

Network (the lab's rule: traffic only on loopback or inside namespaces the lab creates):
  * every control-plane component listens on 127.0.0.1 only (free ports, chosen at first `up`);
  * the hollow kubelets live in one network namespace of ours (`gik-<hash>`) that has nothing but
    `lo`, carrying 127.0.0.1 and one fake address per node from 198.51.100.0/24 (TEST-NET-2,
    never routed). A small forwarder of ours accepts on 127.0.0.1:6443 inside that namespace and
    connects to the apiserver on the host's loopback. Each kubelet also gets a private mount
    namespace: its own /tmp (kubemark's fixed fake-runtime socket), /var/log, /etc/hosts (its name
    -> its fake IP, so no DNS query is ever sent) and /etc/resolv.conf (nameserver 127.0.0.1);
  * the apiserver's "cluster" egress (kubelet logs/exec/port-forward, proxies, webhooks to
    services) goes through an egress selector whose proxy is a Unix socket nobody listens on, so
    the apiserver never opens a connection to a node's (fake) IP: such requests fail at once.

State: everything lives under <lab_dir>/kube (CA and certs, the static token file of the admin,
scheduler and controller-manager, kubeconfigs, etcd data, logs, state.json); kubelets authenticate
with client certificates (CN=system:node:<name>, O=system:nodes) signed by the lab CA. Each process is recorded with pid + start time + boot id right after it is started,
the network namespace before it is created; down() stops only processes whose identity still
matches, deletes the namespace and removes the directory.

Manual use:  python -m gpu_install_lab.kube up|down|status [--lab-dir DIR] [--nodes N]
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from gpu_install_lab import proc
from installer.errors import ConfigError, EnvironmentProblem
from installer.util import atomic_write, cache_dir

KUBE_VERSION = "1.20.2"
STATE_VERSION = 1
BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubemark", "kubectl")
SERVICE_CIDR = "10.96.0.0/24"
FAKE_NODE_NET = ipaddress.ip_network("198.51.100.0/24")  # TEST-NET-2 (RFC 5737): never routed
FAKE_NODE_FIRST = 10
NETNS_APISERVER_PORT = 6443  # where the forwarder listens inside the nodes' namespace
KUBELET_PORT_BASE = 10250  # inside the nodes' namespace (ours alone), one port per node
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
STANDIN = "kubelet-standin"  # gpu_install_lab/staticpods.py: runs the static pods (kube-scheduler)
SCHEDULER_IMAGE = f"registry.k8s.io/kube-scheduler:v{KUBE_VERSION}"
DEFAULT_GPU_PRODUCT = "NVIDIA-A100-SXM4-40GB"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-kubernetes"

Progress = Callable[[str], Any]


# --------------------------------------------------------------------------- ports
def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- binaries
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
            f"kubernetes {KUBE_VERSION}: building kube-apiserver, kube-scheduler, "
            f"kube-controller-manager, kubemark, kubectl from Debian's source package "
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


# --------------------------------------------------------------------------- PKI
def _pki(d: Path) -> None:
    """CA, apiserver serving cert and service-account key pair (EC P-256), once."""
    if (d / "sa.pub").exists():
        return
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=3650)

    def key_pem(key) -> str:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-install-lab-kubernetes-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    srv_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName(n)
        for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "kubernetes.default.svc.cluster.local")
    ]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "10.96.0.1")]
    srv = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = ec.generate_private_key(ec.SECP256R1())
    pem = serialization.Encoding.PEM
    atomic_write(d / "ca.key", key_pem(ca_key), mode=0o600)
    atomic_write(d / "ca.crt", ca.public_bytes(pem).decode())
    atomic_write(d / "apiserver.key", key_pem(srv_key), mode=0o600)
    atomic_write(d / "apiserver.crt", srv.public_bytes(pem).decode())
    atomic_write(d / "sa.key", key_pem(sa_key), mode=0o600)
    atomic_write(
        d / "sa.pub",
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
    )


def _client_cert(d: Path, user: str, group: str) -> tuple[str, str]:
    """A client certificate (CN=user, O=group) signed by the lab CA: how kubelets authenticate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, group),
                                 x509.NameAttribute(NameOID.COMMON_NAME, user)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem


# --------------------------------------------------------------------------- labels / resources
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_DNS_SUB = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MIG_COUNT = re.compile(r"^nvidia\.com/(mig-[0-9a-z.+-]+)\.count$")


def _check_label(key: str, value: str, where: str) -> None:
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not _DNS_SUB.match(prefix))) or not _LABEL_NAME.match(name):
        raise ConfigError(f"{where}: invalid label key {key!r}", hint="use [prefix/]name, name <= 63 chars")
    if value and not _LABEL_NAME.match(value):
        raise ConfigError(
            f"{where}: invalid value {value!r} for label {key!r}",
            hint="label values are <= 63 chars of [A-Za-z0-9-_.], starting and ending alphanumeric",
        )


def node_labels(node: dict[str, Any]) -> dict[str, str]:
    """GFD-style labels for a lab node (caller's labels win over the defaults)."""
    gpus = int(node.get("gpus") or 0)
    labels: dict[str, str] = {"gpu-install.lab/hollow-node": "true"}
    if gpus > 0:
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.product": DEFAULT_GPU_PRODUCT,
                "nvidia.com/gpu.memory": "40960",
                "nvidia.com/gpu.family": "ampere",
                "nvidia.com/gpu.compute.major": "8",
                "nvidia.com/gpu.compute.minor": "0",
                "nvidia.com/gpu.machine": "lab-hollow-node",
                "nvidia.com/cuda.driver.major": "535",
                "nvidia.com/cuda.driver.minor": "216",
                "nvidia.com/cuda.driver.rev": "03",
                "nvidia.com/cuda.runtime.major": "12",
                "nvidia.com/cuda.runtime.minor": "2",
                "nvidia.com/mig.capable": "false",
                "nvidia.com/gfd.timestamp": str(int(time.time())),
            }
        )
    given = node.get("labels") or {}
    if gpus > 0 and any(_MIG_COUNT.match(str(k)) for k in given):
        labels["nvidia.com/mig.capable"] = "true"
    for k, v in given.items():
        labels[str(k)] = "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
    for k, v in labels.items():
        _check_label(k, v, f"node {node.get('name')!r}")
    return labels


def node_resources(node: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """Extended resources: nvidia.com/gpu from "gpus", nvidia.com/mig-<profile> from GFD mixed-strategy
    labels `nvidia.com/mig-<profile>.count` and from an optional "extra"/"resources" mapping."""
    res: dict[str, str] = {}
    gpus = int(node.get("gpus") or 0)
    if gpus < 0:
        raise ConfigError(f"node {node.get('name')!r}: gpus must be >= 0, got {gpus}")
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
    for k, v in labels.items():
        m = _MIG_COUNT.match(k)
        if m:
            res[f"nvidia.com/{m.group(1)}"] = str(int(v))
    for key in ("extra", "resources"):
        for k, v in (node.get(key) or {}).items():
            if "/" not in k or k.startswith("kubernetes.io/") or not _DNS_SUB.match(k.split("/")[0]):
                raise ConfigError(
                    f"node {node.get('name')!r}: {k!r} is not an extended resource name",
                    hint="use a domain-prefixed name such as nvidia.com/mig-1g.5gb",
                )
            res[str(k)] = str(int(v))
    return res


# --------------------------------------------------------------------------- static pod manifest
def scheduler_manifest(port: int, kubeconfig: Path) -> str:
    """The lab's kube-scheduler static pod, shaped like kubeadm's (hostNetwork, kubeconfig as a
    read-only hostPath File mount at /etc/kubernetes/scheduler.conf)."""
    import yaml

    conf = "/etc/kubernetes/scheduler.conf"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kube-scheduler", "namespace": "kube-system",
                     "labels": {"component": "kube-scheduler", "tier": "control-plane"}},
        "spec": {
            "containers": [{
                "name": "kube-scheduler",
                "image": SCHEDULER_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["kube-scheduler", f"--kubeconfig={conf}", f"--authentication-kubeconfig={conf}",
                            f"--authorization-kubeconfig={conf}", "--bind-address=127.0.0.1",
                            f"--secure-port={port}", "--port=0", "--leader-elect=false"],
                "volumeMounts": [{"mountPath": conf, "name": "kubeconfig", "readOnly": True}],
            }],
            "hostNetwork": True,
            "priorityClassName": "system-node-critical",
            "volumes": [{"hostPath": {"path": str(kubeconfig), "type": "File"}, "name": "kubeconfig"}],
        },
    }
    return ("# kube-scheduler static pod of the gpu-install lab (run by the lab's kubelet stand-in,\n"
            "# gpu_install_lab/staticpods.py). Backups of this file belong OUTSIDE this directory.\n"
            + yaml.safe_dump(pod, sort_keys=False))


# --------------------------------------------------------------------------- the control plane
class ControlPlane:
    """See the module docstring. All state under lab_dir/"kube"."""

    def __init__(self, lab_dir: Path, progress: Progress = print):
        self.lab_dir = Path(lab_dir)
        self.dir = self.lab_dir / "kube"
        self.kubeconfig = self.dir / "kubeconfig"
        self.progress = progress
        self.state_path = self.dir / "state.json"
        self.state: dict[str, Any] = self._load()

    # ---------------------------------------------------------------- state
    def _load(self) -> dict[str, Any]:
        blank = {"version": STATE_VERSION, "ports": {}, "processes": {}, "nodes": {}, "netns": None}
        if not self.state_path.exists():
            return blank
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as exc:
            raise EnvironmentProblem(
                f"control-plane state {self.state_path} is unreadable: {exc}",
                hint=f"make sure no lab process is left, then remove {self.dir}",
            ) from exc
        blank.update(data)
        return blank

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(self.state_path, json.dumps(self.state, indent=2, sort_keys=True) + "\n", mode=0o600)

    @property
    def netns(self) -> str:
        return "gik-" + hashlib.sha1(str(self.dir.resolve()).encode()).hexdigest()[:10]

    def _port(self, name: str, owner: str | None = None) -> int:
        """The port recorded for name; a new free one if there is none yet, or if its owner process
        is not running and something else took the port meanwhile (e.g. after a reboot)."""
        ports = self.state["ports"]
        if name in ports and owner and not self._running(owner) and not _port_free(int(ports[name])):
            self.progress(f"kube: port {ports[name]} of {name} is taken by something else; choosing another")
            del ports[name]
        if name not in ports:
            used = set(ports.values())
            port = _free_port()
            while port in used:
                port = _free_port()
            ports[name] = port
            self._save()
        return int(ports[name])

    # ---------------------------------------------------------------- processes
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        log_path = self.dir / "logs" / f"{name}.log"
        rec = proc.spawn(argv, log_path, env=env or None)  # its own session: survives the CLI, never gets its Ctrl-C
        rec.update(argv=argv[:3] + (["..."] if len(argv) > 3 else []), log=str(log_path))
        self.state["processes"][name] = rec  # recorded at once: down() can stop it after a crash
        self._save()
        return rec

    def _stop_component(self, name: str) -> None:
        rec = self.state["processes"].get(name)
        if rec:
            proc.stop(rec)
            self.state["processes"].pop(name, None)
            self._save()

    def _running(self, name: str) -> bool:
        return proc.alive(self.state["processes"].get(name))

    def _log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.dir / "logs" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n    ".join(text.splitlines()[-lines:])

    def _wait(self, what: str, check: Callable[[], bool], timeout: float, proc_name: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc_name and not self._running(proc_name):
                raise EnvironmentProblem(
                    f"{proc_name} exited while waiting for {what}; log tail:\n    {self._log_tail(proc_name)}",
                    hint=f"full log: {self.dir / 'logs' / (proc_name + '.log')}",
                )
            try:
                if check():
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.3)
        tail = self._log_tail(proc_name) if proc_name else ""
        raise EnvironmentProblem(
            f"timed out after {timeout:.0f}s waiting for {what}" + (f"; log tail:\n    {tail}" if tail else ""),
            hint=f"logs in {self.dir / 'logs'}",
        )

    # ---------------------------------------------------------------- http checks
    def _token(self, user: str) -> str:
        return self.state["tokens"][user]

    def _https_get(self, port: int, path: str, token: str | None = None, verify_ca: bool = True) -> tuple[int, str]:
        if verify_ca:
            ctx = ssl.create_default_context(cafile=str(self.dir / "pki" / "ca.crt"))
        else:  # self-signed serving certs of scheduler / controller-manager, loopback only
            ctx = ssl._create_unverified_context()  # noqa: S323
        req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=3) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def _etcd_healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.state['ports']['etcd-client']}/health"
        with urllib.request.urlopen(url, timeout=3) as resp:
            return json.loads(resp.read()).get("health") == "true"

    def _apiserver_ready(self) -> bool:
        code, _ = self._https_get(self.state["ports"]["kube-apiserver"], "/readyz", self._token("admin"))
        return code == 200

    def _healthz(self, component: str) -> bool:
        code, body = self._https_get(self.state["ports"][component], "/healthz", verify_ca=False)
        return code == 200 and body.strip() == "ok"

    # ---------------------------------------------------------------- config files
    def _write_kubeconfig(self, path: Path, server: str, user: str, token: str | None = None,
                          cert: str | None = None, key: str | None = None) -> None:
        ca = base64.b64encode((self.dir / "pki" / "ca.crt").read_bytes()).decode()
        creds = {"token": token} if token else {
            "client-certificate-data": base64.b64encode(cert.encode()).decode(),  # type: ignore[union-attr]
            "client-key-data": base64.b64encode(key.encode()).decode(),  # type: ignore[union-attr]
        }
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gpu-install-lab", "cluster": {"server": server, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": "gpu-install-lab", "context": {"cluster": "gpu-install-lab", "user": user}}],
            "current-context": "gpu-install-lab",
        }
        atomic_write(path, json.dumps(cfg, indent=2) + "\n", mode=0o600)

    def _ensure_tokens(self) -> None:
        tokens = self.state.setdefault("tokens", {})
        for user in ("admin", "kube-scheduler", "kube-controller-manager"):
            tokens.setdefault(user, base64.b32encode(os.urandom(20)).decode().lower())
        self._save()
        self._write_token_file()

    def _write_token_file(self) -> None:
        # token,user,uid,"group1,group2"
        rows = [
            f'{self._token("admin")},lab-admin,lab-admin,"system:masters"',
            f'{self._token("kube-scheduler")},system:kube-scheduler,system:kube-scheduler',
            f'{self._token("kube-controller-manager")},system:kube-controller-manager,system:kube-controller-manager',
        ]
        atomic_write(self.dir / "tokens.csv", "\n".join(rows) + "\n", mode=0o600)

    # ---------------------------------------------------------------- up
    def up(self) -> None:
        """Start (or leave running) etcd, kube-apiserver, kube-scheduler, kube-controller-manager."""
        if os.geteuid() != 0:
            raise EnvironmentProblem(
                "the lab control plane needs root (network and mount namespaces for the hollow nodes)",
                hint="run as root (sudo)",
            )
        bins = ensure_binaries(self.progress)
        etcd = etcd_binary()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)
        self.state["bin_dir"] = str(bins)
        self._save()
        _pki(self.dir / "pki")
        self._ensure_tokens()
        pki = self.dir / "pki"
        t0 = time.monotonic()

        # etcd
        before = dict(self.state["ports"])
        client, peer = self._port("etcd-client", "etcd"), self._port("etcd-peer", "etcd")
        if before.get("etcd-client") not in (None, client):
            self._stop_component("kube-apiserver")  # it points at the old etcd port
        if not self._running("etcd"):
            self.progress(f"kube: starting etcd on 127.0.0.1:{client}")
            self._spawn(
                "etcd",
                [
                    etcd,
                    "--name=lab",
                    f"--data-dir={self.dir / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{client}",
                    f"--advertise-client-urls=http://127.0.0.1:{client}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-cluster=lab=http://127.0.0.1:{peer}",
                    "--initial-cluster-state=new",
                    "--logger=zap",
                    "--log-outputs=stderr",
                ],
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},  # no stray ETCD_* settings
            )
        self._wait("etcd health", self._etcd_healthy, 60, "etcd")

        # kube-apiserver
        api = self._port("kube-apiserver", "kube-apiserver")
        if before.get("kube-apiserver") not in (None, api):
            for comp in (STANDIN, "kube-scheduler", "kube-controller-manager", "apiserver-forwarder"):
                self._stop_component(comp)  # their kubeconfig / target is the old port
        egress = self.dir / "egress-selector.yaml"
        atomic_write(
            egress,
            "# The apiserver's traffic to nodes, pods and services ('cluster') goes to a proxy on a Unix\n"
            "# socket that nobody listens on: nothing ever connects to a hollow node's (fake) IP.\n"
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n"
            "- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n"
            f"        udsName: {self.dir / 'no-egress.sock'}\n",
        )
        if not self._running("kube-apiserver"):
            self.progress(f"kube: starting kube-apiserver on https://127.0.0.1:{api}")
            self._spawn(
                "kube-apiserver",
                [
                    str(bins / "kube-apiserver"),
                    "--bind-address=127.0.0.1",
                    f"--secure-port={api}",
                    "--insecure-port=0",
                    "--advertise-address=127.0.0.1",
                    "--endpoint-reconciler-type=none",
                    f"--etcd-servers=http://127.0.0.1:{client}",
                    f"--tls-cert-file={pki / 'apiserver.crt'}",
                    f"--tls-private-key-file={pki / 'apiserver.key'}",
                    f"--client-ca-file={pki / 'ca.crt'}",
                    f"--token-auth-file={self.dir / 'tokens.csv'}",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--allow-privileged=true",
                    "--kubelet-preferred-address-types=InternalIP",
                    f"--egress-selector-config-file={egress}",
                    "--profiling=false",
                ],
            )
        self._wait("kube-apiserver /readyz", self._apiserver_ready, 120, "kube-apiserver")
        server = f"https://127.0.0.1:{api}"
        self._write_kubeconfig(self.kubeconfig, server, "lab-admin", self._token("admin"))

        self._scheduler_static_pod(server, bins)
        for comp, extra in (
            (
                "kube-controller-manager",
                [
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                    f"--cluster-signing-key-file={pki / 'ca.key'}",
                    "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service,-route",
                ],
            ),
        ):
            port = self._port(comp, comp)
            kc = self.dir / f"{comp}.kubeconfig"
            self._write_kubeconfig(kc, server, f"system:{comp}", self._token(comp))
            if not self._running(comp):
                self.progress(f"kube: starting {comp} (health on https://127.0.0.1:{port})")
                self._spawn(
                    comp,
                    [
                        str(bins / comp),
                        f"--kubeconfig={kc}",
                        f"--authentication-kubeconfig={kc}",
                        f"--authorization-kubeconfig={kc}",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={port}",
                        "--port=0",
                        "--leader-elect=false",
                        f"--cert-dir={self.dir / comp}",
                        *extra,
                    ],
                )
        self._wait("kube-scheduler /healthz (static pod run by the kubelet stand-in)",
                   lambda: self._healthz("kube-scheduler"), 60, STANDIN)
        self._wait("kube-controller-manager /healthz", lambda: self._healthz("kube-controller-manager"), 60,
                   "kube-controller-manager")
        # Restart hollow nodes recorded earlier whose process is gone (e.g. after a reboot).
        if self.state["nodes"]:
            self.register_nodes([n["spec"] for n in self.state["nodes"].values()])
        self.progress(f"kube: control plane ready in {time.monotonic() - t0:.1f}s; kubeconfig {self.kubeconfig}")

    # ---------------------------------------------------------------- static pods (kubelet stand-in)
    @property
    def manifests_dir(self) -> Path:
        return self.dir / "manifests"

    @property
    def scheduler_manifest(self) -> Path:
        return self.manifests_dir / "kube-scheduler.yaml"

    @property
    def standin_state(self) -> Path:
        return self.dir / f"{STANDIN}.json"

    def _scheduler_static_pod(self, server: str, bins: Path) -> None:
        """kube-scheduler as a kubeadm-like static pod, run by the kubelet stand-in
        (gpu_install_lab/staticpods.py). An existing manifest is kept (gpu-install's scheduler_policy
        role may have patched it) unless it serves on another port than the recorded one."""
        port = self._port("kube-scheduler", STANDIN)
        self._port("kube-scheduler-insecure", STANDIN)  # for a KubeSchedulerConfiguration (lab inventory)
        kc = self.dir / "kube-scheduler.kubeconfig"
        self._write_kubeconfig(kc, server, "system:kube-scheduler", self._token("kube-scheduler"))
        for sub in ("manifests", "etc-kubernetes", "backups", "logs/pods"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        current = self.scheduler_manifest.read_text() if self.scheduler_manifest.exists() else ""
        if f"--secure-port={port}" not in current:
            atomic_write(self.scheduler_manifest, scheduler_manifest(port, kc), mode=0o600)
        if not self._running(STANDIN):
            self.progress(f"kube: starting {STANDIN} (stand-in for the kubelet) on {self.manifests_dir}: "
                          f"kube-scheduler static pod, health on https://127.0.0.1:{port}")
            self._spawn(
                STANDIN,
                [sys.executable, "-m", "gpu_install_lab.staticpods", "--manifests", str(self.manifests_dir),
                 "--logs", str(self.dir / "logs" / "pods"), "--bin-dir", str(bins),
                 "--state", str(self.standin_state)],
                env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
            )

    def static_pods(self) -> dict[str, dict[str, Any]]:
        """The stand-in's record of its pods: {name: {pid, start, boot, manifest, log, ...}} ({} if none)."""
        try:
            return json.loads(self.standin_state.read_text()).get("pods") or {}
        except (OSError, ValueError):
            return {}

    # ---------------------------------------------------------------- nodes
    def _ensure_netns(self) -> None:
        """The hollow kubelets' network namespace (only `lo`), and our forwarder into it."""
        ns = self.netns
        if not Path(f"/run/netns/{ns}").exists():
            self.state["netns"] = ns  # recorded before it exists
            self._save()
            self._ip("netns", "add", ns)
        elif self.state.get("netns") != ns:
            raise EnvironmentProblem(
                f"network namespace {ns} exists but is not recorded in {self.state_path}",
                hint=f"it is left from another run of this lab dir; remove it with `ip netns del {ns}`",
            )
        self._ip("-n", ns, "link", "set", "lo", "up")
        if not self._running("apiserver-forwarder"):
            self._spawn(
                "apiserver-forwarder",
                [
                    sys.executable,
                    "-m",
                    "gpu_install_lab.kube",
                    "_forward",
                    f"/run/netns/{ns}",
                    str(NETNS_APISERVER_PORT),
                    str(self.state["ports"]["kube-apiserver"]),
                ],
                env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])),
            )

            def listening() -> bool:
                out = self._ip_out("netns", "exec", ns, "cat", "/proc/net/tcp")
                return f":{NETNS_APISERVER_PORT:04X} 00000000:0000 0A" in out

            self._wait("the apiserver forwarder", listening, 20, "apiserver-forwarder")

    def _ip(self, *args: str) -> None:
        res = subprocess.run(["ip", *args], capture_output=True, text=True)
        if res.returncode != 0:
            raise EnvironmentProblem(f"`ip {' '.join(args)}` failed: {res.stderr.strip()}")

    def _ip_out(self, *args: str) -> str:
        return subprocess.run(["ip", *args], capture_output=True, text=True).stdout

    def _api(self):
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))

    def register_nodes(self, nodes: list[dict[str, Any]]) -> None:
        """Start a hollow kubelet per node (if not running), then label it GFD-style and give it
        its GPU capacity; wait until every node is Ready with that capacity. Idempotent, additive."""
        if not self.kubeconfig.exists() or not self._running("kube-apiserver"):
            raise EnvironmentProblem("the lab control plane is not up", hint="call ControlPlane.up() first")
        specs = []
        for node in nodes:
            name = str(node.get("name", ""))
            if not _DNS_SUB.match(name) or len(name) > 63:
                raise ConfigError(f"node name {name!r} is not a valid Kubernetes node name",
                                  hint="lowercase letters, digits, '-' and '.'")
            labels = node_labels(node)
            specs.append((name, node, labels, node_resources(node, labels)))
        bins = Path(self.state["bin_dir"])
        self._ensure_netns()
        ns = self.netns
        for name, node, labels, _ in specs:
            rec = self.state["nodes"].get(name)
            if rec is None:
                index = len(self.state["nodes"])
                if FAKE_NODE_FIRST + index >= FAKE_NODE_NET.num_addresses - 1:
                    raise ConfigError(f"too many lab nodes ({index + 1}): the fake node network "
                                      f"{FAKE_NODE_NET} holds {FAKE_NODE_NET.num_addresses - 1 - FAKE_NODE_FIRST}")
                rec = {
                    "index": index,
                    "fake_ip": str(FAKE_NODE_NET[FAKE_NODE_FIRST + index]),
                    "kubelet_port": KUBELET_PORT_BASE + 2 * index,
                }
                self.state["nodes"][name] = rec
            rec["spec"] = {k: v for k, v in node.items() if k in ("name", "ip", "gpus", "labels", "extra", "resources")}
            self._save()
        for name, node, labels, _ in specs:
            rec = self.state["nodes"][name]
            if self._running(f"node-{name}"):
                continue
            ndir = self.dir / "nodes" / name
            for sub in ("tmp", "log"):
                (ndir / sub).mkdir(parents=True, exist_ok=True)
            atomic_write(ndir / "hosts", f"127.0.0.1\tlocalhost\n{rec['fake_ip']}\t{name}\n")
            atomic_write(ndir / "resolv.conf", "# lab hollow node: no DNS\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
            cert, key = _client_cert(self.dir / "pki", f"system:node:{name}", "system:nodes")
            self._write_kubeconfig(ndir / "kubeconfig", f"https://127.0.0.1:{NETNS_APISERVER_PORT}",
                                   f"system:node:{name}", cert=cert, key=key)
            if rec["fake_ip"] + "/32" not in self._ip_out("-n", ns, "-4", "addr", "show", "dev", "lo"):
                self._ip("-n", ns, "addr", "add", rec["fake_ip"] + "/32", "dev", "lo")
            self.progress(f"kube: starting hollow kubelet {name} (fake IP {rec['fake_ip']}, {node.get('gpus', 0)} GPUs)")
            (ndir / "bin").mkdir(exist_ok=True)
            # Private mounts. Work relative to the node dir (the cwd keeps it reachable even when the
            # lab dir lives under /tmp), bind the binaries in, and shadow /tmp last.
            script = (
                'set -e; cd "$1"; mount --bind "$2" ./bin; shift 2; '
                "mount --bind ./log /var/log; mount --bind ./hosts /etc/hosts; "
                "mount --bind ./resolv.conf /etc/resolv.conf; mount --bind ./tmp /tmp; "
                'exec ./bin/kubemark "$@"'
            )
            self._spawn(
                f"node-{name}",
                [
                    "nsenter", f"--net=/run/netns/{ns}", "--",
                    "unshare", "--mount", "--propagation", "private", "--",
                    "sh", "-c", script, "sh", str(ndir), str(bins),
                    "--morph=kubelet",
                    f"--name={name}",
                    "--kubeconfig=./kubeconfig",
                    f"--kubelet-port={rec['kubelet_port']}",
                    "--kubelet-read-only-port=0",
                    "--kube-api-content-type=application/vnd.kubernetes.protobuf",
                ],
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": "/tmp", "HOME": "/tmp"},
            )
        api = self._api()
        deadline = time.monotonic() + 120
        for name, node, labels, resources in specs:
            rec = self.state["nodes"][name]
            self._wait(f"node {name} to register", lambda n=name: self._node_exists(api, n), max(5, deadline - time.monotonic()), f"node-{name}")
            annotations = {
                "gpu-install.lab/node-ip": str(node.get("ip", "")),
                "gpu-install.lab/hollow": "kubemark hollow kubelet: runs no containers; its IP is fake",
            }
            current = api.read_node(name)
            # re-registration with other GPUs: drop nvidia.com/* labels and resources no longer wanted
            stale = {k: None for k in (current.metadata.labels or {}) if k.startswith("nvidia.com/") and k not in labels}
            api.patch_node(name, {"metadata": {"labels": {**labels, **stale}, "annotations": annotations}})
            gone = [k for k in (current.status.capacity or {}) if k.startswith("nvidia.com/") and k not in resources]
            if gone:
                api.patch_node_status(name, {"status": {"capacity": {k: None for k in gone},
                                                        "allocatable": {k: None for k in gone}}})
            self._patch_capacity(api, name, resources)
        for name, node, labels, resources in specs:
            self._wait(
                f"node {name} Ready with its GPU capacity",
                lambda n=name, r=resources: self._node_ready(api, n, r),
                max(5, deadline - time.monotonic()),
                f"node-{name}",
            )
        self.progress(f"kube: {len(specs)} node(s) Ready: {', '.join(s[0] for s in specs)}")

    @staticmethod
    def _node_exists(api, name: str) -> bool:
        api.read_node(name)
        return True

    @staticmethod
    def _patch_capacity(api, name: str, resources: dict[str, str]) -> None:
        if not resources:
            return
        body = {"status": {"capacity": dict(resources), "allocatable": dict(resources)}}
        api.patch_node_status(name, body)

    @staticmethod
    def _node_ready(api, name: str, resources: dict[str, str]) -> bool:
        node = api.read_node(name)
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        alloc = node.status.allocatable or {}
        if any(str(alloc.get(k)) != v for k, v in resources.items()):
            # A kubelet restart zeroes extended resources it does not manage: put them back.
            ControlPlane._patch_capacity(api, name, resources)
            return False
        taints = [t.key for t in node.spec.taints or []]
        return ready and "node.kubernetes.io/not-ready" not in taints and not node.spec.unschedulable

    # ---------------------------------------------------------------- down / status
    def down(self) -> None:
        """Stop every process up()/register_nodes() started (by recorded identity), delete the
        nodes' network namespace and remove lab_dir/kube. Safe to call repeatedly or after a crash."""
        procs = self.state.get("processes", {})
        order = [n for n in procs if n.startswith("node-")] + ["apiserver-forwarder", "kube-controller-manager",
                                                              STANDIN, "kube-scheduler", "kube-apiserver", "etcd"]
        order += [n for n in procs if n not in order]
        stopped = []
        for name in order:
            rec = procs.get(name)
            if rec and proc.alive(rec):
                proc.stop(rec)
                stopped.append(name)
                if proc.alive(rec):
                    raise EnvironmentProblem(f"could not stop {name} (pid {rec['pid']})",
                                             hint=f"kill -9 {rec['pid']} and run down again")
            if name == STANDIN:  # its pods, should it have died without stopping them (by recorded identity)
                for pod, prec in self.static_pods().items():
                    if proc.alive(prec):
                        proc.stop(prec)
                        stopped.append(f"static pod {pod}")
                        if proc.alive(prec):
                            raise EnvironmentProblem(f"could not stop static pod {pod} (pid {prec['pid']})",
                                                     hint=f"kill -9 {prec['pid']} and run down again")
        ns = self.state.get("netns")
        if ns and Path(f"/run/netns/{ns}").exists():
            self._ip("netns", "del", ns)
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.state = self._load()
        if stopped:
            self.progress(f"kube: stopped {', '.join(stopped)}; removed {self.dir}")

    def status(self) -> dict[str, Any]:
        """{"components": {name: {running, pid, healthy}}, "nodes": {name: {...}}, "kubeconfig", "server"}"""
        procs = self.state.get("processes", {})
        out: dict[str, Any] = {"components": {}, "nodes": {}, "kubeconfig": None, "server": None}
        checks = {
            "etcd": self._etcd_healthy,
            "kube-apiserver": self._apiserver_ready,
            "kube-scheduler": lambda: self._healthz("kube-scheduler"),
            "kube-controller-manager": lambda: self._healthz("kube-controller-manager"),
        }
        pods = self.static_pods() if proc.alive(procs.get(STANDIN)) else {}
        for name in COMPONENTS:
            rec = procs.get(name)
            if name in pods:  # a static pod run by the kubelet stand-in
                rec = pods[name]
            running = proc.alive(rec)
            healthy = False
            if running:
                try:
                    healthy = bool(checks[name]())
                except Exception:  # noqa: BLE001
                    healthy = False
            out["components"][name] = {"running": running, "pid": rec["pid"] if running else None, "healthy": healthy}
        if STANDIN in procs:
            rec = procs[STANDIN]
            running = proc.alive(rec)
            out["components"][STANDIN] = {"running": running, "pid": rec["pid"] if running else None,
                                          "healthy": running}
        if "apiserver-forwarder" in procs:
            rec = procs["apiserver-forwarder"]
            running = proc.alive(rec)
            out["components"]["apiserver-forwarder"] = {"running": running, "pid": rec["pid"] if running else None,
                                                        "healthy": running}
        api_ok = out["components"]["kube-apiserver"]["healthy"]
        if api_ok:
            out["kubeconfig"] = str(self.kubeconfig)
            out["server"] = f"https://127.0.0.1:{self.state['ports']['kube-apiserver']}"
        api = self._api() if api_ok and self.state["nodes"] else None
        for name, rec in self.state["nodes"].items():
            prec = procs.get(f"node-{name}")
            running = proc.alive(prec)
            ready = False
            if api is not None:
                try:
                    node = api.read_node(name)
                    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
                except Exception:  # noqa: BLE001
                    ready = False
            out["nodes"][name] = {"running": running, "pid": prec["pid"] if running else None, "healthy": ready,
                                  "fake_ip": rec["fake_ip"], "gpus": rec["spec"].get("gpus", 0)}
        return out


# --------------------------------------------------------------------------- forwarder
def _forward(netns_path: str, listen_port: int, target_port: int) -> None:
    """Accept on 127.0.0.1:listen_port inside netns_path; connect to 127.0.0.1:target_port on the
    host's loopback. Network namespaces are per thread: the listening socket is created after
    setns() into the nodes' namespace, every other socket after setns() back."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000
    host = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    if libc.setns(target, clone_newnet) != 0:
        raise OSError(ctypes.get_errno(), f"setns({netns_path})")
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", listen_port))
    lsock.listen(128)
    if libc.setns(host, clone_newnet) != 0:
        raise OSError(ctypes.get_errno(), "setns(host)")
    os.close(target)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
                try:
                    s.shutdown(how)
                except OSError:
                    pass

    def handle(conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", target_port), timeout=10)
            up.settimeout(None)
        except OSError:
            conn.close()
            return
        t = threading.Thread(target=pump, args=(up, conn), daemon=True)
        t.start()
        pump(conn, up)
        t.join()
        conn.close()
        up.close()

    while True:
        conn, _ = lsock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


# --------------------------------------------------------------------------- manual entry
def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_forward":
        _forward(argv[1], int(argv[2]), int(argv[3]))
        return 0
    from installer.errors import GpuInstallError

    parser = argparse.ArgumentParser(prog="python -m gpu_install_lab.kube", description="lab Kubernetes control plane")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--lab-dir", type=Path,
                        default=Path(os.environ.get("GPU_INSTALL_LAB_DIR") or "/var/lib/gpu-install/lab"),
                        help="lab directory (env GPU_INSTALL_LAB_DIR; default /var/lib/gpu-install/lab)")
    parser.add_argument("--nodes", type=int, default=0,
                        help="with up: also register N hollow nodes lab-node-1..N with 1 GPU each")
    args = parser.parse_args(argv)
    cp = ControlPlane(args.lab_dir, progress=lambda m: print(m, file=sys.stderr))
    try:
        if args.action == "up":
            cp.up()
            if args.nodes:
                cp.register_nodes([{"name": f"lab-node-{i}", "ip": "", "gpus": 1, "labels": {}}
                                   for i in range(1, args.nodes + 1)])
            print(cp.kubeconfig)
        elif args.action == "down":
            cp.down()
        else:
            print(json.dumps(cp.status(), indent=2))
    except GpuInstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
