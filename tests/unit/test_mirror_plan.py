"""`gpu-install mirror plan`: the artifact plan comes from the same resolved Plan as `images`/`render` (never a second
list), the chart from mirror.chartRepository, the OS package roots from the roles' own variables; --why; the JSON
schema; exit codes; no network."""

from __future__ import annotations

import json
import shutil
import socket
import textwrap

import pytest
import yaml

from installer import content
from installer.config import parse_site
from installer.errors import ConfigError
from installer.facts import Node
from installer.mirror import plan as mirror_plan
from installer.mirror.plan import SCHEMA, os_map, os_map_file
from installer.patterns import DEFAULT_CHART_REPOSITORY
from installer.platforms import ANSIBLE_OS, ROLE_OS
from tests.conftest import ROOT, plan_of

RUNFILE = "https://files.lab/nvidia/NVIDIA-Linux-x86_64-535.216.03.run"
SHA = "a" * 64


def site(release="v24.9.2", **over):
    data = {"operator": {"version": release}, "registry": {"host": "registry.lab:5000"}}
    data.update(over)
    return parse_site(data)


def artifacts(s, nodes=(), kernels=(), inventory=None):
    return plan_of(s, list(nodes) if not inventory else None, inventory=inventory).artifacts(kernels)


def packages(ap, os_tag):
    """{name: spec} of one OS's package roots."""
    by_os = {o.os: o for o in ap.packages}
    return {p.name: p.spec for p in by_os[os_tag].packages}


def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network contacted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# ---------------------------------------------------------------- images: the same list as `gpu-install images`

RELEASES = ["v1.11.0", "v22.9.2", "v23.9.2", "v24.9.2", "v25.10.1", "v26.7.0"]
LAYOUTS = [{"host": "registry.lab:5000"},
           {"host": "registry.lab:5000", "layout": "keep-host", "prefix": "mirror/gpu"},
           {"host": "10.0.0.5:443", "prefix": "nv"}]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("layout", range(len(LAYOUTS)), ids=["strip-host", "keep-host+prefix", "ip+prefix"])
def test_images_in_the_plan_are_what_images_lists(cli, write_site, release, layout, monkeypatch):
    no_network(monkeypatch)
    # two node OSes for every release (the site's own driver images where NVIDIA publishes none)
    path = write_site({"operator": {"version": release}, "registry": LAYOUTS[layout],
                       "sandboxWorkloads": {"enabled": layout == 1},
                       "driver": {"customImageOs": ["ubuntu22.04", "rhel8.10", "rhel8"]}})
    nodes = ["--os", "ubuntu22.04", "--os", "rhel8.10"]
    rc, out, err = cli("images", "-s", path, *nodes, "--format", "json")
    assert rc == 0, err
    want = [(d["source"], d["destination"]) for d in json.loads(out)]
    rc, out, err = cli("mirror", "plan", "-s", path, *nodes, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [(i["source"], i["destination"]) for i in doc["images"]] == want
    for img in doc["images"]:  # every image says which component and which settings need it
        assert img["component"] and img["needs"] and all(n["component"] == img["component"] for n in img["needs"])
        assert any(n["setting"].startswith(("operator.version=", "components.", "driver.version", "toolkit.version"))
                   for n in img["needs"])
    # the text form lists the same pairs
    rc, text, _ = cli("mirror", "plan", "-s", path, *nodes)
    assert rc == 0
    assert all(f"{s}  " in text and text.count(d) >= 1 for s, d in want)


def test_image_needs_name_the_settings():
    s = site(components={"dcgm": {"enabled": True}}, sandboxWorkloads={"enabled": True})
    ap = artifacts(s, [Node("a", "ubuntu", "22.04"), Node("b", "rhel", "8.10")])
    by_source = {i.source: i for i in ap.images}
    driver = by_source["nvcr.io/nvidia/driver:550.144.03-rhel8.10"]
    settings = [n.setting for n in driver.needs]
    assert "driver.mode=operator" in settings and "operator.version=v24.9.2 (catalog pin 550.144.03)" in settings
    assert "--os rhel8.10" in settings and "--os ubuntu22.04" not in settings
    dcgm = next(i for i in ap.images if i.component == "dcgm")
    assert "components.dcgm.enabled=true" in [n.setting for n in dcgm.needs]
    sandbox = [i for i in ap.images if any(n.setting == "sandboxWorkloads.enabled=true" for n in i.needs)]
    assert sandbox, "sandbox components are there because of sandboxWorkloads.enabled"


# ---------------------------------------------------------------- the chart


def test_chart_from_the_default_repository():
    ap = artifacts(site(), [Node("a", "ubuntu", "22.04")])
    (chart,) = ap.charts
    assert (chart.name, chart.version, chart.repository) == ("gpu-operator", "v24.9.2", DEFAULT_CHART_REPOSITORY)
    assert chart.ref == "https://helm.ngc.nvidia.com/nvidia/gpu-operator:v24.9.2"
    assert chart.file == "gpu-operator-v24.9.2.tgz" and not chart.oci
    assert [n.setting for n in chart.needs] == ["operator.version=v24.9.2",
                                               f"mirror.chartRepository={DEFAULT_CHART_REPOSITORY} (default)"]


@pytest.mark.parametrize("given, repository, ref, kind", [
    ("https://charts.example.com/nvidia/", "https://charts.example.com/nvidia",
     "https://charts.example.com/nvidia/gpu-operator:v25.10.1", "http"),
    ("http://10.0.0.1:8080", "http://10.0.0.1:8080", "http://10.0.0.1:8080/gpu-operator:v25.10.1", "http"),
    ("oci://Registry.Lab:5000/charts/", "oci://registry.lab:5000/charts",
     "oci://registry.lab:5000/charts/gpu-operator:v25.10.1", "oci"),
    ("oci://localhost:5000", "oci://localhost:5000", "oci://localhost:5000/gpu-operator:v25.10.1", "oci"),
])
def test_chart_from_a_configured_repository(given, repository, ref, kind):
    ap = artifacts(site("v25.10.1", mirror={"chartRepository": given}), [Node("a", "ubuntu", "22.04")])
    (chart,) = ap.charts
    assert (chart.repository, chart.ref, chart.as_dict()["type"]) == (repository, ref, kind)
    assert chart.needs[1].setting == f"mirror.chartRepository={repository}"


@pytest.mark.parametrize("bad", ["helm.ngc.nvidia.com/nvidia", "ftp://x.example.com", "oci://charts", "oci://r.lab/Charts",
                                 "oci://r.lab//x", "https://x.example.com/a b", "https://", "oci://"])
def test_a_bad_chart_repository_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError, match=r"mirror\.chartRepository"):
        site(mirror={"chartRepository": bad})


def test_operator_chart_in_the_site_is_a_note():
    ap = artifacts(site(operator={"version": "v24.9.2", "chart": "/srv/charts/gpu-operator-v24.9.2.tgz"}),
                   [Node("a", "ubuntu", "22.04")])
    assert any("operator.chart is /srv/charts/gpu-operator-v24.9.2.tgz" in n for n in ap.notes)


# ---------------------------------------------------------------- OS packages


@pytest.mark.parametrize("mode", ["precompiled", "preinstalled"])
def test_modes_without_node_packages_need_none(mode):
    """driver.mode operator lists the driver container's packages (tests/unit/test_mirror_plan_operator.py)."""
    ap = artifacts(site(driver={"mode": mode}), [Node("a", "ubuntu", "22.04", "5.15.0-105-generic")])
    assert ap.packages == () and ap.files == ()


def test_host_driver_on_debian12():
    ap = artifacts(site(driver={"mode": "host"}), [Node("a", "debian", "12", "6.1.0-28-amd64")])
    (osp,) = ap.packages
    assert (osp.os, osp.manager) == ("debian12", "apt")
    assert packages(ap, "debian12") == {
        "nvidia-driver": "nvidia-driver=550*", "nvidia-smi": "nvidia-smi=550*",
        "nvidia-kernel-dkms": "nvidia-kernel-dkms=550*", "nvidia-persistenced": "nvidia-persistenced",
        "linux-headers-6.1.0-28-amd64": "linux-headers-6.1.0-28-amd64",
        "dkms": "dkms", "gcc": "gcc", "make": "make"}
    version = {p.name: p.version for p in osp.packages}
    assert version["nvidia-driver"] == "550" and version["nvidia-persistenced"] is None  # v24.9.2's driver branch
    need = {p.name: [n.setting for n in p.needs] for p in osp.packages}
    assert "driver.version unset: the release's driver branch 550 (v24.9.2 pins 550.144.03)" in need["nvidia-driver"]
    assert "--os debian12" in need["nvidia-driver"]


def test_host_driver_on_ubuntu_takes_the_branch_from_driver_version():
    ap = artifacts(site(driver={"mode": "host", "version": "550.144.03"}),
                   [Node("a", "ubuntu", "22.04", "5.15.0-105-generic")])
    got = packages(ap, "ubuntu22.04")
    assert got["nvidia-driver-550-server"] == "nvidia-driver-550-server=550.144.03*"
    assert got["nvidia-utils-550-server"] == "nvidia-utils-550-server=550.144.03*"
    assert got["nvidia-dkms-550-server"] == "nvidia-dkms-550-server=550.144.03*"
    assert "linux-headers-5.15.0-105-generic" in got and "nvidia-persistenced" not in got  # Ubuntu's map has none


@pytest.mark.parametrize("os_id, version", [("rocky", "9.4"), ("rhel", "9.4"), ("rhel", "8.10"), ("centos", "7")])
def test_host_driver_and_toolkit_on_the_rhel_family(os_id, version):
    s = site(driver={"mode": "host"}, toolkit={"mode": "host"})
    ap = artifacts(s, [Node("a", os_id, version, "5.14.0-427.el9.x86_64")])
    tag = f"{os_id}{version}"
    (osp,) = ap.packages
    assert osp.manager == "dnf"
    got = packages(ap, tag)
    assert got["nvidia-driver"] == "nvidia-driver-550*" and got["kmod-nvidia-latest-dkms"] == "kmod-nvidia-latest-dkms-550*"
    assert got["kernel-devel-5.14.0-427.el9.x86_64"] == "kernel-devel-5.14.0-427.el9.x86_64"
    assert got["nvidia-container-toolkit"] == "nvidia-container-toolkit-1.17.4*"  # v24.9.2's toolkit
    assert {"dkms", "gcc", "make"} <= set(got)


def test_toolkit_version_from_the_site_and_per_release():
    ap = artifacts(site(toolkit={"mode": "host", "version": "v1.18.0"}), [Node("a", "ubuntu", "22.04")])
    # NVIDIA's four toolkit packages, each pinned as the role pins them
    assert packages(ap, "ubuntu22.04") == {n: f"{n}=1.18.0*" for n in (
        "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools", "libnvidia-container1")}
    ap = artifacts(site("v23.9.2", toolkit={"mode": "host"}), [Node("a", "ubuntu", "22.04")])
    pkg = next(p for p in ap.packages[0].packages if p.name == "nvidia-container-toolkit")
    assert pkg.version == "1.14.6" and [n.setting for n in pkg.needs][1] == \
        "operator.version=v23.9.2 (catalog toolkit 1.14.6)"


def test_no_toolkit_base_package_before_toolkit_1_11():
    """v1.11.x pins toolkit 1.10.0, which has no nvidia-container-toolkit-base: the role leaves it out, so does the
    plan (roles/nvidia_container_toolkit/vars/main.yml)."""
    ap = artifacts(site("v1.11.0", toolkit={"mode": "host"}), [Node("a", "ubuntu", "20.04")])
    assert packages(ap, "ubuntu20.04") == {n: f"{n}=1.10.0*" for n in (
        "nvidia-container-toolkit", "libnvidia-container-tools", "libnvidia-container1")}


def test_runfile_mode_lists_the_runfile_headers_and_build_tools_not_driver_packages():
    s = site(driver={"mode": "runfile", "runfile": RUNFILE, "runfileSha256": SHA})
    ap = artifacts(s, [Node("a", "ubuntu", "22.04", "5.15.0-105-generic"), Node("b", "rocky", "9.4")],
                   kernels=())
    (f,) = ap.files
    assert (f.source, f.name, f.sha256) == (RUNFILE, "NVIDIA-Linux-x86_64-535.216.03.run", SHA)
    assert packages(ap, "ubuntu22.04") == {"linux-headers-5.15.0-105-generic": "linux-headers-5.15.0-105-generic",
                                           "dkms": "dkms", "gcc": "gcc", "make": "make"}
    assert set(packages(ap, "rocky9.4")) == {"dkms", "gcc", "make", "elfutils-libelf-devel"}
    # rocky9.4's kernel is unknown: its headers cannot be named, and the plan says so
    assert any(n.startswith("rocky9.4: the kernel headers (kernel-devel-<kernel>)") for n in ap.notes)


def test_a_runfile_on_the_controller_is_a_note():
    ap = artifacts(site(driver={"mode": "runfile", "runfile": "/srv/NVIDIA-Linux-x86_64-535.216.03.run"}),
                   [Node("a", "debian", "12", "6.1.0-28-amd64")])
    assert ap.files[0].source == "/srv/NVIDIA-Linux-x86_64-535.216.03.run"
    assert any("is a path on the controller" in n for n in ap.notes)


def test_packages_need_the_nodes_os():
    with pytest.raises(ConfigError, match="driver.mode=host: the roles install OS packages") as exc:
        artifacts(site(driver={"mode": "host"}))
    assert "--os" in (exc.value.hint or "")
    with pytest.raises(ConfigError, match="host a: OS unknown"):
        artifacts(site(toolkit={"mode": "host"}), [Node("a", None, None)])


def write_inventory(tmp_path, gpu_hosts: str, group_vars: str = "") -> str:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n"
                                   + textwrap.indent(textwrap.dedent(gpu_hosts), " " * 8))
    if group_vars:
        (inv / "group_vars" / "gpu_nodes.yml").write_text(textwrap.dedent(group_vars))
    return str(inv)


def test_the_inventorys_role_variables_are_honoured(tmp_path):
    inv = write_inventory(tmp_path, """\
        g1: {gpu_install_os: debian12, gpu_install_kernel: 6.1.0-28-amd64}
        g2: {gpu_install_os: debian12, gpu_install_kernel: 6.1.0-30-amd64, nvidia_driver_require_kernel_headers: false}
        g3: {gpu_install_os: rocky9.5, nvidia_driver_packages: [nvidia-driver, kmod-nvidia-open-dkms]}
        """)
    ap = artifacts(site(driver={"mode": "host"}), inventory=inv,
                   kernels=["debian12=6.1.0-31-amd64", "rocky9.5=5.14.0-503.14.1.el9_5.x86_64"])
    deb = {p.name: p for p in next(o for o in ap.packages if o.os == "debian12").packages}
    assert "linux-headers-6.1.0-28-amd64" in deb and "linux-headers-6.1.0-30-amd64" not in deb
    # --kernel debian12=…: the debian12 nodes that need headers (g2 does not), no other OS
    assert deb["linux-headers-6.1.0-31-amd64"].hosts == ("g1",)
    assert deb["nvidia-driver"].hosts == ("g1", "g2")
    assert "gpu_install_kernel=6.1.0-28-amd64" in [n.setting for n in deb["linux-headers-6.1.0-28-amd64"].needs]
    rocky = packages(ap, "rocky9.5")
    assert rocky["kmod-nvidia-open-dkms"] == "kmod-nvidia-open-dkms-550*" and "kmod-nvidia-latest-dkms" not in rocky
    assert "kernel-devel-6.1.0-31-amd64" not in rocky and "kernel-devel-5.14.0-503.14.1.el9_5.x86_64" in rocky
    with pytest.raises(ConfigError, match=r"--kernel 6.1.0-31-amd64: the inventory's GPU nodes run 2 OSes "
                                          r"\(debian12, rocky9.5\)"):
        artifacts(site(driver={"mode": "host"}), inventory=inv, kernels=["6.1.0-31-amd64"])
    # runfile mode without --dkms: no build tools
    inv2 = write_inventory(tmp_path / "b", "g1: {gpu_install_os: debian12, gpu_install_kernel: 6.1.0-28-amd64}\n",
                           "nvidia_driver_runfile_dkms: false\nnvidia_driver_runfile_packages: [libglvnd-dev]\n")
    ap = artifacts(site(driver={"mode": "runfile", "runfile": RUNFILE, "runfileSha256": SHA}), inventory=inv2)
    assert set(packages(ap, "debian12")) == {"linux-headers-6.1.0-28-amd64", "libglvnd-dev"}


def test_package_names_are_read_from_the_roles_not_a_copy(tmp_path, monkeypatch):
    """Change the role's OS map and its defaults: the plan follows."""
    roles = tmp_path / "roles"
    for role in ("nvidia_driver", "nvidia_container_toolkit"):
        shutil.copytree(content.role_dir(role), roles / role)
    debian = roles / "nvidia_driver" / "vars" / "Debian.yml"
    doc = yaml.safe_load(debian.read_text())
    doc["nvidia_driver_os"]["packages"] = ["nvidia-tesla-{{ nvidia_driver_package_version }}-driver"]
    doc["nvidia_driver_os"]["build_packages"] = ["dkms", "build-essential"]
    debian.write_text(yaml.safe_dump(doc))
    defaults = roles / "nvidia_container_toolkit" / "defaults" / "main.yml"
    defaults.write_text(defaults.read_text().replace("[nvidia-container-toolkit]",
                                                     "[nvidia-container-toolkit, nvidia-container-toolkit-base]"))
    monkeypatch.setattr(content, "role_dir", lambda role: roles / role)
    mirror_plan._yaml.cache_clear()
    try:
        ap = artifacts(site(driver={"mode": "host", "version": "550"}, toolkit={"mode": "host"}),
                       [Node("a", "debian", "12", "6.1.0-28-amd64")])
    finally:
        monkeypatch.undo()
        mirror_plan._yaml.cache_clear()
    got = packages(ap, "debian12")
    assert got["nvidia-tesla-550-driver"] == "nvidia-tesla-550-driver=550*" and "nvidia-driver" not in got
    assert "build-essential" in got and "gcc" not in got
    assert got["nvidia-container-toolkit-base"] == "nvidia-container-toolkit-base=1.17.4*"


@pytest.mark.parametrize("role", ["nvidia_driver", "nvidia_container_toolkit"])
def test_every_supported_os_has_an_os_map_with_what_the_plan_reads(role):
    assert set(ANSIBLE_OS) == set(ROLE_OS)
    for os_id, versions in ROLE_OS.items():
        for version in versions:
            m = os_map(role, os_id, version)
            assert os_map_file(role, os_id, version).parent == ROOT / "roles" / role / "vars"
            assert m["package_manager"] in ("apt", "dnf") and m["pin"] in ("=", "-")
            if role == "nvidia_driver":
                assert m["packages"] and m["headers"] and m["build_packages"] and "extra_packages" in m
                assert "dkms" in m["build_packages"]  # the runfile role's dkms check relies on it


# ---------------------------------------------------------------- --why, formats, exit codes


@pytest.fixture
def host_site(write_site):
    return write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "driver": {"mode": "host"}, "toolkit": {"mode": "host"}})


def test_why_answers(cli, host_site):
    base = ("mirror", "plan", "-s", host_site, "--os", "ubuntu22.04", "--os", "rocky9.4",
            "--kernel", "ubuntu22.04=5.15.0-105-generic")
    rc, out, err = cli(*base, "--why", "nvidia-driver")
    assert rc == 0, err
    assert "package rocky9.4/nvidia-driver" in out and "dnf nvidia-driver-550*" in out
    assert "needed by nvidia_driver:" in out and "driver.mode=host" in out
    rc, out, _ = cli(*base, "--why", "ubuntu22.04/nvidia-container-toolkit")
    assert rc == 0 and out.count("package ") == 1 and "toolkit.mode=host" in out
    rc, out, _ = cli(*base, "--why", "gpu-operator")
    assert rc == 0 and "chart https://helm.ngc.nvidia.com/nvidia/gpu-operator:v24.9.2" in out
    assert "operator.version=v24.9.2" in out
    rc, out, _ = cli(*base, "--why", "registry.lab:5000/nvidia/k8s-device-plugin:v0.17.0")
    assert rc == 0 and "image nvcr.io/nvidia/k8s-device-plugin:v0.17.0" in out and "needed by devicePlugin:" in out
    rc, out, _ = cli(*base, "--why", "linux-headers-5.15.0-105-generic", "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["schema"] == SCHEMA and [a["kind"] for a in doc["artifacts"]] == ["package"]
    assert {"component": "nvidia_driver", "setting": "--kernel 5.15.0-105-generic"} in doc["artifacts"][0]["needs"]
    rc, out, err = cli(*base, "--why", "nvcr.io/nvidia/driver:550.144.03-ubuntu22.04")
    assert rc == 2 and out == "" and "--why nvcr.io/nvidia/driver:550.144.03-ubuntu22.04: not in the mirror plan" in err
    assert "hint:" in err
    rc, _, err = cli(*base, "--why", " ")
    assert rc == 2 and "--why: empty reference" in err


def test_why_the_runfile(cli, write_site):
    path = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "driver": {"mode": "runfile", "runfile": RUNFILE, "runfileSha256": SHA}})
    rc, out, err = cli("mirror", "plan", "-s", path, "--os", "debian12", "--why", "NVIDIA-Linux-x86_64-535.216.03.run")
    assert rc == 0, err
    assert f"file {RUNFILE}" in out and "driver.mode=runfile" in out


def test_json_schema_is_stable(cli, host_site):
    rc, out, err = cli("mirror", "plan", "-s", host_site, "--os", "ubuntu22.04", "--kernel", "5.15.0-105-generic",
                       "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert list(doc) == ["schema", "release", "registry", "images", "charts", "files", "packages", "kernels", "notes"]
    assert doc["kernels"] == [{"host": "--os ubuntu22.04", "os": "ubuntu22.04", "kernel": "5.15.0-105-generic",
                               "next": [], "headers": ["linux-headers-5.15.0-105-generic"]}]
    assert doc["schema"] == "gpu-install.mirror-plan/v1" and doc["release"] == "v24.9.2"
    assert doc["registry"] == "registry.lab:5000"
    assert all(list(i) == ["source", "destination", "component", "needs"] for i in doc["images"])
    assert all(list(n) == ["component", "setting"] for i in doc["images"] for n in i["needs"])
    assert list(doc["charts"][0]) == ["name", "version", "repository", "type", "ref", "file", "needs"]
    assert doc["files"] == []
    (osp,) = doc["packages"]
    assert list(osp) == ["os", "manager", "closure", "hosts", "roots"]
    assert (osp["os"], osp["manager"], osp["closure"], osp["hosts"]) == ("ubuntu22.04", "apt", "resolved at pull", [])
    assert all(list(r) == ["name", "version", "match", "spec", "hosts", "needs"] for r in osp["roots"])
    root = next(r for r in osp["roots"] if r["name"] == "nvidia-driver-550-server")
    assert (root["version"], root["match"], root["spec"]) == ("550", "prefix", "nvidia-driver-550-server=550*")
    # deterministic
    assert cli("mirror", "plan", "-s", host_site, "--os", "ubuntu22.04", "--kernel", "5.15.0-105-generic",
               "--format", "json")[1] == out


def test_text_output_groups_by_kind(cli, host_site, tmp_path):
    out_file = tmp_path / "plan.txt"
    rc, _, err = cli("mirror", "plan", "-s", host_site, "--os", "ubuntu22.04", "--os", "rocky9.4", "-o", out_file)
    assert rc == 0 and f"wrote {out_file}" in err
    text = out_file.read_text()
    assert "\x1b" not in text
    heads = [ln for ln in text.splitlines() if ln.startswith(("Images (", "Chart (", "Files (", "Packages "))]
    assert [h.split(" (")[0] for h in heads] == ["Images", "Chart", "Packages for rocky9.4", "Packages for ubuntu22.04"]
    assert "closure resolved at pull" in heads[-1]
    assert "note: rocky9.4: the kernel headers (kernel-devel-<kernel>)" in text


@pytest.mark.parametrize("args, message", [
    (["--os", "22.04"], "--os: '22.04' is not an OS tag"),
    (["--os", "windows11"], "windows11 is not an OS gpu-install supports"),
    (["--kernel", "5.15.0"], "--kernel needs --os"),
    (["--os", "ubuntu22.04", "--kernel", "bad kernel"], "--kernel: 'bad kernel' is not a kernel release"),
    (["--set", "mirror.chartRepository=ftp://x.example.com"], "mirror.chartRepository"),
    (["--set", "mirror.chartRepo=x"], "mirror.chartRepo: unknown field; did you mean 'chartRepository'?"),
    (["--set", "operator.version=v24.9.9"], "v24.9.9 is not in the catalog"),
    (["--set", "driver.mode=host"], "the roles install OS packages on the nodes"),
])
def test_bad_input_is_exit_2_naming_the_flag_or_field(cli, write_site, monkeypatch, args, message):
    no_network(monkeypatch)
    path = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"}})
    rc, out, err = cli("mirror", "plan", "-s", path, *args)
    assert rc == 2, err
    assert message in err and "hint:" in err and out == ""


def test_inventory_with_os_flag_is_exit_2_and_kernel_is_allowed(cli, write_site, tmp_path):
    inv = write_inventory(tmp_path, "g1: {gpu_install_os: ubuntu22.04}\n")
    path = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"},
                       "driver": {"mode": "host"}})
    rc, _, err = cli("mirror", "plan", "-s", path, "-i", inv, "--os", "ubuntu22.04")
    assert rc == 2 and "--os is for use without an inventory" in err
    rc, out, err = cli("mirror", "plan", "-s", path, "-i", inv, "--kernel", "5.15.0-105-generic", "--format", "json")
    assert rc == 0, err
    roots = {r["name"]: r for r in json.loads(out)["packages"][0]["roots"]}
    assert roots["linux-headers-5.15.0-105-generic"]["hosts"] == ["g1"]


def test_the_plan_contacts_nothing(monkeypatch):
    no_network(monkeypatch)
    s = site(driver={"mode": "runfile", "runfile": RUNFILE, "runfileSha256": SHA}, toolkit={"mode": "host"},
             mirror={"chartRepository": "oci://registry.lab:5000/charts"})
    ap = artifacts(s, [Node("a", "ubuntu", "22.04", "5.15.0-105-generic")])
    assert ap.images and ap.charts and ap.files and ap.packages


def test_inventory_role_variables_of_the_wrong_shape(tmp_path):
    inv = write_inventory(tmp_path, "g1: {gpu_install_os: debian12, nvidia_driver_packages: nvidia-driver}\n")
    with pytest.raises(ConfigError, match=r"host g1: nvidia_driver_packages is 'nvidia-driver', not a list"):
        artifacts(site(driver={"mode": "host"}), inventory=inv)
    # an INI inventory gives booleans as strings: 'false' is false, as in the role's conditionals
    ini = tmp_path / "hosts.ini"
    ini.write_text("[gpu_nodes]\ng1 gpu_install_os=debian12 gpu_install_kernel=6.1.0-28-amd64 "
                   "nvidia_driver_require_kernel_headers=false\n")
    ap = artifacts(site(driver={"mode": "host"}), inventory=str(ini))
    assert not any(n.startswith("linux-headers") for n in packages(ap, "debian12"))


def test_an_enabled_switch_is_named_where_it_is_set():
    def setting(s):
        ap = artifacts(s, [Node("a", "ubuntu", "22.04")])
        mig = next(i for i in ap.images if i.component == "migManager")
        return mig.needs[0].setting

    assert setting(site()) == "migManager.enabled=true (chart default of v24.9.2)"
    assert setting(site(values={"migManager": {"enabled": True}})) == "values.migManager.enabled=true"
    assert setting(site(components={"migManager": {"enabled": True}})) == "components.migManager.enabled=true"


def test_a_kernel_nothing_needs_is_a_note(tmp_path):
    inv = write_inventory(tmp_path, "g1: {gpu_install_os: ubuntu22.04}\n")
    ap = artifacts(site(driver={"mode": "preinstalled"}), kernels=["6.8.0-49-generic"], inventory=inv)
    assert ap.packages == () and any(n.startswith("--kernel 6.8.0-49-generic: no kernel headers") for n in ap.notes)
    ap = artifacts(site(driver={"mode": "host"}), kernels=["6.8.0-49-generic"], inventory=inv)
    assert not any(n.startswith("--kernel") for n in ap.notes)


@pytest.mark.parametrize("mode", ["operator", "precompiled", "host"])
def test_images_with_an_inventory_are_what_images_lists(cli, mode):
    sample = ROOT / "inventories" / "sample"
    sets = ["--set", f"driver.mode={mode}", "--set", "driver.customImageOs=[rhel8.10]"]
    rc, out, err = cli("images", "-s", sample / "site.yaml", "-i", sample / "hosts.yml", *sets, "--format", "json")
    assert rc == 0, err
    want = [(d["source"], d["destination"]) for d in json.loads(out)]
    rc, out, err = cli("mirror", "plan", "-s", sample / "site.yaml", "-i", sample / "hosts.yml", *sets,
                       "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [(i["source"], i["destination"]) for i in doc["images"]] == want
    driver = [i for i in doc["images"] if i["component"] == "driver"]
    assert bool(driver) == (mode != "host")
    if mode == "precompiled":
        ubuntu = next(i for i in driver if i["source"].endswith("-5.15.0-105-generic-ubuntu22.04"))
        assert ubuntu["needs"][-1]["setting"] == \
            "gpu_install_os + gpu_install_kernel of hosts gpu1.example.com, gpu2.example.com"
    if mode == "host":  # the inventory's kernels: headers per OS, hosts named
        by_os = {o["os"]: o for o in doc["packages"]}
        assert by_os["rhel8.10"]["hosts"] == ["gpu3.example.com"]
        assert "kernel-devel-4.18.0-553.el8_10.x86_64" in [r["name"] for r in by_os["rhel8.10"]["roots"]]
