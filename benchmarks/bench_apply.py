#!/usr/bin/env python3
"""No-op re-apply on 1 node vs N nodes of a lab (figures, not a pass/fail test). Root.

    .venv/bin/python benchmarks/bench_apply.py [--nodes 8] [-n 3] [--variant NAME:VAR=VALUE,...]

Brings up a lab of debian12 nodes, serves containerd + the runtime/toolkit stand-ins from the lab repo (as
tests/integration/test_runtime_roles.py does), installs containerd on every node with apt, applies once
(runtime containerd, toolkit.mode host, driver.mode operator with its own debian12 driver image), then times `gpu-install apply` (the real CLI:
preflight.yml + site.yml) n times with `--limit node1` and n times on all nodes. Every re-apply must report
changed=0 on every host (asserted from the runs' job events; printed). Per run: wall time, wall time per node,
the controller's peak memory (sum of the PSS of gpu-install, ansible-playbook, its forks and ssh, sampled at
5 Hz; and the largest single process's peak RSS), its CPU time, and the forks Ansible used (the most task
executions that overlapped in time, from the events' start/end; ansible.cfg's forks is the cap).
Variants re-run the re-apply with environment overrides of ansible.cfg, e.g.
    --variant no-pipelining:ANSIBLE_PIPELINING=False
    --variant no-multiplexing:ANSIBLE_SSH_ARGS=-o ControlMaster=no
The lab is torn down at the end (--keep-lab leaves it, and prints its directory).
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VENV_BIN = Path(sys.executable).parent
EXE = str(VENV_BIN / "gpu-install")

CONTAINERD_TOML = """\
# the site's own containerd config (version 2, containerd 1.6)
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""
SITE = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.internal:5000"},
        "runtime": "containerd", "toolkit": {"mode": "host", "version": "1.17.4"},
        # the lab's nodes are Debian 12, for which NVIDIA publishes no driver image: the site builds its own (as the
        # lab tests' sites do); without it preflight refuses the OS (exit 3)
        "driver": {"mode": "operator", "customImageOs": ["debian12"]}}


def _tree(root_pid: int) -> list[int]:
    """root_pid and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _kb(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _ssh_to(hosts: tuple[str, ...]) -> list[int]:
    """ssh client processes whose command line names one of these hosts."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"ssh") and any(h.encode() in argv for h in hosts):
            out.append(int(entry))
    return out


class Sampler(threading.Thread):
    """Peak of the summed PSS of a process tree, and the largest peak RSS (VmHWM) of one of its processes (5 Hz)."""

    def __init__(self, pid: int, also: tuple[str, ...] = ()):
        super().__init__(daemon=True)
        self.pid, self.peak_kb, self.peak_procs, self.hwm_kb = pid, 0, 0, 0
        self.also = also
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            pids = _tree(self.pid)
            if self.also:  # Ansible's persistent SSH masters (ControlPersist) leave the tree: count them by host
                pids += [p for p in _ssh_to(self.also) if p not in pids]
            total = sum(_kb(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
            self.hwm_kb = max([self.hwm_kb] + [_kb(f"/proc/{p}/status", "VmHWM:") for p in pids])
            if total > self.peak_kb:
                self.peak_kb, self.peak_procs = total, len(pids)


def run_cli(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,), also: tuple[str, ...] = ()) -> dict:
    """Run a command; wall time, peak memory (also: count ssh processes to these hosts too), CPU time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = Sampler(proc.pid, also)
    sampler.start()
    out, err = proc.communicate(timeout=1800)
    wall = time.perf_counter() - t0
    sampler.done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}\n{out}\n{err[-4000:]}")
    return {"wall": wall, "pss_mb": sampler.peak_kb / 1024, "procs": sampler.peak_procs,
            "maxrss_mb": sampler.hwm_kb / 1024,
            "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "stdout": out}


def run_events(state: Path, before: set[str]) -> list[list[dict]]:
    """Job events of the runs not in `before` (run directory names), oldest first."""
    out = []
    for run in sorted((state / "runs").iterdir(), key=lambda p: p.name):
        if run.name in before:
            continue
        out.append([json.loads(p.read_text()) for p in (run / "artifacts" / "run" / "job_events").glob("*.json")])
    return out


def stats_of(events: list[dict]) -> dict[str, dict[str, int]]:
    for ev in events:
        if ev.get("event") == "playbook_on_stats":
            d = ev["event_data"]
            hosts = set().union(*(d.get(k) or {} for k in ("ok", "changed", "failures", "dark", "processed")))
            return {h: {k: int((d.get(k) or {}).get(h, 0)) for k in ("ok", "changed", "failures", "dark")}
                    for h in hosts}
    raise SystemExit("a run without playbook_on_stats")


def overlap(events: list[dict]) -> int:
    """The most task executions running at the same moment (start/end of the result events)."""
    marks = []
    for ev in events:
        d = ev.get("event_data") or {}
        if ev.get("event", "").startswith("runner_on_") and d.get("start") and d.get("end"):
            marks.append((datetime.fromisoformat(d["start"]).timestamp(), 1))
            marks.append((datetime.fromisoformat(d["end"]).timestamp(), -1))
    best = cur = 0
    for _, step in sorted(marks, key=lambda m: (m[0], m[1])):
        cur += step
        best = max(best, cur)
    return best


def forks_cfg() -> int:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    return cfg.getint("defaults", "forks", fallback=5)


def apply_once(site: Path, inv: Path, state: Path, env: dict[str, str], limit: str | None,
               also: tuple[str, ...] = ()) -> dict:
    argv = [EXE, "apply", "-q", "--skip-operator", "-s", str(site), "-i", str(inv)] + (["--limit", limit] if limit else [])
    before = {p.name for p in (state / "runs").iterdir()} if (state / "runs").is_dir() else set()
    r = run_cli(argv, env, also=also)
    runs = run_events(state, before)
    changed = {}
    conc = 0
    for evs in runs:
        for host, s in stats_of(evs).items():
            changed[host] = changed.get(host, 0) + s["changed"]
            assert s["failures"] == 0 and s["dark"] == 0, (host, s)
        conc = max(conc, overlap(evs))
    tasks: dict[str, float] = {}
    for evs in runs:
        for ev in evs:
            d = ev.get("event_data") or {}
            if ev.get("event") in ("runner_on_ok", "runner_on_skipped", "runner_on_failed"):
                tasks[d.get("task", "?")] = tasks.get(d.get("task", "?"), 0.0) + float(d.get("duration") or 0)
    r.update(changed=changed, forks=conc, playbooks=len(runs), tasks=tasks)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=8, help="lab nodes (default 8; 1: the 1-node case only)")
    ap.add_argument("-n", type=int, default=3, help="re-applies per case")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]")
    ap.add_argument("--keep-lab", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_apply needs root (the lab)")
    variants = {"default": {}}
    for spec in args.variant:
        name, _, assigns = spec.partition(":")
        variants[name] = dict(a.split("=", 1) for a in assigns.split(",") if a)

    from gpu_install_lab import packages as lab_packages
    from gpu_install_lab.lab import Lab

    work = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    lab_dir = work / "lab"
    lab = Lab(lab_dir, progress=lambda m: None)
    t0 = time.perf_counter()
    try:
        status = lab.up(count=args.nodes, flavours=["debian12"])
        nodes = [n["name"] for n in status["nodes"]]
        print(f"lab up: {len(nodes)} debian12 nodes in {time.perf_counter() - t0:.1f}s ({lab_dir})", flush=True)
        debs = lab_packages.runtime_debs(progress=lambda m: None)
        subprocess.run([EXE, "lab", "--lab-dir", str(lab_dir), "repo-add", *map(str, debs)], check=True,
                       capture_output=True, timeout=600)
        key, known = lab_dir / "ssh" / "id_ed25519", lab_dir / "ssh" / "known_hosts"

        def prepare(node: dict) -> None:
            ssh = ["ssh", "-i", str(key), "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
                   "-o", "BatchMode=yes", f"root@{node['ip']}"]
            subprocess.run([*ssh, "mkdir -p /etc/containerd && cat > /etc/containerd/config.toml"],
                           input=CONTAINERD_TOML, text=True, check=True, capture_output=True, timeout=60)
            subprocess.run([*ssh, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                                  "-o Dpkg::Options::=--force-confold containerd "
                                  "gpu-install-standin-nvidia-container-runtime"],
                           check=True, capture_output=True, timeout=900)

        t1 = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(prepare, status["nodes"]))
        print(f"containerd installed on {len(nodes)} nodes in {time.perf_counter() - t1:.1f}s", flush=True)

        site = work / "site.yaml"
        site.write_text(yaml.safe_dump(SITE))
        inv = lab_dir / "inventory" / "hosts.yml"
        state = work / "state"
        env = {**os.environ, "GPU_INSTALL_STATE": str(state), "ANSIBLE_LOCAL_TEMP": str(work / "tmp")}
        first = apply_once(site, inv, state, env, None)
        print(f"first apply ({len(nodes)} nodes): {first['wall']:.1f}s, changed "
              f"{sum(first['changed'].values())} (per node {sorted(set(first['changed'].values()))})", flush=True)

        cap = forks_cfg()
        print(f"\nno-op re-apply (preflight.yml + site.yml), n={args.n}; ansible.cfg forks={cap}; "
              f"{os.cpu_count()} CPUs\n")
        head = (f"{'variant':16} {'nodes':>5} {'wall s (median, min-max)':>25} {'s/node':>7} {'changed':>7} "
                f"{'peak PSS MB':>11} {'max RSS MB':>10} {'cpu s':>6} {'forks':>5}")
        print(head)
        for vname, overrides in variants.items():
            venv = {**env, **overrides}
            cases = [(nodes[0], 1)] + ([(None, len(nodes))] if len(nodes) > 1 else [])
            for limit, count in cases:
                rs = [apply_once(site, inv, state, venv, limit) for _ in range(args.n)]
                for r in rs:
                    assert set(r["changed"]) >= set(nodes[:count]), r["changed"]
                    assert all(v == 0 for v in r["changed"].values()), f"re-apply changed something: {r['changed']}"
                walls = [r["wall"] for r in rs]
                med = statistics.median(walls)
                print(f"{vname:16} {count:>5} {med:>9.1f} ({min(walls):5.1f}-{max(walls):5.1f}){'':6} "
                      f"{med / count:>7.2f} {sum(sum(r['changed'].values()) for r in rs):>7} "
                      f"{max(r['pss_mb'] for r in rs):>11.0f} {max(r['maxrss_mb'] for r in rs):>10.0f} "
                      f"{statistics.median(r['cpu'] for r in rs):>6.1f} "
                      f"{max(r['forks'] for r in rs):>5}", flush=True)
                last = rs[-1]
            top = sorted(last["tasks"].items(), key=lambda kv: -kv[1])[:6]
            print(f"  {vname}: slowest tasks of the last {len(nodes)}-node re-apply (seconds summed over hosts): "
                  + "; ".join(f"{t} {sec:.1f}" for t, sec in top), flush=True)
    finally:
        if args.keep_lab:
            print(f"lab kept: {lab_dir} (gpu-install lab down --lab-dir {lab_dir})")
        else:
            lab.down()
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
