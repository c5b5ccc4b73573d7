#!/usr/bin/env python3
"""apply (no-op), preflight and validate on 1 host vs a fleet of N hosts (figures, not a pass/fail test). Root.

    .venv/bin/python benchmarks/bench_fleet.py [--hosts 100] [-n 1] [--variant NAME:VAR=VALUE,...] [--only CASES]
                                               [--no-converge]

The fleet: N lightweight hosts that Ansible and validate's SSH reach the way they reach real nodes. Each host is an
sshd (the node rootfs's own OpenSSH, as the lab user with sudo) in its own network namespace on the lab bridge, in a
private mount and PID namespace, chrooted into an overlay whose lower layers are shared read-only by every host:

  1. a one-node lab (gpu_install_lab: bastion bridge, package repo, CA, SSH key; node1 a systemd-nspawn debian12
     node) gets containerd and the toolkit STAND-IN from the lab repo and a real `gpu-install apply`, so its systemd
     restarts containerd as on a real node: that converged node's overlay upper (copied once) over the lab's cached
     debian12 rootfs is the fleet's shared root;
  2. hosts h001..hNNN: netns + veth on the lab bridge, an overlay of their own (upper: the per-host files the lab
     writes for its nodes -- hostname, SSH host key, authorized keys), `unshare --mount --pid --uts --fork
     --kill-child` + proc/sys/dev/run mounts + `chroot ... sshd -D -e`. No systemd: a play that would restart a
     service fails here, which is what proves the re-applies found nothing to change;
  3. one `apply` over the whole fleet (the converge: it must leave every host as it found it, changed=0;
     --no-converge skips it), then,
     per variant, 1 host and N hosts in the same run: `apply --skip-operator` (preflight.yml + site.yml; changed=0
     asserted per host from the job events), `preflight`, and `validate --only node,runtime` (the check count
     asserted to scale with the hosts).

Printed per case: the median wall time of -n runs, the controller's peak memory (summed PSS of gpu-install,
ansible-playbook, its forks and ssh processes, including Ansible's persistent SSH masters to the fleet's hosts),
its CPU seconds, the hosts' CPU seconds (every host's processes share one cgroup: on this machine they use the
controller's cores, on a real fleet their own), and the ratio N/1 last. Figures: docs/performance.md. Variants re-run the cases with ansible.cfg overrides from the environment:
    --variant forks5:ANSIBLE_FORKS=5 --variant free:ANSIBLE_STRATEGY=free
The fleet and the lab are torn down at the end and checked: no network namespace, sshd, mount or veth left.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import bench_apply  # noqa: E402 - the same CLI runner, sampler and job-event readers

EXE = bench_apply.EXE
SITE = bench_apply.SITE
CASES = ("apply", "preflight", "validate")
FIRST_INDEX = 2  # node1 (the template node) has index 1 on the lab subnet; fleet host i gets index 1 + i


class Fleet:
    """N sshd hosts on the lab's bridge; every resource recorded as it is made, so down() removes exactly those."""

    def __init__(self, work: Path, lab_dir: Path, settings: dict[str, Any], lower: str):
        from gpu_install_lab import net

        self.dir = work / "fleet"
        self.lab_dir = lab_dir
        self.settings = settings
        self.lower = lower
        self.lid = net.lab_id(self.dir)
        self.hosts: dict[str, dict[str, Any]] = {}
        self.procs: dict[str, dict[str, Any]] = {}
        self.mounts: list[Path] = []
        self.links: list[str] = []
        self.netns: list[str] = []
        self.cgroup = ""  # every host's processes, for their CPU time (cpuacct)

    def up(self, count: int) -> None:
        from gpu_install_lab import net, nodes, proc

        s = self.settings
        prefix = s["subnet"].split("/")[1]
        if FIRST_INDEX + count - 1 + net.NODE_OFFSET > 254:
            raise SystemExit(f"--hosts {count}: the lab's /24 has room for {254 - net.NODE_OFFSET - FIRST_INDEX + 1}")
        for i in range(1, count + 1):
            name = f"h{i:03d}"
            self.hosts[name] = {"name": name, "index": FIRST_INDEX + i - 1, "flavour": "debian12",
                                "ip": net.node_ip(s["subnet"], FIRST_INDEX + i - 1),
                                "netns": f"gif-{self.lid}-{name}", "veth": f"gf{self.lid}{i}",
                                "dir": self.dir / name}
        pubkey = (self.lab_dir / "ssh" / "id_ed25519.pub").read_text().strip()
        lab = {"bastion_ip": s["bastion_ip"], "hosts": {n: h["ip"] for n, h in self.hosts.items()},
               "ssh_pubkey": pubkey, "ca_pem": (self.lab_dir / "pki" / "ca.crt").read_text(),
               "registry": s["registry"], "repo_url": s["repo_url"], "trust_ca": True}

        def make(host: dict[str, Any], cgroup: list[Path]) -> None:
            self.netns.append(host["netns"])
            self.links.append(host["veth"])
            net.ensure_node_link(host["netns"], host["veth"], s["bridge"], f"{host['ip']}/{prefix}")
            d: Path = host["dir"]
            for sub in ("upper", "work", "merged"):
                (d / sub).mkdir(parents=True, exist_ok=True)
            self.mounts.append(d / "merged")
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={self.lower},upperdir={d / 'upper'},workdir={d / 'work'}", str(d / "merged")],
                           check=True, capture_output=True)
            host["host_key"] = nodes.customise(d / "merged", host, lab)
            r = d / "merged"
            script = (f"mount -t proc proc {r}/proc && mount -t sysfs -o ro sysfs {r}/sys && "
                      f"mount --rbind /dev {r}/dev && mount -t tmpfs -o mode=755 tmpfs {r}/run && "
                      f"mkdir -p {r}/run/sshd && hostname {host['name']} && "
                      f"exec chroot {r} /usr/sbin/sshd -D -e")
            argv = ["ip", "netns", "exec", host["netns"], "unshare", "--mount", "--pid", "--uts", "--ipc", "--fork",
                    "--kill-child", "--propagation", "private", "sh", "-c", script]
            self.procs[host["name"]] = proc.spawn(argv, d / "sshd.log", preexec_fn=lambda: nodes.cgroup_enter(cgroup))

        self.cgroup = f"{nodes.CGROUP_PARENT}/{self.lid}-fleet"
        paths = nodes.cgroup_create(self.cgroup, controllers=True)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda h: make(h, paths), self.hosts.values()))
        (self.dir / "known_hosts").write_text("".join(
            f"{h['ip']},{n} {' '.join(h['host_key'].split()[:2])}\n" for n, h in self.hosts.items()))
        for name, host in self.hosts.items():
            rec = self.procs[name]
            nodes.wait_ssh(host["ip"], timeout=60, proc_alive=lambda rec=rec: proc.alive(rec))

    def cpu_seconds(self) -> float:
        """CPU time used so far by every process of every host (sshd, sudo, the modules Ansible runs there)."""
        from gpu_install_lab import nodes

        for root in nodes.cgroup_roots(controllers=True):
            usage = root / self.cgroup / "cpuacct.usage"
            if usage.exists():
                return int(usage.read_text()) / 1e9
        stat = Path("/sys/fs/cgroup", self.cgroup, "cpu.stat")  # cgroup v2
        return int(stat.read_text().split("usage_usec ")[1].split()[0]) / 1e6 if stat.exists() else float("nan")

    def inventory(self, path: Path, names: list[str]) -> Path:
        from gpu_install_lab import inventory

        inv = inventory.inventory(self.lab_dir, self.settings, {n: self.hosts[n] for n in names})
        gpu = inv["all"]["children"]["gpu_nodes"]
        gpu["vars"]["ansible_ssh_common_args"] = gpu["vars"]["ansible_ssh_common_args"].replace(
            str(self.lab_dir / "ssh" / "known_hosts"), str(self.dir / "known_hosts"))
        path.write_text(yaml.safe_dump(inv, sort_keys=False))
        return path

    def down(self) -> list[str]:
        """Stop every sshd (its PID namespace and mounts go with it), then remove overlays, links and namespaces.
        Returns what could not be removed."""
        from gpu_install_lab import net, nodes, proc

        for rec in self.procs.values():
            proc.send(rec, signal.SIGTERM)  # unshare --kill-child: the namespace's PID 1 (sshd) gets SIGKILL
        left = proc.wait_gone(list(self.procs.values()), 20)
        for rec in left:
            proc.send(rec, signal.SIGKILL)
        proc.wait_gone(left, 5)
        errors = []
        for ns in self.netns:
            for pid in net.netns_pids(ns):  # only the fleet's own processes can be in its namespaces
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for m in self.mounts:
            try:
                nodes.umount(m)
            except Exception as exc:  # noqa: BLE001 - collected and reported
                errors.append(f"mount {m}: {exc}")
        for link in self.links:
            try:
                net.delete_link(link)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"link {link}: {exc}")
        for ns in self.netns:
            try:
                net.delete_netns(ns)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"netns {ns}: {exc}")
        if self.cgroup:
            try:
                nodes.cgroup_remove(self.cgroup)
            except OSError as exc:
                errors.append(f"cgroup {self.cgroup}: {exc}")
        return errors


def leftovers(work: Path, fleet: Fleet | None) -> list[str]:
    """What the run left on this machine: its namespaces, links, mounts under its work dir, sshd in its roots."""
    out = []
    names = set(fleet.netns if fleet else []) | set(fleet.links if fleet else [])
    netns = {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                         text=True).stdout.splitlines() if line.strip()}
    out += [f"netns {n}" for n in sorted(netns & names)]
    out += [f"link {n}" for n in sorted(names) if Path("/sys/class/net", n).exists()]
    with open("/proc/self/mountinfo") as fh:
        out += [f"mount {ln.split()[4]}" for ln in fh if ln.split()[4].startswith(str(work) + "/")]
    if fleet is not None and fleet.cgroup:
        from gpu_install_lab import nodes

        out += [f"cgroup {root / fleet.cgroup}" for root in nodes.cgroup_roots(controllers=True)
                if (root / fleet.cgroup).exists()]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            root = os.readlink(f"/proc/{pid}/root")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if root.startswith(str(work) + "/"):
            out.append(f"process {pid} ({comm}) in {root}")
    return out


def converge_template(lab: Any, lab_dir: Path, work: Path, env: dict[str, str]) -> Path:
    """node1 of the lab: containerd and the toolkit STAND-IN from the lab repo, then a real apply (systemd
    restarts containerd). Returns a copy of its converged overlay upper."""
    from gpu_install_lab import packages as lab_packages

    status = lab.status()
    node = status["nodes"][0]
    debs = lab_packages.runtime_debs(progress=lambda m: None)
    subprocess.run([EXE, "lab", "--lab-dir", str(lab_dir), "repo-add", *map(str, debs)], check=True,
                   capture_output=True, timeout=600)
    key, known = lab_dir / "ssh" / "id_ed25519", lab_dir / "ssh" / "known_hosts"
    ssh = ["ssh", "-i", str(key), "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
           "-o", "BatchMode=yes", f"root@{node['ip']}"]
    subprocess.run([*ssh, "mkdir -p /etc/containerd && cat > /etc/containerd/config.toml"],
                   input=bench_apply.CONTAINERD_TOML, text=True, check=True, capture_output=True, timeout=60)
    subprocess.run([*ssh, "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                          "-o Dpkg::Options::=--force-confold containerd gpu-install-standin-nvidia-container-runtime"],
                   check=True, capture_output=True, timeout=900)
    site = work / "site.yaml"
    state = Path(env["GPU_INSTALL_STATE"])
    first = bench_apply.apply_once(site, lab_dir / "inventory" / "hosts.yml", state, env, None)
    # the template's runtime state is not part of a converged root: containerd's content store, logs
    subprocess.run([*ssh, "systemctl stop containerd; sync"], check=True, capture_output=True, timeout=60)
    template = work / "template"
    subprocess.run(["cp", "-a", str(lab_dir / "nodes" / node["name"] / "upper"), str(template)], check=True)
    for sub in ("var/lib/containerd", "var/log/journal", "run", "tmp"):
        p = template / sub
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
            p.mkdir(mode=0o1777 if sub == "tmp" else 0o755)
    print(f"template node converged by a real apply in {first['wall']:.1f}s (changed "
          f"{sum(first['changed'].values())})", flush=True)
    return template


def run_validate(inv: Path, site: Path, env: dict[str, str], out: Path, also: tuple[str, ...]) -> dict[str, Any]:
    r = bench_apply.run_cli([EXE, "validate", "-q", "-s", str(site), "-i", str(inv), "--only", "node,runtime",
                             "--json", str(out)], env, ok=(0, 6), also=also)
    checks = json.loads(out.read_text())["checks"]
    r["checks"] = len(checks)
    r["hosts_checked"] = len({c["node"] for c in checks})
    dark = sorted({c["node"] for c in checks if c["status"] == "unreachable"})
    assert not dark, f"validate could not reach {dark}"
    return r


def run_case(case: str, inv: Path, site: Path, state: Path, env: dict[str, str], work: Path,
             hosts: list[str], ips: tuple[str, ...]) -> dict[str, Any]:
    if case == "apply":
        r = bench_apply.apply_once(site, inv, state, env, None, also=ips)
        missing = set(hosts) - set(r["changed"])
        assert not missing, f"apply did not reach {sorted(missing)}"
        changed = {h: c for h, c in r["changed"].items() if c}
        assert not changed, f"a no-op apply changed something: {changed}"
        return r
    if case == "preflight":
        return bench_apply.run_cli([EXE, "preflight", "-q", "-s", str(site), "-i", str(inv)], env, also=ips)
    r = run_validate(inv, site, env, work / "validate.json", ips)
    assert r["hosts_checked"] == len(hosts), f"validate checked {r['hosts_checked']} hosts, not {len(hosts)}"
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=100, help="fleet size N (default 100)")
    ap.add_argument("-n", type=int, default=1, help="runs per case (the median is printed; default 1)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]")
    ap.add_argument("--only", default=",".join(CASES), help=f"cases to time (default {','.join(CASES)})")
    ap.add_argument("--no-converge", action="store_true",
                    help="no untimed first apply over the fleet (the timed applies assert changed=0 themselves)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_fleet needs root (network namespaces, overlay mounts)")
    cases = [c for c in args.only.split(",") if c]
    if not cases or set(cases) - set(CASES):
        raise SystemExit(f"--only: choose from {', '.join(CASES)}")
    variants: dict[str, dict[str, str]] = {"default": {}}
    for spec in args.variant:
        name, _, assigns = spec.partition(":")
        variants[name] = dict(a.split("=", 1) for a in assigns.split(",") if a)

    from gpu_install_lab import rootfs
    from gpu_install_lab.lab import Lab

    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    lab_dir = work / "lab"
    lab = Lab(lab_dir, progress=lambda m: None)
    fleet: Fleet | None = None
    state = work / "state"
    env = {**os.environ, "GPU_INSTALL_STATE": str(state), "ANSIBLE_LOCAL_TEMP": str(work / "tmp")}
    site = work / "site.yaml"
    site.write_text(yaml.safe_dump(SITE))
    problems: list[str] = []
    try:
        t0 = time.perf_counter()
        lab.up(count=1, flavours=["debian12"])
        template = converge_template(lab, lab_dir, work, env)
        settings = lab.state().settings
        fleet = Fleet(work, lab_dir, settings, f"{template}:{rootfs.ensure_rootfs('debian12', progress=print)}")
        t1 = time.perf_counter()
        fleet.up(args.hosts)
        names = list(fleet.hosts)
        print(f"fleet up: {len(names)} sshd hosts in {time.perf_counter() - t1:.1f}s "
              f"(lab and template {t1 - t0:.1f}s)", flush=True)
        inv1 = fleet.inventory(work / "fleet-1.yml", names[:1])
        invn = fleet.inventory(work / "fleet-n.yml", names)
        sizes = [(inv1, names[:1])] + ([(invn, names)] if len(names) > 1 else [])
        if len(names) > 1 and not args.no_converge:  # else the timed applies below assert changed=0 on their own
            t2 = time.perf_counter()
            conv = bench_apply.apply_once(site, invn, state, env, None)  # also warms Ansible's SSH connections
            moved = {h: c for h, c in conv["changed"].items() if c}
            assert set(names) <= set(conv["changed"]), "the converge did not reach every host"
            assert not moved, f"the fleet's shared root is not converged: {moved}"
            print(f"converge apply over {len(names)} hosts: {time.perf_counter() - t2:.1f}s, changed=0 on every "
                  "host", flush=True)

        print(f"\n{len(names)} hosts vs 1, n={args.n}, ansible.cfg forks={bench_apply.forks_cfg()}, "
              f"{os.cpu_count()} CPUs\n")
        print(f"{'variant':14} {'case':10} {'hosts':>5} {'wall s':>7} {'peak PSS MB':>11} {'max RSS MB':>10} "
              f"{'cpu s':>6} {'hosts cpu s':>11} {'forks':>5}")
        ratios: list[str] = []
        for vname, overrides in variants.items():
            venv = {**env, **overrides}
            for case in cases:
                if case == "validate" and overrides:
                    continue  # validate's SSH is its own (paramiko): Ansible's settings do not reach it
                walls: dict[int, float] = {}
                for inv, hosts in sizes:
                    ips = tuple(fleet.hosts[h]["ip"] for h in hosts)
                    rs = []
                    for _ in range(args.n):
                        before = fleet.cpu_seconds()
                        rs.append(run_case(case, inv, site, state, venv, work, hosts, ips))
                        rs[-1]["hosts_cpu"] = fleet.cpu_seconds() - before
                    med = statistics.median(r["wall"] for r in rs)
                    walls[len(hosts)] = med
                    print(f"{vname:14} {case:10} {len(hosts):>5} {med:>7.2f} {max(r['pss_mb'] for r in rs):>11.0f} "
                          f"{max(r['maxrss_mb'] for r in rs):>10.0f} {statistics.median(r['cpu'] for r in rs):>6.1f} "
                          f"{statistics.median(r['hosts_cpu'] for r in rs):>11.1f} "
                          f"{max(r.get('forks', 0) for r in rs):>5}", flush=True)
                if case == "apply" and vname == "default":
                    top = sorted(rs[-1]["tasks"].items(), key=lambda kv: -kv[1])[:5]
                    print(f"  slowest tasks, {len(hosts)} hosts (s summed over hosts): "
                          + "; ".join(f"{t} {sec:.1f}" for t, sec in top), flush=True)
                if len(names) > 1:
                    ratios.append(f"{vname:14} {case:10} {len(names)}/1 = {walls[len(names)] / walls[1]:.2f}x")
        print("\nratio N/1 (targets at N=100: apply <= 3x, validate <= 2x; peak memory <= 1024 MB)")
        print("\n".join(ratios), flush=True)
    finally:
        if fleet is not None:
            problems += fleet.down()
        lab.down()
        problems += leftovers(work, fleet)
        if not problems:
            shutil.rmtree(work, ignore_errors=True)
    if problems:
        print("LEFT BEHIND: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("torn down: no fleet netns, link, mount or sshd left")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
