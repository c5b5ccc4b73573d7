"""`gpu-install mirror plan` in driver.mode operator: the OS packages NVIDIA's driver container installs at start, per
node OS and per kernel it runs or boots next (installer/data/driver-container-packages.yaml), in the same per-OS
package sets as host mode (so pull resolves and push publishes them); none with packages.osMirror; the unknown-kernel
note; the precompiled note; only when the chart deploys the driver; the table read bounded and checked."""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap

import pytest
import yaml

from installer.config import parse_site
from installer.errors import ConfigError
from installer.facts import Node
from installer.mirror import plan as mirror_plan
from installer.mirror.plan import CONTAINER_WHY, container_table
from tests.conftest import plan_of

U22, U22_NEXT = "5.15.0-105-generic", "5.15.0-107-generic"
U24, U24_NEXT = "6.8.0-45-generic", "6.8.0-49-generic"
R9, R9_NEXT = "5.14.0-427.13.1.el9_4.x86_64", "5.14.0-503.14.1.el9_5.x86_64"
UBUNTU = ("linux-headers-{k}", "linux-image-{k}", "linux-modules-{k}")  # ../shared/upstream/driver-facts.md
RHEL_KERNEL = ("kernel-headers-{k}", "kernel-devel-{k}", "kernel-{k}")
RHEL_OS = ("elfutils-libelf", "elfutils-libelf-devel")


def site(release="v25.10.1", **over):
    data = {"operator": {"version": release}, "registry": {"host": "registry.lab:5000"}}
    data.update(over)
    return parse_site(data)


def write_inventory(tmp_path, gpu_hosts: str) -> str:
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n"
                                   + textwrap.indent(textwrap.dedent(gpu_hosts), " " * 8))
    return str(inv)


THREE_OSES = f"""\
    u22: {{gpu_install_os: ubuntu22.04, gpu_install_kernel: {U22}}}
    u24: {{gpu_install_os: ubuntu24.04, gpu_install_kernel: {U24}}}
    r9: {{gpu_install_os: rhel9.4, gpu_install_kernel: {R9}}}
    """
NEXT = [f"ubuntu22.04={U22_NEXT}", f"ubuntu24.04={U24_NEXT}", f"rhel9.4={R9_NEXT}"]


def by_os(ap):
    return {o.os: {p.name: p for p in o.packages} for o in ap.packages}


def settings(pkg):
    return [n.setting for n in pkg.needs]


@pytest.fixture
def three(tmp_path):
    """ubuntu22.04 + ubuntu24.04 + rhel9.4 nodes from an inventory, each with its running kernel and one it boots
    next (--kernel OSTAG=KERNEL)."""
    return plan_of(site(), inventory=write_inventory(tmp_path, THREE_OSES)).artifacts(NEXT)


# ---------------------------------------------------------------- what is listed


def test_each_node_os_gets_its_containers_packages_for_every_kernel(three):
    got = by_os(three)
    assert set(got) == {"ubuntu22.04", "ubuntu24.04", "rhel9.4"}
    for os_tag, kernels in (("ubuntu22.04", (U22, U22_NEXT)), ("ubuntu24.04", (U24, U24_NEXT))):
        assert set(got[os_tag]) == {n.format(k=k) for n in UBUNTU for k in kernels}
    assert set(got["rhel9.4"]) == {n.format(k=k) for n in RHEL_KERNEL for k in (R9, R9_NEXT)} | set(RHEL_OS)
    # the same package sets as host mode's: the manager of the OS, the hosts, unpinned roots
    managers = {o.os: (o.manager, o.hosts) for o in three.packages}
    assert managers == {"ubuntu22.04": ("apt", ("u22",)), "ubuntu24.04": ("apt", ("u24",)), "rhel9.4": ("dnf", ("r9",))}
    assert all(p.version is None and p.spec == p.name and p.needs[0].component == "driver"
               for o in got.values() for p in o.values())


def test_needs_say_mode_container_and_kernel(three):
    got = by_os(three)
    running = got["ubuntu24.04"][f"linux-headers-{U24}"]
    assert settings(running)[:2] == ["driver.mode=operator", CONTAINER_WHY]
    assert f"gpu_install_kernel={U24}" in settings(running) and "gpu_install_os=ubuntu24.04" in settings(running)
    assert any(s.startswith("apt-get install: the kernel module is built against them") for s in settings(running))
    nxt = got["ubuntu24.04"][f"linux-image-{U24_NEXT}"]
    assert f"--kernel {U24_NEXT} (the kernel the node boots next)" in settings(nxt)
    assert not any(s.startswith("gpu_install_kernel=") for s in settings(nxt))
    assert any(s.startswith("apt-get download, unpacked") for s in settings(nxt))
    # once per OS, no kernel in its needs
    elf = got["rhel9.4"]["elfutils-libelf-devel"]
    assert elf.hosts == ("r9",) and not any("kernel" in s.split(":")[0] for s in settings(elf)[2:])


def test_node_kernels_are_filled_in_operator_mode(three):
    rows = {(k.host, k.os): (k.kernel, k.next, k.headers) for k in three.node_kernels}
    assert rows == {
        ("u22", "ubuntu22.04"): (U22, (U22_NEXT,), (f"linux-headers-{U22}", f"linux-headers-{U22_NEXT}")),
        ("u24", "ubuntu24.04"): (U24, (U24_NEXT,), (f"linux-headers-{U24}", f"linux-headers-{U24_NEXT}")),
        ("r9", "rhel9.4"): (R9, (R9_NEXT,), (f"kernel-devel-{R9}", f"kernel-devel-{R9_NEXT}"))}
    assert not any(n.startswith("--kernel") for n in three.notes)  # every --kernel was listed for


def test_without_an_inventory_the_needs_name_the_flags():
    ap = plan_of(site(), [Node("os0-k0", "ubuntu", "22.04", U22)]).artifacts()
    pkg = by_os(ap)["ubuntu22.04"][f"linux-modules-{U22}"]
    assert f"--kernel {U22}" in settings(pkg) and "--os ubuntu22.04" in settings(pkg) and pkg.hosts == ()


def test_mirror_plan_json_text_and_why_show_them(cli, write_site, tmp_path):
    path = write_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"}})
    inv = write_inventory(tmp_path, THREE_OSES)
    rc, out, err = cli("mirror", "plan", "-s", path, "-i", inv, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    roots = {o["os"]: {r["name"]: r for r in o["roots"]} for o in doc["packages"]}
    header = roots["ubuntu22.04"][f"linux-headers-{U22}"]
    assert header["spec"] == f"linux-headers-{U22}" and header["hosts"] == ["u22"]
    assert {"component": "driver", "setting": CONTAINER_WHY} in header["needs"]
    assert {k["host"]: k["headers"] for k in doc["kernels"]} == {
        "u22": [f"linux-headers-{U22}"], "u24": [f"linux-headers-{U24}"], "r9": [f"kernel-devel-{R9}"]}
    rc, text, _ = cli("mirror", "plan", "-s", path, "-i", inv)
    assert rc == 0 and "Packages for rhel9.4 (dnf, 5 roots" in text and "Packages: none" not in text
    assert f"kernel-devel-{R9}" in text and "driver: driver.mode=operator; " + CONTAINER_WHY in text
    rc, why, _ = cli("mirror", "plan", "-s", path, "-i", inv, "--why", f"linux-headers-{U24}")
    assert rc == 0, why
    assert why.splitlines()[:3] == [f"package ubuntu24.04/linux-headers-{U24}", f"  apt linux-headers-{U24} on u24",
                                    "  needed by driver:"]
    assert f"    gpu_install_kernel={U24}" in why.splitlines()


def test_mirror_pull_needs_the_upstream_repositories_of_those_oses(cli, write_site, tmp_path):
    """pull resolves the container's packages as host mode's: against mirror.packageRepositories.<os>, named (exit 2,
    nothing written) when missing."""
    path = write_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "127.0.0.1:9"}})
    out = tmp_path / "bundle"
    rc, _, err = cli("mirror", "pull", "-s", path, "--os", "ubuntu24.04", "--kernel", U24, "-o", out)
    assert rc == 2, err
    assert "mirror.packageRepositories.ubuntu24.04: not set" in err and f"linux-headers-{U24}" in err, err
    assert not out.exists()


# ---------------------------------------------------------------- packages.osMirror


def test_os_mirror_lists_no_container_packages_and_says_so(tmp_path):
    s = site(packages={"osMirror": ["http://mirror.lab/ubuntu", "http://mirror.lab/rhel/9/BaseOS/x86_64/os"]})
    ap = plan_of(s, inventory=write_inventory(tmp_path, THREE_OSES)).artifacts(NEXT)
    assert ap.packages == ()
    for os_tag in ("ubuntu22.04", "ubuntu24.04", "rhel9.4"):
        assert any(n.startswith(f"{os_tag}: packages.osMirror is set: the driver container will use the site's OS "
                                "mirror for ") for n in ap.notes), ap.notes
    # which node needs which kernel's headers from that mirror is still said
    assert {k.host for k in ap.node_kernels} == {"u22", "u24", "r9"}
    assert not any(n.startswith("--kernel") for n in ap.notes)


def test_os_mirror_outside_operator_mode_is_a_note():
    ap = plan_of(site(driver={"mode": "precompiled"}, packages={"osMirror": ["http://mirror.lab/ubuntu"]}),
                 [Node("a", "ubuntu", "22.04", U22)]).artifacts()
    assert any(n.startswith("packages.osMirror is read only by the operator's driver container") for n in ap.notes)


# ---------------------------------------------------------------- an unknown kernel


def test_an_unknown_kernel_is_a_note_naming_the_ways_to_give_it(tmp_path):
    inv = write_inventory(tmp_path, "u: {gpu_install_os: ubuntu24.04}\nr: {gpu_install_os: rhel9.4}\n")
    ap = plan_of(site(), inventory=inv).artifacts()
    got = by_os(ap)
    assert "ubuntu24.04" not in got  # nothing of Ubuntu's list is per OS
    assert set(got["rhel9.4"]) == set(RHEL_OS)  # what does not depend on the kernel is still listed
    note = next(n for n in ap.notes if n.startswith("ubuntu24.04: the driver container installs"))
    assert "linux-headers-<kernel>" in note and "that kernel is not known" in note
    for way in ("gpu_install_kernel", "--kernel", "--facts FILE", "gpu-install nodes facts"):
        assert way in note, note
    assert ap.node_kernels == ()


# ---------------------------------------------------------------- precompiled would fit


def precompiled_notes(ap):
    return [n for n in ap.notes if n.startswith("driver.mode precompiled would remove the need")]


def test_precompiled_note_where_nvidia_builds_images_for_every_kernel(tmp_path, three):
    notes = precompiled_notes(three)
    assert len(notes) == 2, three.notes  # ubuntu22.04 and ubuntu24.04, not rhel9.4
    assert notes[0].startswith("driver.mode precompiled would remove the need for the driver container's OS packages "
                               f"on hosts u22 (ubuntu22.04, kernels {U22}, {U22_NEXT}): NVIDIA builds precompiled "
                               "driver images of branch 580 for ubuntu22.04 x86-64 kernels of the 5.15/6.8 lines")
    assert "hosts u24 (ubuntu24.04" in notes[1] and "driver:580-<kernel>-ubuntu24.04" in notes[1]


@pytest.mark.parametrize("kernels, arch, release, fits", [
    ((U24,), None, "v25.10.1", True),
    ((U24,), "x86_64", "v25.10.1", True),
    (("6.8.0-1015-aws",), None, "v25.10.1", True),
    (("6.8.0-1012-azure-fde",), None, "v25.10.1", True),
    (("6.8.0-45-lowlatency",), None, "v25.10.1", False),  # a flavour NVIDIA builds none for
    (("5.15.0-105-generic",), None, "v25.10.1", False),  # the 5.15 line: not for 24.04
    ((U24, "6.8.0-45-lowlatency"), None, "v25.10.1", False),  # every kernel of the node must fit
    ((U24,), "aarch64", "v25.10.1", False),
    ((U24,), None, "v24.9.2", False),  # branch 550: not built any more
])
def test_precompiled_fits_only_every_kernel_of_an_x86_node_on_a_built_branch(kernels, arch, release, fits):
    if release == "v24.9.2":
        s = site(release, driver={"customImageOs": ["ubuntu24.04"]})  # v24.9 publishes no 24.04 images
    else:
        s = site(release)
    node = Node("a", "ubuntu", "24.04", kernels[0], next_kernels=kernels[1:], arch=arch)
    ap = plan_of(s, [node]).artifacts()
    assert bool(precompiled_notes(ap)) == fits, ap.notes


# ---------------------------------------------------------------- only when the operator deploys the driver


@pytest.mark.parametrize("over", [{"driver": {"mode": "precompiled"}}, {"driver": {"mode": "preinstalled"}},
                                  {"values": {"driver": {"enabled": False}}}],
                         ids=["precompiled", "preinstalled", "driver-not-deployed"])
def test_no_container_packages_unless_the_operator_deploys_its_driver(over):
    ap = plan_of(site(**over), [Node("a", "ubuntu", "22.04", U22)]).artifacts()
    assert ap.packages == () and ap.node_kernels == () and not precompiled_notes(ap)


def test_host_and_runfile_modes_list_the_roles_packages_not_the_containers():
    ap = plan_of(site(driver={"mode": "host"}), [Node("a", "ubuntu", "22.04", U22)]).artifacts()
    names = set(by_os(ap)["ubuntu22.04"])
    assert f"linux-headers-{U22}" in names and f"linux-image-{U22}" not in names
    assert not any(CONTAINER_WHY in settings(p) for o in ap.packages for p in o.packages)


def test_site_built_images(tmp_path):
    """driver.customImageOs: a rocky node (v25.10 publishes no rocky images) gets the rhel family's list, said to be
    taken from NVIDIA's image; an OS NVIDIA builds no driver container for (debian) is a note, nothing listed."""
    s = site(driver={"customImageOs": ["rocky9.4", "debian12"]})
    ap = plan_of(s, [Node("r", "rocky", "9.4", R9), Node("d", "debian", "12", "6.1.0-28-amd64")]).artifacts()
    got = by_os(ap)
    assert set(got) == {"rocky9.4"}
    assert "driver.customImageOs lists rocky9.4: the site's own driver image, taken to install what NVIDIA's rhel " \
           "driver image does" in settings(got["rocky9.4"][f"kernel-{R9}"])
    assert any(n.startswith("debian12: the driver image is the site's own (driver.customImageOs), and which OS "
                            "packages it installs at start is not known") for n in ap.notes)


def test_a_digest_pinned_driver_without_nodes_is_a_note():
    s = site(components={"driver": {"version": "sha256:" + "a" * 64}})
    ap = plan_of(s, []).artifacts()
    assert ap.packages == ()
    assert any(n.startswith("driver.mode operator: the driver container installs the node kernels' OS packages at "
                            "start, and no nodes are given") for n in ap.notes)


# ---------------------------------------------------------------- the table


def test_the_shipped_table_has_nvidias_names():
    table = container_table()
    ubuntu = table.families["ubuntu"]
    assert (ubuntu.ids, ubuntu.manager) == (["ubuntu"], "apt")
    assert [p.name for p in ubuntu.packages] == [n.format(k="{kernel}") for n in UBUNTU]
    rhel = table.families["rhel"]
    assert (rhel.ids, rhel.manager) == (["rhel", "rocky"], "dnf")
    assert [p.name for p in rhel.packages] == [*RHEL_OS, *(n.format(k="{kernel}") for n in RHEL_KERNEL)]
    assert all(f.source.startswith("NVIDIA/gpu-driver-container@") for f in table.families.values())


@pytest.fixture
def table_copy(tmp_path, monkeypatch):
    """A copy of the shipped table that the plan reads instead (the cache cleared around the test)."""
    path = tmp_path / "driver-container-packages.yaml"
    shutil.copy(mirror_plan.CONTAINER_TABLE, path)
    monkeypatch.setattr(mirror_plan, "CONTAINER_TABLE", path)
    mirror_plan._container_table.cache_clear()
    yield path
    mirror_plan._container_table.cache_clear()


def test_a_changed_table_is_one_edit(table_copy):
    doc = yaml.safe_load(table_copy.read_text())
    doc["families"]["ubuntu"]["packages"].append({"name": "linux-tools-{kernel}", "how": "apt-get install: perf"})
    table_copy.write_text(yaml.safe_dump(doc))
    ap = plan_of(site(), [Node("a", "ubuntu", "22.04", U22)]).artifacts()
    assert f"linux-tools-{U22}" in by_os(ap)["ubuntu22.04"]


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["families"]["ubuntu"]["packages"][0].pop("headers"), "exactly one package per kernel"),
    (lambda d: d["families"]["rhel"]["ids"].append("ubuntu"), "(top): families: ubuntu is in both rhel and ubuntu"),
    (lambda d: d["families"]["ubuntu"]["packages"][1].update(name="linux-image-{kernel}; rm -rf /"),
     "families.ubuntu.packages.1.name: String should match pattern"),
    (lambda d: d["families"]["ubuntu"].update(manager="zypper"), "families.ubuntu.manager"),
    (lambda d: d["families"]["ubuntu"].update(extra=1), "families.ubuntu.extra: Extra inputs are not permitted"),
    (lambda d: d["families"]["ubuntu"]["packages"].append(dict(d["families"]["ubuntu"]["packages"][1])),
     "linux-image-{kernel} listed twice"),
    (lambda d: d.update(schema="gpu-install.driver-container-packages/v2"), "schema: Input should be"),
])
def test_a_broken_table_is_refused_naming_the_entry(table_copy, edit, message):
    doc = yaml.safe_load(table_copy.read_text())
    edit(doc)
    table_copy.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="driver-container-packages.yaml: ") as exc:
        plan_of(site(), [Node("a", "ubuntu", "22.04", U22)]).artifacts()
    assert message in str(exc.value), str(exc.value)
    assert "ships with gpu-install" in (exc.value.hint or "")


def test_the_table_is_read_bounded_and_strictly(table_copy):
    text = table_copy.read_text()
    table_copy.write_text(text + "#" * mirror_plan.CONTAINER_TABLE_LIMIT)
    with pytest.raises(ConfigError, match=r"driver container package table .* bytes; more than 65536 is not a driver container package table"):
        container_table(table_copy)
    mirror_plan._container_table.cache_clear()
    table_copy.write_text(text.replace("schema: gpu-install.driver-container-packages/v1",
                                       "schema: gpu-install.driver-container-packages/v1\n"
                                       "schema: gpu-install.driver-container-packages/v1"))
    with pytest.raises(ConfigError, match="key 'schema' is given twice"):
        container_table(table_copy)
    mirror_plan._container_table.cache_clear()
    table_copy.write_text(text.replace("    notes: []\n  rhel:", "    notes: &n []\n  rhel:", 1)
                          .replace("  centos:", "  x: *n\n  centos:", 1))
    with pytest.raises(ConfigError, match="a YAML alias"):
        container_table(table_copy)


def test_a_release_without_precompiled_drivers_gets_no_precompiled_note(table_copy):
    """v22.9.2 has no driver.usePrecompiled: even with its branch (525) in the table, no note."""
    doc = yaml.safe_load(table_copy.read_text())
    doc["precompiled"]["branches"].append("525")
    table_copy.write_text(yaml.safe_dump(doc))
    ap = plan_of(site("v22.9.2"), [Node("a", "ubuntu", "22.04", U22)]).artifacts()
    assert ap.packages and not precompiled_notes(ap), ap.notes


def test_kernels_read_from_a_facts_file_say_so():
    plan = plan_of(site(), [Node("gpu1", "ubuntu", "24.04", U24, next_kernels=(U24_NEXT,))])
    plan = dataclasses.replace(plan, options=dataclasses.replace(plan.options, facts="facts.json"))
    got = by_os(plan.artifacts())["ubuntu24.04"]
    assert f"kernel {U24} of gpu1, running (--facts facts.json)" in settings(got[f"linux-headers-{U24}"])
    assert f"kernel {U24_NEXT} of gpu1, boots next (--facts facts.json)" in settings(got[f"linux-headers-{U24_NEXT}"])


def test_a_node_of_unknown_os_is_a_note_when_only_the_container_needs_it():
    s = site(components={"driver": {"version": "sha256:" + "a" * 64}})  # the image tag needs no OS then
    ap = plan_of(s, [Node("a", None, None), Node("b", "ubuntu", "22.04", U22)]).artifacts()
    assert set(by_os(ap)) == {"ubuntu22.04"}
    assert any(n.startswith("host a: OS unknown (gpu_install_os is not set): the OS packages its driver container "
                            "installs at start cannot be listed") for n in ap.notes), ap.notes
