"""docker: `gpu-install uninstall` and the daemon.json rollback against the REAL dockerd 20.10.24 on a lab node.

A lab of its own: 1 debian12 node; docker.io from the lab repo through gpu_install_lab/runtime.py (what
`gpu-install lab up --runtime docker` does) after the site's own daemon.json was put in place.

Rollback: dockerd 20.10 has no --validate, so nothing stops a daemon.json that dockerd only refuses when it
starts. The real-world case used: a `hosts` key in daemon.json while the systemd unit starts dockerd with
`-H fd://` ("the following directives are specified both as a flag and in the configuration file: hosts").
It reaches the node through the role's own variable docker_runtime_options (inventory), so it is our change
that breaks docker: apply must put the previous file back byte for byte, restart docker (answering again) and
fail the host saying so (exit 4).
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.integration.conftest import LabHandle, lab_prerequisites
from tests.integration.test_runtime_roles import DAEMON_JSON, Applier, _ok, apply_inventory, root, write_site

pytestmark = pytest.mark.lab
NODE = "node1"
ORIGINAL = json.dumps(DAEMON_JSON, indent=4) + "\n"


@pytest.fixture(scope="module")
def dk(tmp_path_factory):
    lab_prerequisites()
    from gpu_install_lab import runtime
    from gpu_install_lab.lab import Lab

    lab_dir = tmp_path_factory.mktemp("rblab") / "lab"
    the_lab = Lab(lab_dir, progress=lambda m: print(m, flush=True))
    work = tmp_path_factory.mktemp("rb")
    try:
        status = the_lab.up(count=1, flavours=["debian12"])
        handle = LabHandle(the_lab, lab_dir, status)
        root(handle, NODE, "mkdir -p /etc/docker && cat > /etc/docker/daemon.json", input=ORIGINAL)
        t0 = time.monotonic()
        runtime.install(lab_dir, status, "docker", progress=lambda m: print(m, flush=True))
        print(f"docker installed from the lab repo in {time.monotonic() - t0:.1f}s", flush=True)
        yield handle, Applier(apply_inventory(handle, work), work / "state"), work
    finally:
        the_lab.down()


def uninstall(apply: Applier, site, *extra: str):
    import subprocess

    argv = [apply.argv(site)[0], "uninstall", "-s", str(site), "-i", str(apply.inventory), "--skip-operator", *extra]
    return subprocess.run(argv, capture_output=True, text=True, env=apply.env(), timeout=600)


def test_lab_runtime_option_kept_the_site_daemon_json(dk):
    handle, _, _ = dk
    assert root(handle, NODE, "cat /etc/docker/daemon.json").stdout == ORIGINAL
    assert "Docker Root Dir: /srv/docker-data" in root(handle, NODE, "docker info").stdout


def test_docker_apply_then_uninstall_gives_back_the_original(dk):
    handle, apply, work = dk
    site = write_site(work, "docker", insecure=True)  # insecure: an insecure-registries entry of ours too
    _ok(apply(site))
    doc = json.loads(root(handle, NODE, "cat /etc/docker/daemon.json").stdout)
    assert doc["default-runtime"] == "nvidia" and doc["insecure-registries"] == ["registry.example.internal:5000"]
    assert "Default Runtime: nvidia" in root(handle, NODE, "docker info").stdout

    proc = uninstall(apply, site, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert root(handle, NODE, "cat /etc/docker/daemon.json").stdout == ORIGINAL  # byte for byte
    assert root(handle, NODE, "ls -A /etc/docker").stdout.count(".gpu-install-state") == 0
    info = root(handle, NODE, "docker info").stdout  # docker restarted without our runtime
    assert "Default Runtime: runc" in info and " nvidia" not in next(ln for ln in info.splitlines() if "Runtimes:" in ln)
    assert "Docker Root Dir: /srv/docker-data" in info
    proc = uninstall(apply, site, "--yes")
    assert proc.returncode == 0 and "uninstall ok: nodes changed=0" in proc.stdout, proc.stdout + proc.stderr


def test_docker_that_does_not_come_back_is_rolled_back_exit_4(dk):
    handle, apply, work = dk
    site = write_site(work, "docker")
    before = root(handle, NODE, "cat /etc/docker/daemon.json").stdout
    assert before == ORIGINAL
    inv = apply.inventory / "zz-rollback.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"vars": {
        "docker_runtime_options": {"hosts": ["unix:///var/run/docker.sock"]}}}}}}))
    try:
        proc = apply(site)
    finally:
        inv.unlink()
    assert proc.returncode == 4, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    err = proc.stderr
    assert "docker did not come back" in err and "ROLLED BACK" in err and "restored from" in err, err[-3000:]
    assert "it answers again" in err, err[-3000:]
    assert root(handle, NODE, "cat /etc/docker/daemon.json").stdout == before  # byte for byte
    root(handle, NODE, "systemctl is-active docker")
    info = root(handle, NODE, "docker info").stdout
    assert "Docker Root Dir: /srv/docker-data" in info and "Default Runtime: runc" in info
    assert root(handle, NODE, "ls -A /etc/docker").stdout.count(".gpu-install-state") == 0
    # the cause gone, the same apply goes through
    _ok(apply(site))
    assert "Default Runtime: nvidia" in root(handle, NODE, "docker info").stdout
