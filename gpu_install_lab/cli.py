"""`gpu-install lab ...` sub-commands, registered through the "gpu_install.commands" entry point.
Only argparse/os at import time: the CLI must start fast."""

from __future__ import annotations

import argparse
import importlib.util
import os
from typing import TYPE_CHECKING, Any

from gpu_install_lab import DEFAULT_LAB_DIR, ENV_LAB_DIR

if TYPE_CHECKING:
    from gpu_install_lab.lab import Lab

EXTRA_MODULES = ("cryptography", "bcrypt")  # what pyproject's [lab] extra brings


def _require_extra() -> None:
    """Without the [lab] extra, loading this entry point fails (gpu-install then has no `lab`). Looks the
    modules up without importing them."""
    for name in EXTRA_MODULES:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r} (install gpu-install[lab])", name=name)


_require_extra()


def _lab(args: argparse.Namespace) -> Lab:
    from pathlib import Path

    from gpu_install_lab.lab import Lab

    return Lab(Path(args.lab_dir))


def cmd_up(args: argparse.Namespace) -> int:
    import json

    flavours = [f.strip() for f in args.os.split(",") if f.strip()]
    lab = _lab(args)
    real = args.kubelet == "real"  # --runtime is then the kubelet's runtime, installed by `up` itself
    status = lab.up(count=args.nodes, flavours=flavours, kubernetes=args.kubernetes,
                    subnet=args.subnet, registry_auth=args.registry_auth, gpus=args.gpus,
                    kubelet=args.kubelet, runtime=(args.runtime or "containerd") if real else "containerd",
                    gpu_model=args.gpu_model, mig=args.mig)
    if args.runtime and not real:
        from gpu_install_lab import runtime

        runtime.install(lab.dir, status, args.runtime, progress=lab.say)
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        _print_status(status)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    _lab(args).down()
    return 0


def _print_status(st: dict[str, Any]) -> None:
    if not st.get("up"):
        print(f"lab {st['lab_dir']}: not up")
        return
    yes = {True: "yes", False: "NO"}
    print(f"lab {st['lab_dir']}  subnet {st['subnet']}  bastion {st['bastion_ip']}")
    print(f"  registry  {st['registry_url']}  running={yes[st['registry_running']]}"
          f"{'  auth=basic' if st.get('registry_auth') else ''}")
    print(f"  repo      {st['repo_url']}/apt  {st['repo_url']}/rpm  running={yes[st['repo_running']]}")
    real = st.get("kubelet") == "real"
    extra = f" {'kubelet':8} {'runtime':26} {'plugin':8} {'gpus':4} ready" if real else ""
    if real:
        print(f"  real kubelets on {st.get('runtime', 'containerd')}")
    print(f"  {'node':8} {'flavour':9} {'ip':14} {'running':8} ssh{extra}")
    for n in st["nodes"]:
        extra = (f" {n.get('kubelet', '?'):8} {n.get('runtime', '?'):26} {n.get('device_plugin', '?'):8} "
                 f"{n.get('gpus', '?'):4} {yes[bool(n.get('ready'))]}") if real else ""
        print(f"  {n['name']:8} {n['flavour']:9} {n['ip']:14} {yes[n['running']]:8} {yes[n['ssh']]:3}{extra}")
    print(f"  inventory {st['inventory']}")
    if "kubernetes" in st:
        kube = st["kubernetes"]
        if "error" in kube:
            print(f"  kubernetes ERROR {kube['error']}")
        else:
            print(f"  kubernetes {kube.get('server')}  healthy={yes[_kube_healthy(kube)]}  "
                  f"nodes={len(kube.get('nodes', {}))}  kubeconfig {kube.get('kubeconfig')}")


def _kube_healthy(kube: dict[str, Any]) -> bool:
    parts = [*kube.get("components", {}).values(), *kube.get("nodes", {}).values()]
    return "error" not in kube and all(p.get("healthy") for p in parts)


def cmd_status(args: argparse.Namespace) -> int:
    import json

    status = _lab(args).status()
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        _print_status(status)
    healthy = status.get("up") and status.get("registry_running") and status.get("repo_running") and all(
        n["running"] and n["ssh"] and n.get("ready", True) and n.get("kubelet", "active") == "active"
        and n.get("device_plugin", "active") == "active"
        for n in status["nodes"]) and _kube_healthy(status.get("kubernetes", {}))
    from installer.errors import EXIT_OK, EXIT_VALIDATION

    return EXIT_OK if healthy or not status.get("up") else EXIT_VALIDATION  # a part of the lab is down


def cmd_inventory(args: argparse.Namespace) -> int:
    import sys

    from installer.util import atomic_write

    text = _lab(args).inventory_text()
    if args.output and args.output != "-":
        atomic_write(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_repo_add(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpu_install_lab import repo
    from gpu_install_lab.state import locked

    lab_dir = Path(args.lab_dir)
    if not (lab_dir / "repo").is_dir():
        from installer.errors import ConfigError

        raise ConfigError(f"no lab repository in {lab_dir}", hint="run `gpu-install lab up` first")
    with locked(lab_dir):
        for p in repo.add_packages(lab_dir / "repo", [Path(f) for f in args.files]):
            print(f"added {p}")
        repo.refresh(lab_dir / "repo")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    default_dir = os.environ.get(ENV_LAB_DIR) or DEFAULT_LAB_DIR
    from installer.cli.common import debug_parent

    lab_dir_help = f"lab state directory (default {default_dir}); env {ENV_LAB_DIR}"
    p = sub.add_parser("lab", help="local air-gapped lab: bastion registry + repo, systemd nodes (root)")
    p.add_argument("--lab-dir", default=default_dir, help=lab_dir_help)
    # `lab up --lab-dir X` as well as `lab --lab-dir X up`: the later one wins
    after = argparse.ArgumentParser(add_help=False, parents=[debug_parent()])
    after.add_argument("--lab-dir", default=argparse.SUPPRESS, help=lab_dir_help)
    lsub = p.add_subparsers(dest="lab_command", metavar="ACTION")
    lsub.required = True

    q = lsub.add_parser("up", parents=[after], help="bring the lab up (idempotent)")
    q.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    q.add_argument("--os", default="debian12",
                   help="comma-separated flavours assigned round-robin: debian12 (Ubuntu stand-in), "
                        "rhel9 (Rocky 9 stand-in); default debian12")
    q.add_argument("--kubernetes", action="store_true", help="also start the lab control plane and register the nodes")
    q.add_argument("--kubelet", choices=["hollow", "real"], default="hollow",
                   help="with --kubernetes: hollow (default) = kubemark hollow kubelets, fast, run no containers, scale "
                        "to 100s of nodes; real = the real kubelet 1.20.2 + the node's containerd + CNI bridge in each "
                        "(debian12) node: pods really pull and run (see docs/lab-kubernetes.md); --runtime docker for "
                        "dockerd and the kubelet's dockershim instead")
    q.add_argument("--gpus", type=int, default=1,
                   help="STAND-IN nvidia.com/gpu per node with --kubernetes (default 1): hollow nodes report them; real "
                        "nodes run the STAND-IN device plugin advertising them (gpu_install_lab/gpus.py)")
    from gpu_install_lab import GPU_MODELS

    q.add_argument("--gpu-model", choices=sorted(GPU_MODELS), default=None,
                   help="with --kubelet real: the STAND-IN GPUs' model (default NVIDIA A100-SXM4-80GB; the models "
                        "with recorded nvidia-smi documents: H100 and H200 are real driver-580 machines)")
    q.add_argument("--mig", metavar="PROFILE=N[,...]",
                   help="with --kubelet real: MIG devices on every GPU of each node, e.g. 1g.10gb=2,2g.20gb=1; the "
                        "STAND-IN device plugin advertises them as nvidia.com/mig-<profile> (mixed strategy)")
    q.add_argument("--subnet", help="lab /24 (default: first free 10.250.X.0/24)")
    q.add_argument("--registry-auth", action="store_true",
                   help="require basic auth on the registry (user lab, password in <lab-dir>/registry/password)")
    q.add_argument("--runtime", choices=["containerd", "docker"],
                   help="install this container runtime on the debian12 nodes from the lab repo (Debian's "
                        "containerd 1.6 / docker.io 20.10, plus the nvidia runtime/toolkit stand-ins); with "
                        "--kubelet real: the kubelet's runtime, containerd (default, CRI) or docker (dockerd + the "
                        "kubelet's dockershim), one per lab")
    q.add_argument("--json", action="store_true", help="print the status as JSON")
    q.set_defaults(func=cmd_up)

    q = lsub.add_parser("down", parents=[after], help="remove everything `lab up` made (works after a crash)")
    q.set_defaults(func=cmd_down)

    q = lsub.add_parser("status", parents=[after], help="what runs; exit 6 if a part of an up lab is down")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_status)

    q = lsub.add_parser("inventory", parents=[after], help="print (or write with -o) the lab's Ansible inventory")
    q.add_argument("-o", "--output", help="write here, e.g. inventories/lab/hosts.yml")
    q.set_defaults(func=cmd_inventory)

    q = lsub.add_parser("repo-add", parents=[after],
                        help="add .deb/.rpm files (re-indexed) and .run files (under /files/) to the lab repository")
    q.add_argument("files", nargs="+")
    q.set_defaults(func=cmd_repo_add)
