"""Lab network: one bridge on the bastion (this machine) and one network namespace per node,
joined to the bridge by a veth pair. Nodes get an address on the lab subnet and no default
route, and the bridge has IPv4 forwarding off and IPv6 disabled: a node can reach the bastion
(and the other nodes) and nothing else.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from gpu_install_lab.sh import run
from installer.errors import EnvironmentProblem

SUPERNET = ipaddress.ip_network("10.250.0.0/16")
NODE_OFFSET = 10  # node i (1-based) gets .10+i; the bastion is .1


def lab_id(lab_dir: Path) -> str:
    return hashlib.sha256(str(Path(lab_dir).resolve()).encode()).hexdigest()[:6]


def bridge_name(lid: str) -> str:
    return f"gl{lid}br"  # interface names: at most 15 characters


def veth_name(lid: str, index: int) -> str:
    return f"gl{lid}v{index}"


def netns_name(lid: str, node: str) -> str:
    return f"gpu-install-{lid}-{node}"


def bastion_ip(subnet: str) -> str:
    return str(ipaddress.ip_network(subnet)[1])


def node_ip(subnet: str, index: int) -> str:
    net = ipaddress.ip_network(subnet)
    addr = net[NODE_OFFSET + index]
    if addr == net.broadcast_address:
        raise EnvironmentProblem(f"lab subnet {subnet} has no room for node {index}")
    return str(addr)


def pick_subnet(used: list[str]) -> str:
    """First /24 of 10.250.0.0/16 that overlaps none of the networks in use on this machine."""
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    for net in SUPERNET.subnets(new_prefix=24):
        if not any(net.overlaps(t) for t in taken):
            return str(net)
    raise EnvironmentProblem(
        "no free /24 in 10.250.0.0/16 for the lab network", hint="pass --subnet with a free /24"
    )


SUBNET_LOCK = Path("/run/gpu-install-lab-subnet.lock")


@contextlib.contextmanager
def subnet_lock() -> Iterator[None]:
    """Machine-wide: held from picking a lab's /24 until its bridge holds the address (claim_subnet)."""
    with open(SUBNET_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def claim_subnet(bridge: str, subnet: str | None = None, before_create: Callable[[], object] = lambda: None) -> str:
    """Pick the first free /24 (or take `subnet`) and create `bridge` with the bastion's address in it, which is what
    makes the /24 taken for the next lab. Labs may come up side by side (the lab tests run two modules at once): the
    pick and the address happen under one machine-wide lock, so two labs never get the same /24.
    `before_create` runs under the lock just before the bridge is made (the lab records the link for teardown)."""
    with subnet_lock():
        sub = subnet or pick_subnet(used_networks())
        before_create()
        ensure_bridge(bridge, f"{bastion_ip(sub)}/{sub.split('/')[1]}")
        return sub


def used_networks() -> list[str]:
    """IPv4 networks already routed or assigned on this machine (all tables)."""
    out: list[str] = []
    for route in json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]"):
        if route.get("dst") not in (None, "default"):
            out.append(route["dst"])
    for link in json.loads(run(["ip", "-j", "-4", "addr"]).stdout or "[]"):
        for a in link.get("addr_info", []):
            out.append(f"{a['local']}/{a['prefixlen']}")
    return out


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _write(path: str, value: str) -> None:
    try:
        Path(path).write_text(value)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot set {path} = {value}: {exc}") from exc


def _isolate(ifname: str) -> None:
    """No forwarding of packets that arrive on this interface, and no IPv6 on it."""
    _write(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding", "0")
    _write(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "1")


def ensure_bridge(name: str, cidr: str) -> None:
    if not link_exists(name):
        run(["ip", "link", "add", name, "type", "bridge"])
    _isolate(name)
    addrs = run(["ip", "-j", "-4", "addr", "show", "dev", name]).stdout
    if cidr.split("/")[0] not in addrs:
        run(["ip", "addr", "add", cidr, "dev", name])
    run(["ip", "link", "set", name, "up"])


def ensure_node_link(ns: str, host_if: str, bridge: str, cidr: str) -> None:
    """veth host_if (on the bridge) <-> eth0 in netns ns with address cidr; no default route."""
    if not netns_exists(ns):
        run(["ip", "netns", "add", ns])
    if not link_exists(host_if):
        run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns])
    _isolate(host_if)
    run(["ip", "link", "set", host_if, "master", bridge, "up"])
    _write_ns_sysctl(ns)
    addrs = run(["ip", "-j", "-4", "addr", "show", "dev", "eth0"], netns=ns).stdout
    if cidr.split("/")[0] not in addrs:
        run(["ip", "addr", "add", cidr, "dev", "eth0"], netns=ns)
    run(["ip", "link", "set", "lo", "up"], netns=ns)
    run(["ip", "link", "set", "eth0", "up"], netns=ns)


def _write_ns_sysctl(ns: str) -> None:
    run(["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"], netns=ns)


def delete_link(name: str) -> None:
    if link_exists(name):
        run(["ip", "link", "del", name])


def netns_pids(ns: str) -> list[int]:
    if not netns_exists(ns):
        return []
    out = run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split()]


def delete_netns(name: str) -> None:
    if netns_exists(name):
        run(["ip", "netns", "del", name])
