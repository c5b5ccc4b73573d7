"""`gpu-install lab up|down|status|inventory`: the orchestration. See gpu_install_lab/__init__.py for
the directory layout and docs/lab.md for the design and its limits."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_install_lab import FLAVOURS, inventory, net, nodes, pki, proc, registry, repo, rootfs
from gpu_install_lab.proc import alive
from gpu_install_lab.sh import require_root_and_tools
from gpu_install_lab.state import State, locked, teardown_order
from installer.errors import ConfigError, EnvironmentProblem
from installer.util import atomic_write

if TYPE_CHECKING:
    from gpu_install_lab.kube import ControlPlane

KUBELETS = ("hollow", "real")
TOP_DIRS = ("pki", "ssh", "registry", "repo", "nodes", "tools", "inventory")
# how long `lab status` keeps asking a real node that does not answer its unit probe
STATUS_PROBE_DEADLINE_S = 120.0


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def plan_nodes(count: int, flavours: list[str]) -> list[dict[str, Any]]:
    """node1..nodeN, flavours assigned round-robin in the order given."""
    if count < 1:
        raise ConfigError("--nodes must be at least 1")
    if not flavours:
        raise ConfigError("--os needs at least one flavour", hint=f"choose from {', '.join(FLAVOURS)}")
    for f in flavours:
        rootfs.packages(f)  # validates the name
    return [{"name": f"node{i}", "index": i, "flavour": flavours[(i - 1) % len(flavours)]}
            for i in range(1, count + 1)]


def _check_node_runtime(real: bool, runtime: str) -> None:
    """The real kubelet's container runtime: containerd (CRI) or docker (the kubelet's dockershim)."""
    from gpu_install_lab.kubelet import RUNTIMES

    if runtime not in RUNTIMES:
        raise ConfigError(f"--runtime {runtime}: unknown", hint=f"use one of {', '.join(RUNTIMES)}")
    if runtime != "containerd" and not real:
        raise ConfigError(f"a node runtime ({runtime}) for the kubelet needs --kubernetes --kubelet real",
                          hint="without real kubelets, `lab up --runtime` only installs the runtime on the nodes")


class Lab:
    def __init__(self, lab_dir: Path, progress: Callable[[str], None] = _stderr):
        self.dir = Path(lab_dir).absolute()
        self._progress = progress
        self._t0 = time.monotonic()

    # ------------------------------------------------------------ helpers
    def say(self, msg: str) -> None:
        self._progress(f"[{time.monotonic() - self._t0:5.1f}s] {msg}")

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    def state(self) -> State:
        return State(self.state_path)

    def _control_plane(self) -> ControlPlane:
        try:
            from gpu_install_lab.kube import ControlPlane
        except ModuleNotFoundError as exc:
            if exc.name != "gpu_install_lab.kube":
                raise
            raise EnvironmentProblem(
                "the lab's Kubernetes control plane (gpu_install_lab/kube/) is not in this checkout",
                hint="run `lab up` without --kubernetes",
            ) from None
        return ControlPlane(self.dir, progress=self.say)

    def _spawn(self, st: State, role: str, argv: list[str], log: Path, cgroup: str | None = None,
               controllers: bool = False, **extra: Any) -> bool:
        """Start a long-running process unless the recorded one still runs. True if started."""
        if alive(st.find("process", role)):
            return False
        preexec = None
        if cgroup:
            st.record("cgroup", cgroup)
            paths = nodes.cgroup_create(cgroup, controllers)
            preexec = lambda: nodes.cgroup_enter(paths)  # noqa: E731
        st.record("process", role, argv=argv, pid=None, start=None, boot=None, **extra)
        st.record("process", role, **proc.spawn(argv, log, preexec_fn=preexec))
        return True

    def _mkdirs(self, st: State) -> None:
        for d in TOP_DIRS:
            if not st.find("dir", d):
                st.record("dir", d, path=str(self.dir / d))
            (self.dir / d).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ up
    def up(self, count: int = 3, flavours: list[str] | None = None, kubernetes: bool = False,
           subnet: str | None = None, registry_auth: bool = False, gpus: int = 1,
           kubelet: str = "hollow", runtime: str = "containerd", gpu_model: str | None = None,
           mig: str | None = None) -> dict[str, Any]:
        """runtime: the real kubelet's container runtime on every node (containerd or docker); ignored with
        hollow kubelets. gpus/gpu_model/mig: the STAND-IN GPUs of each real node (gpu_install_lab/gpus.py)."""
        from gpu_install_lab import gpus as lab_gpus

        plan = plan_nodes(count, flavours or ["debian12"])
        gpu_model = gpu_model or lab_gpus.DEFAULT_MODEL
        if gpu_model not in lab_gpus.MODELS:
            raise ConfigError(f"--gpu-model {gpu_model!r}: no recorded nvidia-smi document for it",
                              hint=f"use one of: {', '.join(lab_gpus.MODELS)}")
        if not 0 <= gpus <= 16:
            raise ConfigError(f"--gpus {gpus}: out of range", hint="give 0 to 16 GPUs per node")
        try:
            mig_layout = lab_gpus.parse_mig(mig)
            lab_gpus.check_mig(gpu_model, mig_layout)
        except ValueError as exc:
            raise ConfigError(str(exc), hint="e.g. --mig 1g.10gb=2,2g.20gb=1 (mixed strategy, on every GPU of "
                                             "each node; A100 80GB profiles)") from exc
        if mig_layout and kubelet != "real":
            raise ConfigError("--mig needs --kubelet real (the STAND-IN device plugin advertises MIG devices)")
        if kubelet not in KUBELETS:
            raise ConfigError(f"--kubelet {kubelet}: unknown", hint=f"use one of {', '.join(KUBELETS)}")
        real = kubelet == "real"
        if real and not kubernetes:
            raise ConfigError("--kubelet real needs --kubernetes")
        _check_node_runtime(real, runtime)
        if real and any(p["flavour"] != "debian12" for p in plan):
            raise ConfigError("--kubelet real: only debian12 nodes",
                              hint="containerd comes from Debian's packages in the lab repo (no RPMs for rhel9)")
        require_root_and_tools()
        with locked(self.dir):
            st = self.state()
            s = st.settings
            for name, node in st.nodes.items():
                want = next((p for p in plan if p["name"] == name), None)
                if want is None or want["flavour"] != node["flavour"]:
                    raise ConfigError(
                        f"the lab already has {name} ({node['flavour']}), which this plan "
                        f"({count} nodes, --os {','.join(flavours or ['debian12'])}) does not keep",
                        hint="run `gpu-install lab down` first, or ask for a plan that keeps the existing nodes",
                    )
            if s.get("subnet") and subnet and subnet != s["subnet"]:
                raise ConfigError(f"the lab runs on {s['subnet']}, not {subnet}", hint="run `lab down` first")
            if not s:
                lid = net.lab_id(self.dir)
                bridge = net.bridge_name(lid)
                # under a machine-wide lock: labs side by side never get the same /24
                sub = net.claim_subnet(bridge, subnet, before_create=lambda: st.record("link", bridge))
                b = net.bastion_ip(sub)
                s.update(lab_id=lid, subnet=sub, bastion_ip=b, bridge=bridge,
                         registry=f"{b}:{registry.PORT}", registry_url=f"https://{b}:{registry.PORT}",
                         repo_url=f"http://{b}:{repo.PORT}")
            if st.nodes and s.get("kubelet", "hollow") != kubelet:
                raise ConfigError(f"the lab's nodes run the {s.get('kubelet', 'hollow')} kubelet, not {kubelet}",
                                  hint="run `gpu-install lab down` first")
            if real and st.nodes and s.get("runtime", "containerd") != runtime:
                raise ConfigError(f"the lab's real nodes run {s.get('runtime', 'containerd')}, not {runtime}: one "
                                  "runtime per lab",
                                  hint=f"run `gpu-install lab down` first, or `lab up` with --runtime "
                                       f"{s.get('runtime', 'containerd')}")
            restart_registry = s.get("registry_auth") is not None and s.get("registry_auth") != registry_auth
            s["registry_auth"] = registry_auth
            st.save()
            self.say(f"lab {self.dir}: subnet {s['subnet']}, bastion {s['bastion_ip']}")
            self._mkdirs(st)

            lowers = {}
            for flavour in sorted({p["flavour"] for p in plan}):
                lowers[flavour] = rootfs.ensure_rootfs(flavour, progress=self.say)
            self.say("rootfs ready: " + ", ".join(f"{f} ({p.name})" for f, p in lowers.items()))

            ca, _ = pki.ensure_ca(self.dir / "pki")
            cert, key = pki.issue_server_cert(self.dir / "pki", "registry", [s["bastion_ip"]],
                                              ["bastion.gpu-install.lab"])
            pubkey = pki.ssh_keypair(self.dir / "ssh" / "id_ed25519", "gpu-install-lab")

            st.record("link", s["bridge"])
            net.ensure_bridge(s["bridge"], f"{s['bastion_ip']}/{s['subnet'].split('/')[1]}")
            self.say(f"bastion network: bridge {s['bridge']} {s['bastion_ip']} (forwarding off, no IPv6)")

            repo.refresh(self.dir / "repo")
            self._spawn(st, "repo-http", [sys.executable, "-m", "http.server", str(repo.PORT), "--bind",
                                          s["bastion_ip"], "--directory", str(self.dir / "repo")],
                        self.dir / "repo" / "http.log")
            cfg = registry.write_config(self.dir / "registry", s["registry"], cert, key, registry_auth)
            if restart_registry:
                self._stop_roles(st, ["registry"])
            self._spawn(st, "registry", ["docker-registry", "serve", str(cfg)],
                        self.dir / "registry" / "registry.log")
            registry.wait_ready(s["registry_url"], ca)
            self._wait_http(s["repo_url"] + "/apt/dists/lab/Release")
            self.say(f"registry {s['registry_url']} (TLS, lab CA{', basic auth' if registry_auth else ''}); "
                     f"package repo {s['repo_url']}/{{apt,rpm}}")

            from installer.tools import install_helm_to
            install_helm_to(self.dir / "tools")

            cp = None
            tools = None
            if real:
                tools = lab_gpus.tools_dir(self.say)
                self.say("kubernetes: control plane (gpu_install_lab.kube) for real kubelets")
                cp = self._control_plane()
                cp.up()
                s["kubelet"] = "real"
                s["runtime"] = runtime
                st.save()
            self._nodes_up(st, plan, lowers, pubkey, ca.read_text(), cp,
                           gpu={"count": gpus, "model": gpu_model, "mig": mig_layout, "tools": tools})
            text = inventory.render(self.dir, s, st.nodes)
            atomic_write(self.dir / "inventory" / "hosts.yml", text)

            if cp is not None:
                self._real_nodes_ready(st, cp, ca)
                s["kubernetes"] = True
                st.save()
                atomic_write(self.dir / "inventory" / "hosts.yml",
                             inventory.render(self.dir, s, st.nodes, cp.kubeconfig))
            elif kubernetes:
                self.say("kubernetes: control plane (gpu_install_lab.kube)")
                cp = self._control_plane()
                cp.up()
                cp.register_nodes([{"name": n["name"], "ip": n["ip"], "gpus": gpus,
                                    "labels": {"gpu-install.lab/flavour": n["flavour"]}}
                                   for n in st.nodes.values()])
                s["kubernetes"] = True
                st.save()
                atomic_write(self.dir / "inventory" / "hosts.yml",
                             inventory.render(self.dir, s, st.nodes, cp.kubeconfig))
            self.say(f"lab up: {len(st.nodes)} node(s); inventory {self.dir / 'inventory' / 'hosts.yml'}")
            return self._status(st)

    def _real_nodes_ready(self, st: State, cp: Any, ca: Path, timeout: float = 180) -> None:
        """Real kubelets: the STAND-IN pause image into the registry, the node runtime (containerd or docker) from
        the lab repo on every node (in parallel), then wait until every node is Ready."""
        from concurrent.futures import ThreadPoolExecutor

        from gpu_install_lab import gpus as lab_gpus
        from gpu_install_lab import images, kubelet, packages, runtime, smoke_image

        s = st.settings
        t0 = time.monotonic()
        refs = images.ensure_lab_images(s["registry"], ca, self.dir / "registry" / "build")
        self.say(f"registry: {', '.join(refs.values())} (busybox STAND-IN pause image, test image)")
        smoke_image.push_lab_smoke_images(s["registry"], ca, progress=self.say)
        debs = packages.runtime_debs(progress=self.say)
        repo.add_packages(self.dir / "repo", debs)
        repo.refresh(self.dir / "repo")

        node_runtime = s.get("runtime", "containerd")

        def install(node: dict[str, Any]) -> None:
            runtime.node_run(self.dir, node["ip"], kubelet.install_command(node_runtime))
            self.say(f"{node['name']}: {node_runtime} from the lab repo, active (+{time.monotonic() - t0:.1f}s)")

        with ThreadPoolExecutor(max_workers=len(st.nodes)) as pool:
            list(pool.map(install, st.nodes.values()))
        # kubectl logs/exec, pod proxies: the apiserver's egress proxy socket, allowing the real nodes only (any
        # port: the kubelet, and host-network pods)
        self._spawn(st, "apiserver-egress",
                    [sys.executable, "-m", "gpu_install_lab.kube", "_egress", str(cp.dir / "no-egress.sock"),
                     *(f"{n['ip']}:*" for n in st.nodes.values())],
                    self.dir / "nodes" / "apiserver-egress.log")
        api = cp._api()
        deadline = time.monotonic() + timeout
        waiting = set(st.nodes)
        while waiting:
            for name in sorted(waiting):
                try:
                    node = api.read_node(name)
                except Exception:  # noqa: BLE001 - not registered yet
                    continue
                n = st.nodes[name]
                want = lab_gpus.expected_resources(lab_gpus.node_config(
                    s["lab_id"], name, n.get("gpus", 0), n.get("gpu_model", lab_gpus.DEFAULT_MODEL), n.get("mig")))
                alloc = node.status.allocatable or {}
                have = {r: int(alloc.get(r, "0")) for r in want}
                if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []) \
                        and have == want:
                    waiting.discard(name)
                    gpus = ", ".join(f"{c} {r}" for r, c in sorted(have.items())) or "no GPUs"
                    self.say(f"{name}: real kubelet Ready, STAND-IN {gpus} allocatable (+{time.monotonic() - t0:.1f}s)")
            if waiting and time.monotonic() > deadline:
                raise EnvironmentProblem(f"real kubelet node(s) not Ready (or without their STAND-IN GPUs) after "
                                         f"{timeout:.0f}s: {', '.join(sorted(waiting))}",
                                         hint="`journalctl -u kubelet -u containerd -u gpu-install-lab-device-plugin` "
                                              "on the node (ssh root@<ip>)")
            time.sleep(0.5)

    def _wait_http(self, url: str, timeout: float = 10) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise EnvironmentProblem(f"lab package repo {url} not answering: {exc}",
                                             hint="see repo/http.log in the lab directory") from exc
                time.sleep(0.1)

    def _nodes_up(self, st: State, plan: list[dict[str, Any]], lowers: dict[str, Path], pubkey: str,
                  ca_pem: str, cp: Any = None, gpu: dict[str, Any] | None = None) -> None:
        """cp: the control plane when the nodes run the real kubelet (gpu_install_lab/kubelet.py); gpu: count,
        model and the lab tools' dir for the real nodes' STAND-IN device plugin (gpu_install_lab/gpus.py)."""
        s = st.settings
        prefix = s["subnet"].split("/")[1]
        for p in plan:
            if p["name"] not in st.nodes:
                st.nodes[p["name"]] = {
                    **p, "ip": net.node_ip(s["subnet"], p["index"]),
                    "netns": net.netns_name(s["lab_id"], p["name"]),
                    "veth": net.veth_name(s["lab_id"], p["index"]),
                    "dir": str(self.dir / "nodes" / p["name"]),
                }
                if cp is not None and gpu:
                    st.nodes[p["name"]].update(gpus=gpu["count"], gpu_model=gpu["model"], mig=gpu["mig"])
        st.save()
        lab = {"bastion_ip": s["bastion_ip"], "hosts": {n: d["ip"] for n, d in st.nodes.items()},
               "ssh_pubkey": pubkey, "ca_pem": ca_pem, "registry": s["registry"], "repo_url": s["repo_url"],
               "trust_ca": cp is None}
        booting = []
        for name, node in st.nodes.items():
            st.record("netns", node["netns"])
            st.record("link", node["veth"])
            net.ensure_node_link(node["netns"], node["veth"], s["bridge"], f"{node['ip']}/{prefix}")
            merged = Path(node["dir"]) / "merged"
            st.record("mount", str(merged), node=name)
            node["rootfs"] = str(lowers[node["flavour"]])
            nodes.mount_overlay(lowers[node["flavour"]], Path(node["dir"]))
            node["host_key"] = nodes.customise(merged, node, lab)
            extra: list[str] = []
            if cp is not None:
                from gpu_install_lab import kubelet

                kubelet.customise(merged, node, cp.dir / "pki", Path(cp.state["bin_dir"]) / "kubelet", s["registry"],
                                  runtime=s.get("runtime", "containerd"))
                if gpu and gpu.get("tools"):
                    from gpu_install_lab import gpus as lab_gpus

                    lab_gpus.customise(merged, s["lab_id"], node, gpu["tools"])
                extra = kubelet.nspawn_args(Path(node["dir"]), s.get("runtime", "containerd"))
                self._spawn(st, f"apiserver-forwarder:{name}",
                            [sys.executable, "-m", "gpu_install_lab.kube", "_forward", f"/run/netns/{node['netns']}",
                             "6443", str(cp.state["ports"]["kube-apiserver"])],
                            Path(node["dir"]) / "forwarder.log")
            st.save()
            if self._spawn(st, f"node:{name}", nodes.nspawn_argv(merged, name, node["netns"], extra),
                           Path(node["dir"]) / "console.log", netns=node["netns"],
                           cgroup=f"{nodes.CGROUP_PARENT}/{s['lab_id']}-{name}", controllers=cp is not None):
                self.say(f"{name} ({node['flavour']}, {node['ip']}): booting systemd")
                booting.append(node)
        atomic_write(self.dir / "ssh" / "known_hosts",
                     "".join(f"{n['ip']},{name} {' '.join(n['host_key'].split()[:2])}\n"
                             for name, n in st.nodes.items()))
        for node in booting:
            rec = st.find("process", f"node:{node['name']}")
            waited = nodes.wait_ssh(node["ip"], timeout=120, proc_alive=functools.partial(alive, rec))
            self.say(f"{node['name']}: sshd answering (+{waited:.1f}s)")

    # ------------------------------------------------------------ down
    def _stop_roles(self, st: State, roles: list[str], timeout: float = 20) -> None:
        recs = [r for r in (st.find("process", role) for role in roles) if r]
        left = recs
        for _ in range(int(timeout // 5)):
            # nspawn turns SIGTERM into an orderly poweroff of the node; a node still early in its
            # boot may miss it (PID 1 ignores signals it has no handler for yet): send it again.
            for r in left:
                proc.send(r, signal.SIGTERM)
            left = proc.wait_gone(left, 5)
            if not left:
                break
        for r in left:
            self.say(f"{r['key']}: did not stop in {timeout:.0f}s, killing")
            proc.send(r, signal.SIGKILL)
        proc.wait_gone(recs, 5)
        for r in recs:
            if r.get("netns"):  # anything still in the node's namespace is the node's (ours)
                for pid in net.netns_pids(r["netns"]):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if not alive(r):
                st.forget("process", r["key"])

    def down(self) -> None:
        if not self.state_path.exists() and not (self.dir / "kube").exists():
            self.say(f"lab {self.dir}: nothing to remove")
            return
        require_root_and_tools(["ip", "mount"])
        with locked(self.dir):
            if (self.dir / "kube").exists():
                self.say("kubernetes: stopping the control plane")
                self._control_plane().down()
            st = self.state()
            nodes_roles = [r["key"] for r in st.resources if r["kind"] == "process" and r["key"].startswith("node:")]
            if nodes_roles:
                self.say(f"stopping {len(nodes_roles)} node(s)")
            self._stop_roles(st, nodes_roles)
            self._stop_roles(st, [r["key"] for r in st.resources if r["kind"] == "process"])
            errors = []
            for res in teardown_order(list(st.resources)):
                try:
                    self._remove(res)
                    st.forget(res["kind"], res["key"])
                except (EnvironmentProblem, OSError) as exc:
                    errors.append(f"{res['kind']} {res['key']}: {getattr(exc, 'message', exc)}")
            # Belt and braces: this lab's cgroups are ours by name even if the state missed one.
            lid = st.settings.get("lab_id") or net.lab_id(self.dir)
            for root in nodes.cgroup_roots(controllers=True):
                for cg in (root / nodes.CGROUP_PARENT).glob(f"{lid}-*"):
                    try:
                        nodes.cgroup_remove(f"{nodes.CGROUP_PARENT}/{cg.name}")
                    except OSError as exc:
                        errors.append(f"cgroup {cg}: {exc}")
            if errors:
                raise EnvironmentProblem("lab down left resources behind: " + "; ".join(errors),
                                         hint=f"fix the cause and run `lab down` again (state in {self.state_path})")
            self.state_path.unlink(missing_ok=True)
            for tmp in self.dir.glob(".state.json.*"):  # atomic_write's temp file after a crash
                tmp.unlink()
            (self.dir / ".lock").unlink(missing_ok=True)
        try:
            self.dir.rmdir()
        except OSError:
            pass
        self.say(f"lab {self.dir}: down, nothing left")

    def _remove(self, res: dict[str, Any]) -> None:
        kind, key = res["kind"], res["key"]
        if kind == "process":
            raise EnvironmentProblem("still running")
        if kind == "cgroup":
            nodes.cgroup_remove(key)
        elif kind == "mount":
            nodes.umount(Path(key))
        elif kind == "link":
            net.delete_link(key)
        elif kind == "netns":
            net.delete_netns(key)
        elif kind == "dir":
            path = Path(res["path"]).resolve()
            if path.parent != self.dir.resolve():
                raise EnvironmentProblem(f"refusing to remove {path}: not directly under the lab dir")
            with open("/proc/self/mountinfo") as fh:
                inside = [ln.split()[4] for ln in fh if ln.split()[4].startswith(str(path) + "/")]
            if inside:
                raise EnvironmentProblem(f"{path} still has mounts: {', '.join(inside)}")
            shutil.rmtree(path, ignore_errors=False) if path.exists() else None

    # ------------------------------------------------------------ status / inventory
    def _status(self, st: State) -> dict[str, Any]:
        s = st.settings

        def tcp(ip: str, port: int) -> bool:
            try:
                with socket.create_connection((ip, port), timeout=1):
                    return True
            except OSError:
                return False

        out: dict[str, Any] = {"lab_dir": str(self.dir), "up": bool(st.nodes), **{
            k: s.get(k) for k in ("subnet", "bastion_ip", "registry", "registry_url", "repo_url", "registry_auth")}}
        out["registry_running"] = alive(st.find("process", "registry"))
        out["repo_running"] = alive(st.find("process", "repo-http"))
        out["nodes"] = [
            {"name": n, "flavour": d["flavour"], "ip": d["ip"], "netns": d["netns"],
             "running": alive(st.find("process", f"node:{n}")), "ssh": tcp(d["ip"], 22)}
            for n, d in sorted(st.nodes.items(), key=lambda kv: kv[1]["index"])
        ]
        out["inventory"] = str(self.dir / "inventory" / "hosts.yml")
        out["kubelet"] = s.get("kubelet", "hollow")
        if out["kubelet"] == "real":
            out["runtime"] = s.get("runtime", "containerd")
            self._real_node_status(out["nodes"])
        if (self.dir / "kube").exists():
            try:
                out["kubernetes"] = self._control_plane().status()
            except EnvironmentProblem as exc:
                out["kubernetes"] = {"error": exc.message}
        return out

    def _real_node_status(self, rows: list[dict[str, Any]]) -> None:
        """Per real node: the kubelet and containerd units (over SSH) and the Node's Ready condition."""

        from gpu_install_lab import kubelet, runtime

        unit, version = kubelet.RUNTIME_PROBE[self.state().settings.get("runtime", "containerd")]
        ready: dict[str, bool] = {}
        gpus: dict[str, str] = {}
        try:
            from kubernetes import client, config

            api = client.CoreV1Api(config.new_client_from_config(str(self.dir / "kube" / "kubeconfig")))
            for node in api.list_node(_request_timeout=5).items:
                if node.metadata is None or node.metadata.name is None or node.status is None:
                    continue  # not a registered node (yet)
                ready[node.metadata.name] = any(c.type == "Ready" and c.status == "True"
                                                for c in node.status.conditions or [])
                alloc = node.status.allocatable or {}
                gpus[node.metadata.name] = ",".join(
                    [alloc.get("nvidia.com/gpu", "0")] + [f"{r.split('/', 1)[1]}:{c}" for r, c in sorted(alloc.items())
                                                          if r.startswith("nvidia.com/mig-") and c != "0"])
        except Exception:  # noqa: BLE001 - the control plane is down: every node reads not Ready
            pass
        for row in rows:
            row["ready"] = ready.get(row["name"], False)
            # allocatable nvidia.com/gpu[,mig-<profile>:N...] (STAND-IN device plugin)
            row["gpus"] = gpus.get(row["name"], "?")
            if not row["ssh"]:
                row["kubelet"] = row["runtime"] = row["device_plugin"] = "unknown"
                continue
            states = (self._probe_units(runtime.ssh_argv(self.dir, row["ip"]),
                                        f"systemctl is-active kubelet {unit} gpu-install-lab-device-plugin; {version}")
                      + ["unknown"] * 4)[:4]
            row["kubelet"], row["device_plugin"] = states[0], states[2]
            row["runtime"] = f"{unit} {states[3]} {states[1]}" if states[1] == "active" else f"{unit} {states[1]}"

    @staticmethod
    def _probe_units(argv: list[str], command: str, deadline_s: float = STATUS_PROBE_DEADLINE_S,
                     attempt_s: float = 30.0) -> list[str]:
        """The words a node's unit probe printed. A node whose systemd or sshd is slow to answer (a busy node,
        two labs on two cores) is asked again until the deadline; one that never answers reads "unknown"."""
        import subprocess

        end = time.monotonic() + deadline_s
        while True:
            left = end - time.monotonic()
            try:
                return subprocess.run([*argv, command], capture_output=True, text=True,
                                      timeout=max(0.5, min(attempt_s, left))).stdout.split()
            except subprocess.TimeoutExpired:
                if time.monotonic() >= end:
                    return []

    def status(self) -> dict[str, Any]:
        if not self.state_path.exists():
            return {"lab_dir": str(self.dir), "up": False, "nodes": []}
        return self._status(self.state())

    def inventory_text(self) -> str:
        st = self.state()
        if not st.nodes:
            raise ConfigError(f"no lab in {self.dir}", hint="run `gpu-install lab up` first")
        kubeconfig = self.dir / "kube" / "kubeconfig"
        return inventory.render(self.dir, st.settings, st.nodes, kubeconfig if kubeconfig.exists() else None)
