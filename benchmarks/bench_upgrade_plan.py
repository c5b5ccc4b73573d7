#!/usr/bin/env python3
"""`gpu-install upgrade plan` time on the lab's size (2 GPU nodes) and on --nodes hollow GPU nodes (figures, not a
pass/fail test; the target is 10 s on the lab). Root.

    .venv/bin/python benchmarks/bench_upgrade_plan.py [--nodes 100] [-n 3]
    .venv/bin/python benchmarks/bench_upgrade_plan.py --nodes 2 -n 1      # the smallest size (a smoke run)

The lab control plane (gpu_install_lab/kube: real etcd, kube-apiserver, controller-manager) with --nodes kubemark
hollow GPU nodes; NVIDIA's real v22.9.2 chart installed by `gpu-install operator install --no-wait` (nothing runs on
hollow nodes); one GPU pod bound to each node (the plan reads every node's pods and evicts them). Then the real CLI,
`gpu-install upgrade plan --to v23.9.2 --chart <real v23.9.2 chart> -o plan.json`, with an inventory of the first 2
nodes and one of all of them: per case the median wall time of -n runs, the plan's own `Planned in` seconds, its
exit code (3 is expected: v22.9.2 -> v23.9.2 skips two majors, a blocker), node and blocker counts -- so a run that
planned less than it should is visible.

Without the real charts (../shared/upstream/charts) it says so and exits 0; a release the lab's API server refuses
(an old build of it: scripts/build-kubernetes) is planned as "no release" and said.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXE = str(Path(sys.executable).parent / "gpu-install")
CHARTS = ROOT.parent / "shared" / "upstream" / "charts"
FROM, TO = "v22.9.2", "v23.9.2"
NS = "gpu-operator"
PAUSE = "registry.example.internal:5000/gpu-install-lab/pause:3.6"  # never pulled: hollow nodes run nothing


def site(path: Path, version: str) -> Path:
    path.write_text(yaml.safe_dump({
        "operator": {"version": version, "namespace": NS, "releaseName": "gpu-operator",
                     "chart": str(CHARTS / f"gpu-operator-{version}.tgz")},
        "registry": {"host": "registry.example.internal:5000", "prefix": "mirror"}}))
    return path


def inventory(path: Path, names: list[str]) -> Path:
    # TEST-NET-1 addresses and given OS facts: upgrade plan never connects to the nodes
    hosts = {n: {"ansible_host": "192.0.2.1", "gpu_install_os": "ubuntu22.04",
                 "gpu_install_kernel": "5.15.0-105-generic"} for n in names}
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    return path


def plan_case(work: Path, kubeconfig: str, names: list[str], n: int) -> None:
    inv = inventory(work / f"inv-{len(names)}.yml", names)
    out = work / f"plan-{len(names)}.json"
    argv = [EXE, "upgrade", "plan", "-s", str(site(work / "site-to.yaml", TO)), "-i", str(inv), "--kubeconfig",
            kubeconfig, "--to", TO, "--chart", str(CHARTS / f"gpu-operator-{TO}.tgz"), "-o", str(out), "-q"]
    times, planned, rows = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        times.append(time.perf_counter() - t0)
        doc = json.loads(out.read_text()) if out.exists() else {}
        planned.append(float(doc.get("seconds") or 0))
        rows.append((proc.returncode, len(doc.get("nodes") or []), len(doc.get("blockers") or [])))
        if proc.returncode not in (0, 3):
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    print(f"upgrade plan {FROM} -> {TO}, {len(names):>3} GPU node(s): {statistics.median(times):.2f} s wall "
          f"(median of {n}; the command's own: {statistics.median(planned):.2f} s); (exit, nodes, blockers) per run: "
          f"{rows}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100, help="hollow GPU nodes (default 100; at least 1)")
    ap.add_argument("-n", type=int, default=3, help="runs per case (the median is printed)")
    args = ap.parse_args()
    if args.nodes < 1 or args.n < 1:
        ap.error("--nodes and -n must be at least 1")
    if os.geteuid() != 0:
        raise SystemExit("bench_upgrade_plan needs root (the lab control plane)")
    if not all((CHARTS / f"gpu-operator-{v}.tgz").is_file() for v in (FROM, TO)):
        print(f"skipped: NVIDIA's real charts {FROM} and {TO} are not in {CHARTS}")
        return 0
    from kubernetes import client, config

    from gpu_install_lab import kube

    work = Path(tempfile.mkdtemp(prefix="bench-upgrade-plan-"))
    kube.ensure_binaries(progress=lambda m: None)
    cp = kube.ControlPlane(work / "kube-lab", progress=lambda m: None)
    t0 = time.perf_counter()
    try:
        cp.up()
        names = [f"gpu-{i:03d}" for i in range(1, args.nodes + 1)]
        cp.register_nodes([{"name": name, "ip": "", "gpus": 1, "labels": {}} for name in names])
        kc = str(cp.kubeconfig)
        print(f"control plane + {args.nodes} hollow GPU node(s): {time.perf_counter() - t0:.1f} s", flush=True)
        t1 = time.perf_counter()
        proc = subprocess.run([EXE, "operator", "install", "-s", str(site(work / "site-from.yaml", FROM)),
                               "--kubeconfig", kc, "--no-wait", "--timeout", "120"], capture_output=True, text=True,
                              timeout=900)
        if proc.returncode == 0:
            print(f"release {FROM} installed (real chart) in {time.perf_counter() - t1:.1f} s", flush=True)
        else:
            print(f"release {FROM} not installed (exit {proc.returncode}: {proc.stderr.strip()[-300:]}); planning "
                  "without a release", flush=True)
        core: Any = client.CoreV1Api(config.new_client_from_config(config_file=kc))
        core.create_namespace({"metadata": {"name": "bench-workloads"}})
        for name in names:  # one GPU pod per node, bound directly (no scheduler, no service account token)
            core.create_namespaced_pod("bench-workloads", {
                "metadata": {"name": f"train-{name}"},
                "spec": {"nodeName": name, "automountServiceAccountToken": False,
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "c", "image": PAUSE,
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        if args.nodes > 2:
            plan_case(work, kc, names[:2], args.n)
        plan_case(work, kc, names, args.n)
    finally:
        cp.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
