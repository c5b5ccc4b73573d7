"""Labs side by side (scripts/test runs two lab modules at once) never get the same /24: net.claim_subnet picks the
first free /24 and gives the bridge its address under one machine-wide lock. Eight processes claim at the same
instant (a barrier); each must end with a bridge of its own on a /24 of its own."""

from __future__ import annotations

import ipaddress
import multiprocessing as mp
import secrets

import pytest

from tests.integration.conftest import lab_prerequisites

pytestmark = pytest.mark.lab
N = 8


def _claim(bridge: str, barrier, out) -> None:  # a child process
    from gpu_install_lab import net

    barrier.wait(timeout=60)
    try:
        out.put((bridge, net.claim_subnet(bridge)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as the failure
        out.put((bridge, f"error: {exc}"))


def test_labs_claiming_at_once_get_distinct_subnets() -> None:
    lab_prerequisites()
    from gpu_install_lab import net

    tag = secrets.token_hex(2)
    bridges = [f"glt{tag}{i}br" for i in range(N)]  # 10 characters: interface names hold 15
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(N), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(b, barrier, out)) for b in bridges]
    try:
        for p in procs:
            p.start()
        got = dict(out.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        assert not [v for v in got.values() if v.startswith("error")], got
        assert len(set(got.values())) == N, f"two labs got the same /24: {got}"
        for bridge, sub in got.items():
            addrs = net.run(["ip", "-j", "-4", "addr", "show", "dev", bridge]).stdout
            assert net.bastion_ip(sub) in addrs, (bridge, sub, addrs)
            assert ipaddress.ip_network(sub).subnet_of(net.SUPERNET)  # type: ignore[arg-type]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for b in bridges:
            net.delete_link(b)
