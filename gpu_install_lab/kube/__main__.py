"""Manual use: python -m gpu_install_lab.kube up|down|status [--lab-dir DIR] [--nodes N]
(and `_forward`, the apiserver forwarder the control plane starts)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gpu_install_lab.kube.controlplane import ControlPlane
from gpu_install_lab.kube.forward import forward
from installer.errors import GpuInstallError


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_forward":
        forward(argv[1], int(argv[2]), int(argv[3]))
        return 0
    if argv and argv[0] == "_egress":
        from gpu_install_lab.kube.egress import serve

        serve(argv[1], argv[2:])
        return 0
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
