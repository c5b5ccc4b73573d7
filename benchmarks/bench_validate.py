#!/usr/bin/env python3
"""`gpu-install validate` on 1 node vs many (figures, not a pass/fail test). Root.

    .venv/bin/python benchmarks/bench_validate.py [--hollow 100] [--ssh-nodes 8] [-n 3]

Cluster layer: the lab control plane (gpu_install_lab/kube) with --hollow kubemark hollow GPU nodes (1 GPU each,
GFD-style labels); `gpu-install validate --only cluster` (the real CLI) with an inventory naming 1 of them, then
all of them. Node + runtime layers: a lab of --ssh-nodes debian12 nodes (systemd + sshd in network namespaces, no
driver: nvidia-smi is not found there, so each node's probe runs to its end and reports that finding);
`gpu-install validate --only node,runtime` with `--limit`-style inventories of 1 node, then all. Per case: the
median wall time of n runs and the ratio many/1 (the target: 100 nodes within 2x the 1-node time). Every run's
exit code and check count are printed, so a run that did not validate what it should is visible.

The smoke layer is not measured here: hollow nodes run no containers, so their smoke pods never finish; it is
timed on the lab's real-kubelet nodes in tests/integration/test_lab_real_nodes.py (its output prints the time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXE = str(Path(sys.executable).parent / "gpu-install")
SITE = {"operator": {"version": "v23.9.2"}, "registry": {"host": "registry.example.internal:5000"},
        "driver": {"mode": "host", "version": "535.54.03"}, "toolkit": {"mode": "host"}}


def timed(argv: list[str], n: int) -> tuple[float, list[tuple[int, int]]]:
    """Median wall seconds of n runs; (exit code, checks in the JSON report) of each."""
    times, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        for _ in range(n):
            t0 = time.perf_counter()
            proc = subprocess.run([*argv, "--json", str(out), "-q"], capture_output=True, text=True, timeout=900)
            times.append(time.perf_counter() - t0)
            checks = len(json.loads(out.read_text())["checks"]) if out.exists() else -1
            results.append((proc.returncode, checks))
            if proc.returncode not in (0, 6):
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    return statistics.median(times), results


def inventory(path: Path, hosts: dict[str, dict]) -> Path:
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    return path


def cluster_case(work: Path, count: int, n: int) -> None:
    from gpu_install_lab import kube

    kube.ensure_binaries(progress=lambda m: None)
    cp = kube.ControlPlane(work / "kube-lab", progress=lambda m: None)
    t0 = time.perf_counter()
    try:
        cp.up()
        nodes = [{"name": f"gpu-{i:03d}", "ip": "", "gpus": 1, "labels": {}} for i in range(1, count + 1)]
        cp.register_nodes(nodes)
        print(f"control plane + {count} hollow GPU nodes: {time.perf_counter() - t0:.1f}s", flush=True)
        site = work / "site.yaml"
        site.write_text(yaml.safe_dump(SITE))
        kc = str(cp.kubeconfig)
        # ansible_host: TEST-NET-1 -- the cluster layer never connects to the nodes
        one = inventory(work / "one.yml", {"gpu-001": {"ansible_host": "192.0.2.1"}})
        many = inventory(work / "many.yml", {n_["name"]: {"ansible_host": "192.0.2.1"} for n_ in nodes})
        base = [EXE, "validate", "-s", str(site), "--kubeconfig", kc, "--only", "cluster"]
        t1, r1 = timed([*base, "-i", str(one)], n)
        tn, rn = timed([*base, "-i", str(many)], n)
        print(f"cluster layer, 1 node:    {t1:.2f}s (exit, checks per run: {r1})")
        print(f"cluster layer, {count} nodes: {tn:.2f}s (exit, checks per run: {rn})")
        print(f"cluster layer: {count} nodes / 1 node = {tn / t1:.2f}x (target <= 2x)", flush=True)
    finally:
        cp.down()


def ssh_case(work: Path, count: int, n: int) -> None:
    from gpu_install_lab.lab import Lab

    lab_dir = work / "lab"
    lab = Lab(lab_dir, progress=lambda m: None)
    t0 = time.perf_counter()
    try:
        status = lab.up(count=count, flavours=["debian12"])
        print(f"lab up: {count} debian12 nodes in {time.perf_counter() - t0:.1f}s", flush=True)
        key, known = lab_dir / "ssh" / "id_ed25519", lab_dir / "ssh" / "known_hosts"
        conn = {"ansible_user": "root", "ansible_ssh_private_key_file": str(key),
                "ansible_ssh_common_args": f"-o UserKnownHostsFile={known}"}
        hosts = {node["name"]: {"ansible_host": node["ip"], **conn} for node in status["nodes"]}
        first = next(iter(hosts))
        one = inventory(work / "ssh-one.yml", {first: hosts[first]})
        many = inventory(work / "ssh-many.yml", hosts)
        site = work / "site.yaml"
        site.write_text(yaml.safe_dump(SITE))
        base = [EXE, "validate", "-s", str(site), "--only", "node,runtime"]
        t1, r1 = timed([*base, "-i", str(one)], n)
        tn, rn = timed([*base, "-i", str(many)], n)
        print(f"node+runtime layers, 1 node:  {t1:.2f}s (exit, checks per run: {r1})")
        print(f"node+runtime layers, {count} nodes: {tn:.2f}s (exit, checks per run: {rn})")
        print(f"node+runtime layers: {count} nodes / 1 node = {tn / t1:.2f}x", flush=True)
    finally:
        lab.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hollow", type=int, default=100, help="hollow GPU nodes for the cluster layer (0: skip)")
    ap.add_argument("--ssh-nodes", type=int, default=8, help="lab nodes for the node+runtime layers (0: skip)")
    ap.add_argument("-n", type=int, default=3, help="runs per case (the median is printed)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_validate needs root (the lab)")
    work = Path(tempfile.mkdtemp(prefix="bench-validate-"))
    try:
        if args.hollow:
            cluster_case(work, args.hollow, args.n)
        if args.ssh_nodes:
            ssh_case(work, args.ssh_nodes, args.n)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the labs are down by now (each case's finally)
    return 0


if __name__ == "__main__":
    sys.exit(main())
