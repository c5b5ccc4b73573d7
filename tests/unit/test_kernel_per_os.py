"""`--kernel [OSTAG=]KERNEL`: a kernel release belongs to one OS. Without an inventory it is the kernel of the --os
nodes of its OS; with one (-i) a kernel the inventory's nodes of that OS boot next, so that `images`, `mirror plan`
and `mirror pull` carry its precompiled driver image and its kernel headers (DKMS rebuilds the driver against them
after the kernel update, in the air gap). An unqualified kernel is refused when the nodes run several OSes."""

from __future__ import annotations

import json

import pytest
import yaml

from installer.errors import ConfigError
from installer.facts import Node, flag_nodes, kernels_by_os, parse_kernel, with_next_kernels
from tests.conftest import ROOT

SAMPLE = ROOT / "inventories" / "sample"  # gpu1, gpu2: ubuntu22.04 5.15.0-105-generic; gpu3: rhel8.10 4.18.0-553
UBUNTU_NEXT = "5.15.0-200-generic"
RHEL_NEXT = "4.18.0-553.22.1.el8_10.x86_64"


@pytest.fixture
def host_site(write_site):
    return write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "driver": {"mode": "host"}})


# ---------------------------------------------------------------- the rule


def test_parse_kernel():
    assert parse_kernel("5.15.0-105-generic") == (None, "5.15.0-105-generic")
    assert parse_kernel("rhel8.10=4.18.0-553.el8_10.x86_64") == ("rhel8.10", "4.18.0-553.el8_10.x86_64")
    assert parse_kernel("Ubuntu22.04=5.15.0-105-generic") == ("ubuntu22.04", "5.15.0-105-generic")
    with pytest.raises(ConfigError, match=r"--kernel rhel=4.18.0: 'rhel' is not an OS tag"):
        parse_kernel("rhel=4.18.0")
    with pytest.raises(ConfigError, match=r"--kernel: '4.18 \$\(id\)' is not a kernel release"):
        parse_kernel("rhel8.10=4.18 $(id)")


def test_kernels_by_os():
    assert kernels_by_os(["ubuntu22.04=a-1", "rhel8.10=b-1", "ubuntu22.04=a-2"], ["ubuntu22.04", "rhel8.10"],
                         "the nodes") == {"ubuntu22.04": ["a-1", "a-2"], "rhel8.10": ["b-1"]}
    assert kernels_by_os(["a-1"], ["ubuntu22.04"], "the nodes") == {"ubuntu22.04": ["a-1"]}
    with pytest.raises(ConfigError) as exc:
        kernels_by_os(["a-1"], ["ubuntu22.04", "rhel8.10"], "the nodes")
    assert exc.value.message == ("--kernel a-1: the nodes run 2 OSes (ubuntu22.04, rhel8.10) and a kernel release "
                                 "belongs to one of them")
    assert "--kernel <os>=a-1, <os> one of ubuntu22.04, rhel8.10" in (exc.value.hint or "")
    with pytest.raises(ConfigError, match=r"--kernel rocky9.4=a-1: the nodes run no rocky9.4 \(their OSes: "
                                          r"ubuntu22.04\)"):
        kernels_by_os(["rocky9.4=a-1"], ["ubuntu22.04"], "the nodes")


def test_flag_nodes_one_per_os_and_its_kernels():
    nodes = flag_nodes(["ubuntu22.04", "rhel8.10"], ["rhel8.10=4.18.0-553.el8_10.x86_64",
                                                     "ubuntu22.04=5.15.0-105-generic", f"ubuntu22.04={UBUNTU_NEXT}"])
    assert [(n.os_name, n.kernel) for n in nodes] == [("ubuntu22.04", "5.15.0-105-generic"),
                                                      ("ubuntu22.04", UBUNTU_NEXT),
                                                      ("rhel8.10", "4.18.0-553.el8_10.x86_64")]
    assert [(n.os_name, n.kernel) for n in flag_nodes(["ubuntu22.04", "rhel8.10"], ["ubuntu22.04=5.15.0-1-generic"])] \
        == [("ubuntu22.04", "5.15.0-1-generic"), ("rhel8.10", None)]


def test_next_kernels_go_to_the_nodes_of_their_os():
    nodes = [Node("u1", "ubuntu", "22.04", "5.15.0-105-generic"), Node("r1", "rhel", "8.10", RHEL_NEXT),
             Node("x", None, None)]
    got = with_next_kernels(nodes, [f"ubuntu22.04={UBUNTU_NEXT}", f"rhel8.10={RHEL_NEXT}"])
    assert [(n.name, n.kernels) for n in got] == [("u1", ("5.15.0-105-generic", UBUNTU_NEXT)),
                                                 ("r1", (RHEL_NEXT,)),  # already its running kernel
                                                 ("x", ())]
    # one OS known: an unqualified kernel is that OS's
    single = with_next_kernels(nodes[:1], [UBUNTU_NEXT])
    assert single[0].next_kernels == (UBUNTU_NEXT,)


# ---------------------------------------------------------------- without an inventory (--os)


def test_an_unqualified_kernel_with_several_oses_is_refused(cli, host_site):
    """The report: --os ubuntu22.04 --os rhel8.10 --kernel <an Ubuntu kernel> listed kernel-devel-<it> for rhel8.10."""
    rc, out, err = cli("mirror", "plan", "-s", host_site, "--os", "ubuntu22.04", "--os", "rhel8.10",
                       "--kernel", UBUNTU_NEXT)
    assert rc == 2 and out == ""
    assert (f"error: --kernel {UBUNTU_NEXT}: the --os nodes run 2 OSes (ubuntu22.04, rhel8.10) and a kernel release "
            "belongs to one of them") in err
    assert f"hint: name its OS: --kernel <os>={UBUNTU_NEXT}, <os> one of ubuntu22.04, rhel8.10" in err
    rc, out, err = cli("images", "-s", host_site, "--set", "driver.mode=precompiled", "--os", "ubuntu22.04",
                       "--os", "rhel8.10", "--kernel", UBUNTU_NEXT)
    assert rc == 2 and "the --os nodes run 2 OSes" in err


def test_qualified_kernels_apply_to_their_os_only(cli, host_site):
    rc, out, err = cli("mirror", "plan", "-s", host_site, "--os", "ubuntu22.04", "--os", "rhel8.10",
                       "--kernel", f"ubuntu22.04={UBUNTU_NEXT}", "--kernel", f"rhel8.10={RHEL_NEXT}",
                       "--format", "json")
    assert rc == 0, err
    roots = {o["os"]: {r["name"] for r in o["roots"]} for o in json.loads(out)["packages"]}
    assert f"linux-headers-{UBUNTU_NEXT}" in roots["ubuntu22.04"] and f"kernel-devel-{RHEL_NEXT}" in roots["rhel8.10"]
    assert f"kernel-devel-{UBUNTU_NEXT}" not in roots["rhel8.10"]
    assert f"linux-headers-{RHEL_NEXT}" not in roots["ubuntu22.04"]
    rc, out, err = cli("images", "-s", host_site, "--set", "driver.mode=precompiled", "--set", "driver.version=550",
                       "--os", "ubuntu22.04", "--os", "rhel8.10", "--kernel", f"ubuntu22.04={UBUNTU_NEXT}",
                       "--kernel", f"rhel8.10={RHEL_NEXT}")
    assert rc == 0, err
    drivers = sorted(ln.split()[0] for ln in out.splitlines() if "/nvidia/driver:" in ln)
    assert drivers == [f"nvcr.io/nvidia/driver:550-{RHEL_NEXT}-rhel8.10",
                       f"nvcr.io/nvidia/driver:550-{UBUNTU_NEXT}-ubuntu22.04"]
    rc, _, err = cli("images", "-s", host_site, "--os", "ubuntu22.04", "--kernel", f"rocky9.4={RHEL_NEXT}")
    assert rc == 2 and f"--kernel rocky9.4={RHEL_NEXT}: the --os nodes run no rocky9.4 (their OSes: ubuntu22.04)" in err


# ---------------------------------------------------------------- with an inventory: the kernels the nodes boot next


def test_images_with_the_inventory_carry_the_next_kernels_precompiled_image(cli):
    base = ("images", "-s", SAMPLE / "site.yaml", "-i", SAMPLE / "hosts.yml", "--set", "driver.mode=precompiled")
    rc, out, err = cli(*base, "--kernel", f"ubuntu22.04={UBUNTU_NEXT}")
    assert rc == 0, err
    drivers = sorted(ln.split()[0].rsplit(":", 1)[1] for ln in out.splitlines() if "/nvidia/driver:" in ln)
    assert drivers == ["550-4.18.0-553.el8_10.x86_64-rhel8.10", "550-5.15.0-105-generic-ubuntu22.04",
                       f"550-{UBUNTU_NEXT}-ubuntu22.04"]
    rc, out, err = cli(*base, "--kernel", UBUNTU_NEXT)
    assert rc == 2 and out == ""
    assert f"--kernel {UBUNTU_NEXT}: the inventory's GPU nodes run 2 OSes (rhel8.10, ubuntu22.04)" in err
    # the mirror plan says which nodes each precompiled image is for, and why
    why = ("mirror", "plan", *base[1:], "--kernel", f"ubuntu22.04={UBUNTU_NEXT}", "--format", "json", "--why")
    rc, out, err = cli(*why, f"nvcr.io/nvidia/driver:550-{UBUNTU_NEXT}-ubuntu22.04")
    assert rc == 0, err
    assert json.loads(out)["artifacts"][0]["needs"][-1]["setting"] == (
        f"gpu_install_os of hosts gpu1.example.com, gpu2.example.com; --kernel {UBUNTU_NEXT} (the kernel they boot next)")
    rc, out, err = cli(*why, "nvcr.io/nvidia/driver:550-5.15.0-105-generic-ubuntu22.04")
    assert json.loads(out)["artifacts"][0]["needs"][-1]["setting"] == \
        "gpu_install_os + gpu_install_kernel of hosts gpu1.example.com, gpu2.example.com"


def test_the_mirror_plan_says_which_node_needs_which_headers(cli, write_site, tmp_path):
    site = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "driver": {"mode": "runfile", "runfile": "https://files.lab/NVIDIA-Linux-x86_64-535.216.03.run",
                                  "runfileSha256": "a" * 64}})
    base = ("mirror", "plan", "-s", site, "-i", SAMPLE / "hosts.yml", "--kernel", f"rhel8.10={RHEL_NEXT}",
            "--kernel", f"ubuntu22.04={UBUNTU_NEXT}")
    rc, out, err = cli(*base, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["kernels"] == [
        {"host": "gpu1.example.com", "os": "ubuntu22.04", "kernel": "5.15.0-105-generic", "next": [UBUNTU_NEXT],
         "headers": ["linux-headers-5.15.0-105-generic", f"linux-headers-{UBUNTU_NEXT}"]},
        {"host": "gpu2.example.com", "os": "ubuntu22.04", "kernel": "5.15.0-105-generic", "next": [UBUNTU_NEXT],
         "headers": ["linux-headers-5.15.0-105-generic", f"linux-headers-{UBUNTU_NEXT}"]},
        {"host": "gpu3.example.com", "os": "rhel8.10", "kernel": "4.18.0-553.el8_10.x86_64", "next": [RHEL_NEXT],
         "headers": ["kernel-devel-4.18.0-553.el8_10.x86_64", f"kernel-devel-{RHEL_NEXT}"]}]
    roots = {(o["os"], r["name"]): r for o in doc["packages"] for r in o["roots"]}
    nxt = roots[("rhel8.10", f"kernel-devel-{RHEL_NEXT}")]
    assert nxt["hosts"] == ["gpu3.example.com"]
    assert {"component": "nvidia_driver", "setting": f"--kernel {RHEL_NEXT}"} in nxt["needs"]
    running = roots[("rhel8.10", "kernel-devel-4.18.0-553.el8_10.x86_64")]
    assert {"component": "nvidia_driver", "setting": "gpu_install_kernel=4.18.0-553.el8_10.x86_64"} in running["needs"]
    assert ("ubuntu22.04", f"kernel-devel-{UBUNTU_NEXT}") not in roots and ("rhel8.10", f"linux-headers-"
                                                                             f"{UBUNTU_NEXT}") not in roots
    rc, out, err = cli(*base)
    assert rc == 0, err
    table = out.split("Kernel headers per node (3 nodes; the driver's kernel module is built against them: by DKMS, or by the driver container)\n", 1)[1]
    rows = [ln.split() for ln in table.splitlines()[1:7]]
    assert rows[4] == ["gpu3.example.com", "rhel8.10", "4.18.0-553.el8_10.x86_64", "running",
                       "kernel-devel-4.18.0-553.el8_10.x86_64"]
    assert rows[5] == ["gpu3.example.com", "rhel8.10", RHEL_NEXT, "boots", "next", "(--kernel)",
                       f"kernel-devel-{RHEL_NEXT}"]


def test_an_inventory_of_one_os_takes_an_unqualified_kernel(cli, host_site, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        "g1": {"gpu_install_os": "debian12", "gpu_install_kernel": "6.1.0-28-amd64"},
        "g2": {"gpu_install_os": "debian12"}}}}}}))
    rc, out, err = cli("mirror", "plan", "-s", host_site, "-i", inv, "--kernel", "6.1.0-31-amd64", "--format", "json")
    assert rc == 0, err
    kernels = {k["host"]: (k["kernel"], k["next"], k["headers"]) for k in json.loads(out)["kernels"]}
    assert kernels == {"g1": ("6.1.0-28-amd64", ["6.1.0-31-amd64"],
                              ["linux-headers-6.1.0-28-amd64", "linux-headers-6.1.0-31-amd64"]),
                       "g2": (None, ["6.1.0-31-amd64"], ["linux-headers-6.1.0-31-amd64"])}
    # g2's running kernel is not known: said, not guessed
    assert any("kernel is not known: give --kernel" in n for n in json.loads(out)["notes"])
    rc, _, err = cli("mirror", "plan", "-s", host_site, "-i", inv, "--kernel", f"rhel8.10={RHEL_NEXT}")
    assert rc == 2 and "the inventory's GPU nodes run no rhel8.10 (their OSes: debian12)" in err
    rc, _, err = cli("mirror", "plan", "-s", host_site, "-i", inv, "--os", "debian12")
    assert rc == 2 and "--os is for use without an inventory" in err


def test_mirror_pull_takes_kernel_with_the_inventory(cli, host_site, tmp_path, monkeypatch):
    """pull resolves the same plan: the next kernel's headers are among the roots it is asked to fetch (its first step,
    the check of the package sources, is where this test stops it)."""
    from installer.mirror import packages

    asked = []

    def stop(site, sets):
        asked.extend(sets)
        raise ConfigError("stopped by the test before anything is fetched")

    monkeypatch.setattr(packages, "check_sources", stop)
    out_dir = tmp_path / "bundle"
    rc, _, err = cli("mirror", "pull", "-s", host_site, "-i", SAMPLE / "hosts.yml", "-o", out_dir,
                     "--kernel", f"rhel8.10={RHEL_NEXT}", "-q")
    assert rc == 2 and "stopped by the test" in err
    rhel = next(o for o in asked if o.os == "rhel8.10")
    assert {p.name: p.hosts for p in rhel.packages}[f"kernel-devel-{RHEL_NEXT}"] == ("gpu3.example.com",)
    rc, _, err = cli("mirror", "pull", "-s", host_site, "-i", SAMPLE / "hosts.yml", "-o", out_dir,
                     "--kernel", RHEL_NEXT, "-q")
    assert rc == 2 and "the inventory's GPU nodes run 2 OSes" in err and not out_dir.exists()
