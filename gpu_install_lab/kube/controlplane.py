"""ControlPlane: etcd, kube-apiserver and kube-controller-manager as processes of ours, kube-scheduler as a
static pod of the kubelet stand-in (gpu_install_lab/staticpods.py); up / down / status. The hollow nodes
are its base class (nodes.py), its state file and recorded processes theirs (state.py). See __init__.py."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_install_lab import pki, proc
from gpu_install_lab.kube.binaries import KUBE_VERSION, ensure_binaries, etcd_binary
from gpu_install_lab.kube.nodes import HollowNodes
from gpu_install_lab.kube.state import PYTHONPATH
from installer.errors import EnvironmentProblem
from installer.util import atomic_write

SERVICE_CIDR = "10.96.0.0/24"
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
STANDIN = "kubelet-standin"  # gpu_install_lab/staticpods.py: runs the static pods (kube-scheduler)
SCHEDULER_IMAGE = f"registry.k8s.io/kube-scheduler:v{KUBE_VERSION}"
CA_NAME = "gpu-install-lab-kubernetes-ca"
APISERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local")
APISERVER_IPS = ("127.0.0.1", "10.96.0.1")


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


class ControlPlane(HollowNodes):
    """See the package docstring. All state under lab_dir/"kube"."""

    # ---------------------------------------------------------------- http checks
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
            return bool(json.loads(resp.read()).get("health") == "true")

    def _apiserver_ready(self) -> bool:
        code, _ = self._https_get(self.state["ports"]["kube-apiserver"], "/readyz", self._token("admin"))
        return code == 200

    def _healthz(self, component: str) -> bool:
        code, body = self._https_get(self.state["ports"][component], "/healthz", verify_ca=False)
        return code == 200 and body.strip() == "ok"

    # ---------------------------------------------------------------- certificates
    def _pki(self) -> Path:
        """The control plane's CA, the apiserver's serving certificate and the service-account key
        pair (sa.key/sa.pub) in kube/pki, made once (gpu_install_lab/pki.py)."""
        d = self.dir / "pki"
        pki.ensure_ca(d, CA_NAME)
        pki.issue_server_cert(d, "apiserver", list(APISERVER_IPS), list(APISERVER_NAMES), cn="kube-apiserver")
        pki.ensure_keypair(d, "sa")
        # the apiserver's client certificate towards kubelets (logs/exec on real kubelet nodes; kubeadm's name)
        crt, key = d / "apiserver-kubelet-client.crt", d / "apiserver-kubelet-client.key"
        if not (crt.exists() and key.exists()):
            cert_pem, key_pem = pki.client_cert(d, "kube-apiserver-kubelet-client", "system:masters")
            atomic_write(key, key_pem, mode=0o600)
            atomic_write(crt, cert_pem, mode=0o644)
        return d

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
        certs = self._pki()
        self._ensure_tokens()
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
                    f"--tls-cert-file={certs / 'apiserver.crt'}",
                    f"--tls-private-key-file={certs / 'apiserver.key'}",
                    f"--client-ca-file={certs / 'ca.crt'}",
                    f"--token-auth-file={self.dir / 'tokens.csv'}",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    f"--service-account-key-file={certs / 'sa.pub'}",
                    f"--service-account-signing-key-file={certs / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--allow-privileged=true",
                    "--kubelet-preferred-address-types=InternalIP",
                    f"--kubelet-client-certificate={certs / 'apiserver-kubelet-client.crt'}",
                    f"--kubelet-client-key={certs / 'apiserver-kubelet-client.key'}",
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
                    f"--service-account-private-key-file={certs / 'sa.key'}",
                    f"--root-ca-file={certs / 'ca.crt'}",
                    f"--cluster-signing-cert-file={certs / 'ca.crt'}",
                    f"--cluster-signing-key-file={certs / 'ca.key'}",
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
                env=dict(os.environ, PYTHONPATH=PYTHONPATH),
            )

    def static_pods(self) -> dict[str, dict[str, Any]]:
        """The stand-in's record of its pods: {name: {pid, start, boot, manifest, log, ...}} ({} if none)."""
        try:
            return json.loads(self.standin_state.read_text()).get("pods") or {}
        except (OSError, ValueError):
            return {}

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
        checks: dict[str, Callable[[], bool]] = {
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
                    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status and node.status.conditions) or [])
                except Exception:  # noqa: BLE001
                    ready = False
            out["nodes"][name] = {"running": running, "pid": prec["pid"] if running else None, "healthy": ready,
                                  "fake_ip": rec["fake_ip"], "gpus": rec["spec"].get("gpus", 0)}
        return out

